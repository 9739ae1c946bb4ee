//! The teardown ladder end to end: after `acpd run` returns, no process of the child's tree is
//! left — a zombie counts as a survivor — and each rung took about as long as its grace. And
//! what a SIGKILLed acpd leaves on disk: its delegation socket's directory goes at the next
//! start.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::raw::{Raw, gone_within, subreaper};
use common::*;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use serde_json::json;

const GRACE: Duration = Duration::from_millis(300);
/// Generous: catches a missing SIGKILL (which would hang for ever), not a slow machine.
const MARGIN: Duration = Duration::from_secs(5);

/// Runs a script on the `fast` provider (eof and term graces 300 ms) and returns the pids it
/// printed and how long the whole run took.
fn run_tree(script: &str) -> (Vec<i32>, Duration) {
    let env = Env::new("");
    let started = Instant::now();
    let (v, code, stderr) =
        run_json(
            env.acpd()
                .args(["run", "--json", "--provider", "fast", script]),
        );
    let elapsed = started.elapsed();
    assert_eq!(code, 0, "{v} {stderr}");
    let text = output_text(&v);
    let mut pids = vec![pid_after(&text, "pid ")];
    if script.contains(":grandchild") {
        pids.push(pid_after(&text, "grandchild "));
    }
    (pids, elapsed)
}

fn assert_gone(pids: &[i32]) {
    for &pid in pids {
        assert!(!exists(pid), "process {pid} survived teardown");
    }
}

