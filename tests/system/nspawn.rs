//! A booted Debian 12 container for tests/system/systemd_nspawn.rs: systemd 252 as its PID 1, booted
//! with `systemd-nspawn --boot --register=no --keep-unit` over the root `.ci/nspawn-root`
//! caches, with a throwaway overlay (`--volatile=overlay`) so the cache is never written.
//! Commands run inside through `nsenter -t <PID 1> -a -r -w`. Dropping the [`Container`]
//! powers it off and removes the cgroups nspawn made, even when the test failed.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The stamp `.ci/nspawn-root` leaves in a finished root.
pub const ROOT_STAMP: &str = ".acpd-root-v1";

/// Where `.ci/nspawn-root` caches the root.
pub fn root_dir() -> PathBuf {
    std::env::var_os("ACPD_NSPAWN_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/acpd-ci/debian12"))
}

/// Why the container cannot be had here, or `None` when it can (then boot it).
pub fn unavailable() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (systemd-nspawn)".into());
    }
    for tool in ["systemd-nspawn", "nsenter"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!(
                "{tool} not found (Debian: apt-get install systemd-container util-linux)"
            ));
        }
    }
    let root = root_dir();
    if !root.join(ROOT_STAMP).exists() {
        return Some(format!(
            "no container root at {} (build it with `.ci/nspawn-root`, which needs debootstrap \
             and the network; .ci/run does)",
            root.display()
        ));
    }
    None
}

/// The container's cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// What nspawn picks to match the host (here: hybrid, cgroup2 at /sys/fs/cgroup/unified).
    Host,
    /// cgroup2 alone at /sys/fs/cgroup, as a Debian 12 host boots by default.
    Cgroup2Only,
}

impl Layout {
    pub fn tag(self) -> &'static str {
        match self {
            Layout::Host => "host",
            Layout::Cgroup2Only => "cgroup2",
        }
    }
}

/// True when the host itself has cgroup2 alone at /sys/fs/cgroup (then both layouts are one).
pub fn host_is_cgroup2_only() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| {
            l.split(' ').nth(4) == Some("/sys/fs/cgroup")
                && l.split_once(" - ")
                    .is_some_and(|(_, r)| r.starts_with("cgroup2 "))
        })
    })
}

/// What a command inside printed, and how it exited.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    fn from(o: Output) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// The output of a command that must succeed.
    pub fn ok(self, what: &str) -> String {
        assert_eq!(
            self.code, 0,
            "{what} failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self.stdout
    }
}

pub struct Container {
    nspawn: Option<Child>,
    /// The container's systemd, as a host pid.
    pub pid1: i32,
    /// The cgroups (one per hierarchy) the container lives under, made by this test.
    cgroups: Vec<PathBuf>,
    log: PathBuf,
    /// Printed before each [`Container::note`], so two containers' lines can be told apart.
    tag: String,
}

/// How long one command inside may take (coreutils `timeout` inside enforces it).
const COMMAND_LIMIT: Duration = Duration::from_secs(90);

