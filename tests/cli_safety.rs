//! The command line against sockets and daemons it cannot trust to behave: `acpd status`,
//! `runs`, `reload` and `connect` end with a clear error and exit 1 (within `--timeout`) on a
//! silent socket, a socket that answers garbage, a full backlog and a stopped daemon; and what
//! `acpd runs` prints of text a parent or child controls is escaped, and limited to the
//! caller's own runs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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

/// A real `acpd serve`, stopped and resumed by the test.
struct Daemon {
    env: Env,
    socket: PathBuf,
    child: Child,
}

impl Daemon {
    fn start(env: Env) -> Daemon {
        let socket = env.path().join("run/acpd.sock");
        let child = env
            .acpd()
            .args(["serve", "--socket"])
            .arg(&socket)
            .env("ACPD_LOG", "info")
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(env.path().join("daemon.log")).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon { env, socket, child };
        assert!(
            eventually(Duration::from_secs(10), || UnixStream::connect(&d.socket)
                .is_ok()),
            "daemon did not listen"
        );
        d
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn cli(&self, args: &[&str]) -> Output {
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

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(self.pid(), Signal::SIGCONT);
        let _ = kill(self.pid(), Signal::SIGTERM);
        if !eventually(Duration::from_secs(20), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

#[test]
fn a_stopped_daemon_is_named_with_what_to_do() {
    let d = Daemon::start(Env::new(""));
    kill(d.pid(), Signal::SIGSTOP).unwrap();
    let resume = format!("kill -CONT {}", d.pid());
    for args in [&["status"][..], &["runs"], &["reload"], &["connect"]] {
        let out = d.cli(args);
        let err = text(&out.stderr);
        assert_eq!(code(&out), 1, "{args:?}: {err}");
        assert!(
            err.contains("did not answer within 1s") && err.contains(&resume),
            "{args:?}: {err}"
        );
    }
    kill(d.pid(), Signal::SIGCONT).unwrap();
    let out = d.cli(&["status"]);
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