#[test]
fn cooperative_child_exits_on_eof() {
    let (pids, elapsed) = run_tree(":pid");
    assert_gone(&pids);
    assert!(elapsed < GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn eof_deaf_child_is_terminated() {
    let (pids, elapsed) = run_tree(":pid\n:ignore-eof");
    assert_gone(&pids);
    assert!(
        elapsed >= GRACE,
        "SIGTERM came before eof_grace: {elapsed:?}"
    );
    assert!(elapsed < 2 * GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn sigterm_trapping_child_is_killed() {
    let (pids, elapsed) = run_tree(":pid\n:ignore-eof\n:ignore-term");
    assert_gone(&pids);
    assert!(
        elapsed >= 2 * GRACE,
        "SIGKILL came before eof_grace + term_grace: {elapsed:?}"
    );
    assert!(elapsed < 2 * GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn grandchild_holding_the_pipes_goes_with_the_tree() {
    let (pids, elapsed) = run_tree(":pid\n:grandchild\n:ignore-eof\n:ignore-term");
    assert_gone(&pids);
    assert!(elapsed < 2 * GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn cooperative_leader_with_a_term_deaf_grandchild_leaves_nothing() {
    // The leader exits on EOF at once; the grandchild (same group, SIGTERM ignored) outlives it
    // and is orphaned to acpd, which must still kill and reap it.
    let (pids, elapsed) = run_tree(":pid\n:grandchild");
    assert_gone(&pids);
    assert!(
        elapsed >= 2 * GRACE,
        "the orphaned grandchild needed SIGKILL: {elapsed:?}"
    );
}

/// `acpd stdio` driven with raw NDJSON over pipes, its log in a file (to see when it has taken
/// a signal), so a test can signal it mid-turn.
struct Stdio {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<serde_json::Value>,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The read end of acpd's stdout (owned by the reader thread, open while it runs).
    stdout_fd: std::os::fd::RawFd,
    log: std::path::PathBuf,
    _env: Env,
}

impl Stdio {
    fn start(env: Env) -> Stdio {
        Self::start_with(env, SigHandler::SigDfl)
    }

    /// With SIGHUP and SIGINT set to `disposition` (default: as an editor would start it, even
    /// if this test runs under `nohup`).
    fn start_with(env: Env, disposition: SigHandler) -> Stdio {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let log = env.path().join("acpd.log");
        let mut cmd = env.acpd();
        cmd.arg("stdio")
            .env("ACPD_LOG", "info")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        // SAFETY: sigaction is async-signal-safe; nothing is allocated between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let action = SigAction::new(disposition, SaFlags::empty(), SigSet::empty());
                for sig in [Signal::SIGHUP, Signal::SIGINT] {
                    nix::sys::signal::sigaction(sig, &action)?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stdout_fd = std::os::fd::AsRawFd::as_raw_fd(&stdout);
        let (tx, lines) = std::sync::mpsc::channel();
        let paused = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pause = paused.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                // A parent that stops reading: stdout stays open, nobody reads it.
                while pause.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let Ok(line) = line else { return };
                let Ok(v) = serde_json::from_str(&line) else {
                    panic!("acpd wrote a line that is not JSON: {line:?}")
                };
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Stdio {
            child,
            stdin,
            lines,
            paused,
            stdout_fd,
            log,
            _env: env,
        }
    }

    fn send(&mut self, id: u64, method: &str, params: serde_json::Value) {
        use std::io::Write;
        let msg =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message `pick` accepts (others are skipped), within 20 s.
    fn next<T>(&self, mut pick: impl FnMut(&serde_json::Value) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no expected message from acpd ({e}): {}", self.log()));
            if let Some(t) = pick(&v) {
                return t;
            }
        }
    }

    fn answer(&self, id: u64) -> serde_json::Value {
        self.next(|v| (v["id"] == id).then(|| v.clone()))
    }

    /// A bridge session on `provider` whose first turn runs `script`; returns the pids the
    /// child printed for `:pid` and `:grandchild`.
    fn bridge_turn(&mut self, provider: &str, script: &str) -> (i32, i32) {
        self.send(
            1,
            "initialize",
            serde_json::json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        assert!(self.answer(1)["result"].is_object());
        let cwd = self._env.path().to_path_buf();
        self.send(2, "session/new", serde_json::json!({"cwd": cwd, "mcpServers": [], "_meta": {"acpd": {"provider": provider}}}));
        let sid = self.answer(2)["result"]["sessionId"].clone();
        assert!(sid.is_string(), "session/new failed: {}", self.log());
        self.send(
            3,
            "session/prompt",
            serde_json::json!({"sessionId": sid, "prompt": [{"type": "text", "text": script}]}),
        );
        let mut text = String::new();
        while !(text.contains("pid ") && text.contains("grandchild ")) {
            text.push_str(&self.next(|v| {
                v["params"]["update"]["content"]["text"]
                    .as_str()
                    .map(str::to_string)
            }));
        }
        (pid_after(&text, "pid "), pid_after(&text, "grandchild "))
    }

    /// Bytes acpd wrote to its stdout that nobody has read yet (FIONREAD on the pipe).
    fn unread(&self) -> usize {
        let mut n: nix::libc::c_int = 0;
        // SAFETY: FIONREAD writes one int; the fd is the pipe's read end, kept open by the
        // reader thread for as long as this Stdio lives.
        let rc = unsafe { nix::libc::ioctl(self.stdout_fd, nix::libc::FIONREAD, &mut n) };
        if rc == 0 { n as usize } else { 0 }
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// acpd's exit status, within `limit`.
    fn exit_within(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "acpd did not exit within {limit:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A failed test must not leave acpd running, nor orphan its children's grandchildren:
/// SIGTERM first (acpd tears down), SIGKILL only if it does not exit in time.
impl Drop for Stdio {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid(), Signal::SIGTERM);
        if !eventually(Duration::from_secs(20), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn assert_alive(pids: &[i32]) {
    for &pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map(|(_, r)| &r[..1]);
        assert!(
            matches!(state, Some(s) if s != "Z"),
            "process {pid} is not running mid-turn: {stat:?}"
        );
    }
}

/// SIGTERM, SIGINT or SIGHUP to `acpd stdio` mid-turn: the bridge is cancelled and its ladder
/// run (the grandchild ignores SIGTERM, so the ladder must reach SIGKILL), acpd exits 0 within
/// the bound (fast: 0.9 s of graces + 2 s margin), and neither the child nor its grandchild is
/// left: not running, not a zombie, not reparented to PID 1. Before the fix acpd died at once
/// and the grandchild lived on.
#[test]
fn stdio_tears_down_on_sigterm_sigint_and_sighup() {
    use nix::sys::signal::kill;
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        let mut acpd = Stdio::start(Env::new(""));
        let (leader, grandchild) = acpd.bridge_turn("fast", ":pid\n:grandchild\n:hang");
        assert_alive(&[leader, grandchild]);
        let started = Instant::now();
        kill(acpd.pid(), sig).unwrap();
        let status = acpd.exit_within(Duration::from_secs(3) + MARGIN);
        let took = started.elapsed();
        assert_eq!(status.code(), Some(0), "{sig}: {status:?}\n{}", acpd.log());
        for pid in [leader, grandchild] {
            assert!(!exists(pid), "{sig}: process {pid} outlived acpd stdio");
        }
        eprintln!("{sig}: acpd stdio exited after {took:?}");
    }
}

/// A second signal skips the graces (60 s here): every child group is SIGKILLed at once.
#[test]
fn stdio_second_signal_kills_at_once() {
    use nix::sys::signal::kill;
    let slow = format!(
        "[providers.slow]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\ncancel_grace = \"20s\"\neof_grace = \"20s\"\nterm_grace = \"20s\"\n"
    );
    let mut acpd = Stdio::start(Env::raw(&slow));
    let (leader, grandchild) = acpd.bridge_turn(
        "slow",
        ":pid\n:grandchild\n:ignore-eof\n:ignore-term\n:hang-deaf",
    );
    assert_alive(&[leader, grandchild]);
    let started = Instant::now();
    kill(acpd.pid(), Signal::SIGTERM).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || acpd
            .log()
            .contains("shutting down")),
        "the first SIGTERM was not taken: {}",
        acpd.log()
    );
    assert_alive(&[leader, grandchild]);
    kill(acpd.pid(), Signal::SIGINT).unwrap();
    let status = acpd.exit_within(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", acpd.log());
    assert!(started.elapsed() < Duration::from_secs(10));
    for pid in [leader, grandchild] {
        assert!(!exists(pid), "process {pid} outlived the second signal");
    }
}

/// A burst of all three signals at once (coalesced or not) still ends in a clean teardown.
#[test]
fn stdio_signal_burst_leaves_nothing() {
    use nix::sys::signal::kill;
    let mut acpd = Stdio::start(Env::new(""));
    let (leader, grandchild) = acpd.bridge_turn("fast", ":pid\n:grandchild\n:hang");
    for _ in 0..5 {
        for sig in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
            let _ = kill(acpd.pid(), sig);
        }
    }
    let status = acpd.exit_within(Duration::from_secs(3) + MARGIN);
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", acpd.log());
    for pid in [leader, grandchild] {
        assert!(!exists(pid), "process {pid} outlived the signal burst");
    }
}

/// Started with SIGHUP and SIGINT ignored (`nohup`, a background job of a script), acpd stdio
/// keeps them ignored — the session goes on — and SIGTERM still tears everything down.
#[test]
fn stdio_keeps_inherited_ignored_sighup_and_sigint() {
    use nix::sys::signal::kill;
    let mut acpd = Stdio::start_with(Env::new(""), SigHandler::SigIgn);
    let (leader, grandchild) = acpd.bridge_turn("fast", ":pid\n:grandchild\n:hang");
    kill(acpd.pid(), Signal::SIGHUP).unwrap();
    kill(acpd.pid(), Signal::SIGINT).unwrap();
    // Still serving: a request sent after the signals is answered.
    acpd.send(9, "_acpd/subagent/list", serde_json::json!({}));
    assert!(acpd.answer(9)["result"].is_object(), "{}", acpd.log());
    assert!(acpd.child.try_wait().unwrap().is_none());
    assert_alive(&[leader, grandchild]);
    kill(acpd.pid(), Signal::SIGTERM).unwrap();
    let status = acpd.exit_within(Duration::from_secs(3) + MARGIN);
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", acpd.log());
    for pid in [leader, grandchild] {
        assert!(!exists(pid), "process {pid} outlived acpd stdio");
    }
}

/// A parent that stops reading while its child floods it, then SIGTERM: whatever the blocked
/// write does, acpd gives up waiting at the bound, SIGKILLs every group, and exits with
/// nothing left behind (fast graces for both providers: bound 0.9 s + 2 s; then at most 5 s
/// for the reaping).
#[test]
fn stdio_sigterm_with_a_parent_that_stopped_reading() {
    use nix::sys::signal::kill;
    let graces = "cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n";
    let env = Env::raw(&format!(
        "[providers.echo]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n{graces}\
         [providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n{graces}"
    ));
    let mut acpd = Stdio::start(env);
    let (leader, grandchild) =
        acpd.bridge_turn("fast", ":pid\n:grandchild\n:chunks 200000 1000\n:hang");
    acpd.paused
        .store(true, std::sync::atomic::Ordering::Relaxed);
    // The flood fills the pipe to this parent (and every queue behind it).
    assert!(
        eventually(Duration::from_secs(10), || acpd.unread() >= 32_768),
        "the pipe to the parent never filled: {} bytes",
        acpd.unread()
    );
    let started = Instant::now();
    kill(acpd.pid(), Signal::SIGTERM).unwrap();
    let status = acpd.exit_within(Duration::from_secs(3) + Duration::from_secs(5) + MARGIN);
    let took = started.elapsed();
    eprintln!("acpd stdio with a non-reading parent exited after {took:?}");
    assert_eq!(status.code(), Some(0), "{status:?}\n{}", acpd.log());
    for pid in [leader, grandchild] {
        assert!(!exists(pid), "process {pid} outlived acpd stdio");
    }
}

/// Each `acpd-nest-*` directory in `tmp`.
fn nest_dirs(tmp: &Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("acpd-nest-"))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn a_sigkilled_acpd_s_socket_directory_is_removed_at_the_next_start_and_a_live_one_s_kept() {
    subreaper();
    let env = Env::raw("");
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"p\"\n[providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             offer_delegation = true\ncancel_grace = \"300ms\"\neof_grace = \"300ms\"\n\
             term_grace = \"300ms\"\n"
        ),
    )
    .unwrap();
    let tmp = env.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let stdio = |log: &str| {
        let mut cmd = env.acpd();
        cmd.arg("stdio")
            .env("TMPDIR", &tmp)
            .env_remove("XDG_RUNTIME_DIR")
            .env("ACPD_LOG", "info");
        let mut raw = Raw::process(cmd, &env.path().join(log));
        raw.initialize(json!({"subagents": {}}));
        raw
    };
    let delegates = |raw: &mut Raw, text: &str| {
        let sid = raw.new_session(Path::new("/tmp"), "p");
        let id = raw.send_prompt(&sid, &format!(":delegate {text}"));
        raw.answer(&json!(id));
        assert_eq!(raw.chunk_text(&sid), format!("delegated: {text}\n"));
    };
    // An acpd stdio whose child delegated through its socket, then SIGKILLed.
    let mut killed = stdio("killed.log");
    delegates(&mut killed, "before the kill");
    let dead = nest_dirs(&tmp);
    assert_eq!(dead.len(), 1, "{dead:?}");
    let dead = dead[0].clone();
    assert!(dead.join("s").exists() && dead.join("owner").exists());
    let mut live = stdio("live.log");
    assert!(eventually(MARGIN, || nest_dirs(&tmp).len() == 2));
    let live_dir = nest_dirs(&tmp).into_iter().find(|d| *d != dead).unwrap();
    let pid = nix::unistd::Pid::from_raw(killed.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    assert!(
        gone_within(pid.as_raw(), MARGIN),
        "the killed acpd is reaped"
    );
    assert!(dead.is_dir(), "nothing removed it yet");
    // The next acpd's sweep removes the dead one's directory and keeps the live one's.
    let next = stdio("next.log");
    assert!(
        eventually(MARGIN, || next.log().contains("1 removed from")),
        "{}",
        next.log()
    );
    assert!(!dead.exists(), "the dead acpd's directory stayed");
    assert!(live_dir.join("s").exists() && live_dir.join("owner").exists());
    delegates(&mut live, "after the sweep");
}