impl Container {
    /// Boots the root with `binds` (host path, container path; read-only), and waits until
    /// systemd reports the boot finished. `Err` says why it did not boot.
    pub fn boot(
        name: &str,
        layout: Layout,
        binds: &[(&Path, &str)],
        log: &Path,
    ) -> Result<Container, String> {
        let cgroups = own_cgroups(name)?;
        // nspawn with --keep-unit puts the container under its own cgroup: a shell moves
        // itself into groups of ours first and execs nspawn, so what it leaves is ours to
        // remove and nobody else's groups are touched.
        let mut enter = String::new();
        for (i, _) in cgroups.iter().enumerate() {
            enter.push_str(&format!(
                "echo $$ > \"${}\"/cgroup.procs || exit 99; ",
                i + 1
            ));
        }
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "{enter}shift {}; exec systemd-nspawn \"$@\"",
                cgroups.len()
            ))
            .arg("sh")
            .args(&cgroups)
            .args([
                "--boot",
                "--register=no",
                "--keep-unit",
                "--volatile=overlay",
            ])
            .arg(format!("--machine={name}"))
            .arg("--console=read-only")
            .arg("-D")
            .arg(root_dir());
        for (host, inside) in binds {
            cmd.arg(format!("--bind-ro={}:{inside}", host.display()));
        }
        if layout == Layout::Cgroup2Only {
            cmd.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1");
        }
        let file = std::fs::File::create(log).map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file);
        let nspawn = cmd
            .spawn()
            .map_err(|e| format!("cannot run systemd-nspawn: {e}"))?;
        let mut c = Container {
            pid1: 0,
            nspawn: Some(nspawn),
            cgroups,
            log: log.to_path_buf(),
            tag: layout.tag().to_string(),
        };
        let nspawn_pid = c.nspawn.as_ref().map_or(0, |n| n.id() as i32);
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.pid1 == 0 {
            if let Some(status) = c.nspawn.as_mut().and_then(|n| n.try_wait().ok().flatten()) {
                return Err(format!(
                    "systemd-nspawn exited ({status}): {}",
                    c.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("no container PID 1 after 30 s: {}", c.log_text()));
            }
            c.pid1 = children_of(nspawn_pid)
                .into_iter()
                .find(|p| comm(*p).as_deref() == Some("systemd"))
                .unwrap_or(0);
            std::thread::sleep(Duration::from_millis(20));
        }
        // Until systemd's private socket exists, systemctl cannot ask (and says so at once).
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut booted = c.sh("systemctl is-system-running --wait");
        while booted.stdout.trim().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            booted = c.sh("systemctl is-system-running --wait");
        }
        if !matches!(booted.stdout.trim(), "running" | "degraded") {
            return Err(format!(
                "the container did not finish booting ({} {}): {}\n{}",
                booted.stdout.trim(),
                booted.stderr.trim(),
                c.sh("systemctl --failed --no-pager").stdout,
                c.log_text()
            ));
        }
        Ok(c)
    }

    /// A line on stderr (durations, notes), tagged with the layout.
    pub fn note(&self, line: &str) {
        eprintln!("[{}] {line}", self.tag);
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `nsenter` into every namespace of the container, with a clean environment.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.pid1.to_string())
            .args(["-a", "-r", "-w", "--", "/usr/bin/env", "-i"])
            .args([
                "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
                "HOME=/root",
                "SYSTEMD_PAGER=",
                "SYSTEMD_COLORS=0",
            ])
            .args(argv);
        cmd
    }

    /// A shell script as root inside, bounded by [`COMMAND_LIMIT`].
    pub fn sh(&self, script: &str) -> Out {
        let limit = COMMAND_LIMIT.as_secs().to_string();
        let out = self
            .command(&["timeout", "-k", "5", &limit, "sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter");
        Out::from(out)
    }

    /// A shell script inside as `user` (with that user's groups), with `XDG_RUNTIME_DIR` set so
    /// `systemctl --user` finds the user's manager.
    pub fn sh_as(&self, user: &str, script: &str) -> Out {
        let quoted = script.replace('\'', r"'\''");
        self.sh(&format!(
            "runuser -u {user} -- sh -c 'export XDG_RUNTIME_DIR=/run/user/$(id -u) \
             HOME=$(getent passwd {user} | cut -d: -f6); {quoted}'"
        ))
    }

    /// Writes a file inside (as root), through `cat`'s stdin.
    pub fn write(&self, path: &str, text: &str) {
        let mut child = self
            .command(&["sh", "-c", &format!("cat > {path}")])
            .stdin(Stdio::piped())
            .spawn()
            .expect("run nsenter");
        let written = child.stdin.take().map(|mut i| i.write_all(text.as_bytes()));
        assert!(
            matches!(written, Some(Ok(()))) && child.wait().is_ok_and(|s| s.success()),
            "cannot write {path} inside"
        );
    }

    /// The host pid of a process the container's pid namespace calls `pid`.
    pub fn host_pid(&self, pid: i32) -> Option<i32> {
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid1)).ok()?;
        std::fs::read_dir("/proc")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .find(|p| {
                std::fs::read_link(format!("/proc/{p}/ns/pid"))
                    .ok()
                    .as_ref()
                    == Some(&ns)
                    && nspid(*p).last() == Some(&pid)
            })
    }

    /// True while `pid` (a container pid) exists inside, zombies included.
    pub fn alive(&self, pid: i32) -> bool {
        self.sh(&format!("test -e /proc/{pid}")).code == 0
    }

    /// Polls a shell condition inside until it succeeds or `timeout` passes.
    pub fn until(&self, timeout: Duration, script: &str) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.sh(script).code == 0 {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Powers off: SIGTERM to nspawn asks the container's systemd for an orderly shutdown;
    /// SIGKILL of its PID 1 (which ends the whole pid namespace) if that takes too long.
    fn power_off(&mut self) {
        let Some(mut nspawn) = self.nspawn.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(nspawn.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while nspawn.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                if self.pid1 > 0 {
                    let pid1 = nix::unistd::Pid::from_raw(self.pid1);
                    let _ = nix::sys::signal::kill(pid1, nix::sys::signal::Signal::SIGKILL);
                }
                let _ = nspawn.kill();
                let _ = nspawn.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.power_off();
        // The groups nspawn and the container's systemd made below ours, deepest first.
        for top in &self.cgroups {
            let mut dirs = Vec::new();
            collect_dirs(top, &mut dirs);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in dirs {
                let _ = std::fs::remove_dir(&d);
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// A fresh cgroup named `name` next to this process's own, in the name=systemd hierarchy
/// (which nspawn reads on a hybrid host) and in cgroup v2; only the ones that exist here.
fn own_cgroups(name: &str) -> Result<Vec<PathBuf>, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let mut made = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (fstype, option) = match (id, controllers) {
            ("0", "") => ("cgroup2", None),
            (_, "name=systemd") => ("cgroup", Some("name=systemd")),
            _ => continue,
        };
        let Some(mount) = mounts.lines().find_map(|m| {
            let (left, right) = m.split_once(" - ")?;
            let mut r = right.split(' ');
            let (t, _src, opts) = (r.next()?, r.next()?, r.next()?);
            let matches = t == fstype && option.is_none_or(|o| opts.split(',').any(|x| x == o));
            matches.then(|| left.split(' ').nth(4).map(PathBuf::from))?
        }) else {
            continue;
        };
        let dir = mount.join(path.trim_start_matches('/')).join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        made.push(dir);
    }
    Ok(made)
}

fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| ppid(*p) == Some(parent))
        .collect()
}

fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn ppid(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

fn comm(pid: i32) -> Option<String> {
    Some(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()?
            .trim()
            .to_string(),
    )
}

/// `NSpid:` of /proc/PID/status: the pid in each nested pid namespace, outermost first.
fn nspid(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("NSpid:")).map(|r| {
                r.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// An ACP client on the stdio of a command inside (`acpd connect` as some user).
pub struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    next_id: u64,
    /// Every notification and request seen, in order.
    pub seen: Vec<Value>,
}

/// How long an answer may take.
const ANSWER: Duration = Duration::from_secs(30);

impl Client {
    pub fn spawn(mut cmd: Command) -> Client {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the client command");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        Client {
            child,
            stdin,
            lines,
            next_id: 0,
            seen: Vec::new(),
        }
    }

    /// Sends a request; returns its id.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("write to the client command");
        stdin.flush().expect("flush");
        self.next_id
    }

    /// Reads until the answer to `id`; `Err` is a JSON-RPC error.
    pub fn answer(&mut self, id: u64) -> Result<Value, Value> {
        let deadline = Instant::now() + ANSWER;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to request {id}; seen {:?}", self.seen));
            if v["id"] == id && v.get("method").is_none() {
                return match v.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(v["result"].clone()),
                };
            }
            self.seen.push(v);
        }
    }

    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.answer(id)
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    pub fn initialize(&mut self) {
        self.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
    }

    pub fn new_session(&mut self, cwd: &str, provider: &str) -> String {
        let r = self.call(
            "session/new",
            json!({"cwd": cwd, "mcpServers": [], "_meta": {"acpd": {"provider": provider}}}),
        );
        r["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// Sends a prompt and returns its request id (the answer comes when the turn ends).
    pub fn prompt(&mut self, session: &str, text: &str) -> u64 {
        self.send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
    }

    /// Reads until a message chunk contains `needle`; returns all chunk text so far.
    pub fn until_text(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + ANSWER;
        loop {
            let text = self.text();
            if text.contains(needle) {
                return text;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => self.seen.push(v),
                Err(_) => panic!("no chunk with {needle:?}; text so far {text:?}"),
            }
        }
    }

    /// The `agent_message_chunk` text seen so far.
    pub fn text(&self) -> String {
        self.seen
            .iter()
            .filter(|v| v["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|v| v["params"]["update"]["content"]["text"].as_str())
            .collect()
    }

    /// Closes stdin and waits for the command to exit (bounded).
    pub fn close(mut self) -> Option<std::process::ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + ANSWER;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
