//! The command line against sockets and daemons it cannot trust to behave: `acpd status`,
//! `runs`, `reload` and `connect` end with a clear error and exit 1 (within `--timeout`) on a
//! silent socket, a socket that answers garbage, a full backlog and a stopped daemon; and what
//! `acpd runs` prints of text a parent or child controls is escaped, and limited to the
//! caller's own runs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::*;
use nix::sys::signal::{Signal, kill};

/// Far above any `--timeout` a test passes: a command still running then hangs (the bug).
const HANG: Duration = Duration::from_secs(60);

/// Runs `cmd` to its end, or kills it and fails the test when it is still running at `HANG`.
fn finish(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + HANG;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} hung; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `acpd ARGS --socket SOCKET --timeout 1`.
fn cli(socket: &Path, args: &[&str]) -> Output {
    finish(
        base()
            .args(args)
            .arg("--socket")
            .arg(socket)
            .args(["--timeout", "1"]),
    )
}

/// A socket that accepts every connection and then does `with` to it (the connections stay
/// open until the test ends).
fn listener(dir: &Path, with: fn(&mut UnixStream)) -> PathBuf {
    let path = dir.join("fake.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in l.incoming().flatten() {
            with(&mut stream);
            held.push(stream);
        }
    });
    path
}

const QUERIES: [&[&str]; 3] = [&["status"], &["runs"], &["reload"]];

