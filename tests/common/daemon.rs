//! A real `acpd serve` for a test: `Daemon::start(env)` serves `<env>/run/acpd.sock` with the
//! state directory `<env>/state`, logging at info to `<env>/daemon.log`. It either owns its
//! config directory (`Daemon<Env>`, removed after the daemon stops) or borrows one the test
//! keeps using (`Daemon<&Env>`). A failed test must not leave a daemon behind, nor its
//! children's grandchildren (a SIGKILL would orphan them): dropping it sends SIGCONT (a test
//! may have stopped it) and SIGTERM, and SIGKILL only if it does not exit within 20 s.

use std::borrow::Borrow;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::client::AcpClient;
use super::{Env, eventually};

/// How long a daemon may take to exit after SIGTERM before the test gives up on it.
const STOP: Duration = Duration::from_secs(20);

pub struct Daemon<E: Borrow<Env> = Env> {
    pub env: E,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
}

impl<E: Borrow<Env>> Drop for Daemon<E> {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = kill(pid, Signal::SIGTERM);
            if !eventually(STOP, || child.try_wait().is_ok_and(|s| s.is_some())) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

impl<E: Borrow<Env>> Daemon<E> {
    pub fn start(env: E) -> Daemon<E> {
        Self::start_with(env, |_| {})
    }

    /// As `start`, with `tweak` applied to the command last (environment, pre_exec, …).
    pub fn start_with(env: E, tweak: impl FnOnce(&mut Command)) -> Daemon<E> {
        let dir = env.borrow().path().to_path_buf();
        let socket = dir.join("run/acpd.sock");
        let state = dir.join("state");
        let log = dir.join("daemon.log");
        let mut cmd = env.borrow().acpd();
        cmd.args(["serve", "--socket"])
            .arg(&socket)
            .env("STATE_DIRECTORY", &state)
            .env("ACPD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        tweak(&mut cmd);
        // A socket left at the path (a daemon the test killed) exists before this one binds:
        // then only a connection tells that this one listens.
        let stale = socket.exists();
        let child = Some(cmd.spawn().unwrap());
        let mut d = Daemon {
            env,
            socket,
            state,
            log,
            child,
        };
        // By path where possible, not by connecting: a probe connection would count in
        // `connections`. std's bind listens in the same call that creates the path.
        let listening = eventually(Duration::from_secs(10), || {
            let up = if stale {
                UnixStream::connect(&d.socket).is_ok()
            } else {
                d.socket.exists()
            };
            up || d.child.as_mut().unwrap().try_wait().unwrap().is_some()
        });
        assert!(
            listening && d.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "daemon did not listen: {}",
            d.log()
        );
        d
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    /// Waits for the daemon to exit by itself.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.take().expect("running").wait().unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `acpd <args> --socket <ours>` with the daemon's config.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.env
            .borrow()
            .acpd()
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .unwrap()
    }

    /// `acpd <args> --json --socket <ours>`, which must succeed, parsed.
    pub fn cli_json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.cli(&all);
        assert!(
            out.status.success(),
            "acpd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "acpd {args:?} --json printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// `acpd status --json`.
    pub fn status(&self) -> Value {
        self.cli_json(&["status"])
    }

    /// An ACP client through `acpd connect` to this daemon.
    pub fn client(&self) -> AcpClient {
        AcpClient::spawn_with(
            self.env.borrow(),
            &["connect", "--socket", self.socket.to_str().unwrap()],
        )
    }

    /// SIGTERM; the exit status and how long the exit took (panics past 20 s).
    pub fn terminate(mut self) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("running");
        let started = Instant::now();
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        let exited = eventually(STOP, || child.try_wait().is_ok_and(|s| s.is_some()));
        let took = started.elapsed();
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon ignored SIGTERM for {took:?}: {}", self.log());
        }
        (child.wait().unwrap(), took)
    }
}