#[test]
fn a_silent_socket_times_out_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = listener(dir.path(), |_| {});
    for args in QUERIES {
        let out = cli(&socket, args);
        let err = text(&out.stderr);
        assert_eq!(code(&out), 1, "{args:?}: {err}");
        assert!(
            err.contains("did not answer within 1s")
                && err.contains(&socket.display().to_string())
                && err.contains("no answer to initialize"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_socket_that_answers_garbage_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let socket = listener(dir.path(), |s| {
        // Whatever the client says, an HTTP server's answer.
        let mut line = String::new();
        let _ = BufReader::new(&*s).read_line(&mut line);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    for args in QUERIES {
        let out = cli(&socket, args);
        let err = text(&out.stderr);
        assert_eq!(code(&out), 1, "{args:?}: {err}");
        assert!(
            err.contains("is not an acpd daemon") && err.contains("not JSON-RPC"),
            "{args:?}: {err}"
        );
    }
}

/// Binds PATH, listens with no backlog and never accepts, fills the backlog from inside, says
/// `ready` and holds everything until its stdin closes.
const FULL_BACKLOG: &str = r#"
import socket, sys
path = sys.argv[1]
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind(path)
l.listen(0)
queued = []
while len(queued) < 1000:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.setblocking(False)
    try:
        c.connect(path)
    except (BlockingIOError, InterruptedError):
        break
    queued.append(c)
print("ready", flush=True)
sys.stdin.read()
"#;

/// A listener whose backlog is full (it never accepts): connecting would wait for room.
#[test]
fn connect_gives_up_on_a_daemon_that_never_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.sock");
    let mut holder = Command::new("python3")
        .args(["-c", FULL_BACKLOG])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    let out = finish(
        base()
            .args(["connect", "--timeout", "1", "--socket"])
            .arg(&path),
    );
    drop(holder.stdin.take());
    let _ = holder.wait();
    let err = text(&out.stderr);
    assert_eq!(code(&out), 1, "{err}");
    assert!(
        err.contains("did not answer within 1s") && err.contains("not accepting connections"),
        "{err}"
    );
}

/// A real `acpd serve` (the shared fixture), stopped and resumed by the test; its CLI calls
/// here give up after `--timeout 1` and are bounded by `HANG`.
trait Impatient {
    fn cli_impatient(&self, args: &[&str]) -> Output;
}

impl Impatient for Daemon {
    fn cli_impatient(&self, args: &[&str]) -> Output {
        finish(
            self.env
                .acpd()
                .args(args)
                .arg("--socket")
                .arg(&self.socket)
                .args(["--timeout", "1"]),
        )
    }
}

#[test]
fn a_stopped_daemon_is_named_with_what_to_do() {
    let d = Daemon::start(Env::new(""));
    kill(d.pid(), Signal::SIGSTOP).unwrap();
    let resume = format!("kill -CONT {}", d.pid());
    for args in [&["status"][..], &["runs"], &["reload"], &["connect"]] {
        let out = d.cli_impatient(args);
        let err = text(&out.stderr);
        assert_eq!(code(&out), 1, "{args:?}: {err}");
        assert!(
            err.contains("did not answer within 1s") && err.contains(&resume),
            "{args:?}: {err}"
        );
    }
    kill(d.pid(), Signal::SIGCONT).unwrap();
    let out = d.cli_impatient(&["status"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
}

#[test]
fn no_daemon_is_refused_at_once_and_bad_timeouts_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(&dir.path().join("none.sock"), &["status"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out.stderr).contains("no acpd daemon at"));
    for bad in ["0", "soon", "99999999999999999999"] {
        let out = finish(base().args(["status", "--timeout", bad]));
        assert_eq!(code(&out), 2, "{bad}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("--timeout"), "{bad}");
    }
}

/// Connects to SOCKET, starts a run of provider `fast` labelled LABEL (JSON-decoded), prints
/// its answer and holds the connection (its runs live) until stdin closes.
const STARTER: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rwb")
def call(i, method, params):
    f.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode())
    f.flush()
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == i:
            return msg
call(1, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
started = call(2, "_acpd/subagent/start", {"provider": "fast", "cwd": "/tmp",
    "label": json.loads(sys.argv[2]), "prompt": [{"type": "text", "text": "hi"}]})
print(json.dumps(started), flush=True)
sys.stdin.read()
"#;

/// A connection holding one run labelled `label`, as whoever `cmd` runs as.
struct Starter(Child);

impl Starter {
    fn start(mut cmd: Command, socket: &Path, label: &str) -> (Starter, serde_json::Value) {
        let mut child = cmd
            .args(["-c", STARTER])
            .arg(socket)
            .arg(serde_json::to_string(label).unwrap())
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let answer: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the starter said {line:?} ({e})"));
        assert!(answer["result"]["runId"].is_string(), "{answer}");
        (Starter(child), answer["result"].clone())
    }
}

impl Drop for Starter {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A label a parent chose to clear the operator's screen is printed escaped by `acpd runs`.
#[test]
fn runs_prints_a_hostile_label_escaped() {
    let d = Daemon::start(Env::new(""));
    let (_run, _) = Starter::start(
        Command::new("python3"),
        &d.socket,
        "evil\x1b[2J\r\x07\u{202e}x",
    );
    let out = d.cli_impatient(&["runs"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    // The label's column, its wrapped lines joined.
    let header = shown.lines().next().unwrap();
    let (from, to) = (header.find("LABEL").unwrap(), header.find("STATE").unwrap());
    let label: String = shown
        .lines()
        .skip(1)
        .filter_map(|l| l.get(from..to.min(l.len())))
        .map(str::trim)
        .collect();
    assert_eq!(label, r"evil\u{1b}[2J\r\u{7}\u{202e}x", "{shown}");
    assert!(
        !shown.chars().any(|c| c.is_control() && c != '\n'),
        "a raw control character reached the terminal: {shown:?}"
    );
}

/// A user created for one test (as root), removed with its group when dropped.
struct TempUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TempUser {
    fn create() -> Option<TempUser> {
        if !nix::unistd::Uid::effective().is_root() {
            return None;
        }
        let name = format!("acpdt{}", std::process::id());
        let made = Command::new("useradd")
            .args([
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(&name)
            .status()
            .ok()?;
        if !made.success() {
            return None;
        }
        let user = nix::unistd::User::from_name(&name).ok()??;
        Some(TempUser {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        })
    }

    fn command(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(program);
        // std drops root's supplementary groups when it sets the uid.
        cmd.uid(self.uid).gid(self.gid);
        cmd
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// `acpd runs` from a member of `allow_group` lists that user's runs only; acpd's own user
/// sees every run. Needs root (to create the second user); skipped otherwise.
#[test]
fn runs_lists_only_the_callers_own_runs() {
    let Some(user) = TempUser::create() else {
        eprintln!("skipped: needs root and useradd to create a second user");
        return;
    };
    let d = Daemon::start(Env::new(&format!("allow_group = \"{}\"", user.name)));
    {
        use std::os::unix::fs::PermissionsExt;
        // Let the second user reach the socket: the test's directories are root's and 0700.
        for p in [d.env.path(), &d.env.path().join("run")] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let (_mine, mine) = Starter::start(Command::new("python3"), &d.socket, "owner's secret task");
    let (_theirs, theirs) = Starter::start(user.command("python3"), &d.socket, "their task");
    let runs_as = |cmd: &mut Command| {
        let out = finish(
            cmd.args(["runs", "--json", "--timeout", "10", "--socket"])
                .arg(&d.socket)
                .current_dir("/")
                .env("ACPD_LOG", "warn"),
        );
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut ids: Vec<String> = v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let as_user = runs_as(&mut user.command(BIN));
    assert_eq!(as_user, [theirs["runId"].as_str().unwrap()]);
    let mut all = vec![
        mine["runId"].as_str().unwrap().to_string(),
        theirs["runId"].as_str().unwrap().to_string(),
    ];
    all.sort();
    assert_eq!(runs_as(&mut base()), all);
}

/// `acpd providers` prints a provider's description (the config's text, or a preset's)
/// escaped, like every other text it does not control.
#[test]
fn providers_prints_a_description_escaped() {
    let env = Env::raw(&format!(
        "[providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         description = \"d\\u001b]0;T\\u0007\\r\\u009b2J\\u202ex\"\n"
    ));
    let out = finish(env.acpd().arg("providers"));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains(r"d\u{1b}]0;T\u{7}\r\u{9b}2J\u{202e}x"),
        "{shown}"
    );
    assert!(
        !shown
            .chars()
            .any(|c| (c.is_control() && c != '\n' && c != '\t') || c == '\u{202e}'),
        "a raw control character reached the terminal: {shown:?}"
    );
}
