//! Shared helpers for the end-to-end tests: the real `acpd` binary, temporary configs, and
//! process checks through /proc.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod client;
pub mod daemon;
pub mod raw;
pub mod remote;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_acpd");

/// A temporary directory with a config file in it.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl Env {
    /// A config with fast graces, so tests that tear down uncooperative children stay quick.
    pub fn new(extra: &str) -> Env {
        Env::raw(&format!(
            "{extra}\n[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
        ))
    }

    pub fn raw(toml: &str) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config.toml");
        std::fs::write(&config, toml).expect("write config");
        Env { dir, config }
    }

    /// `acpd --config <file>` with a clean environment: no inherited config or depth.
    pub fn acpd(&self) -> Command {
        let mut cmd = base();
        cmd.arg("--config").arg(&self.config);
        cmd.current_dir(self.dir.path());
        cmd.env("STATE_DIRECTORY", self.dir.path().join("state"));
        cmd
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The binary with acpd's own variables cleared and the user's config out of reach.
pub fn base() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("ACPD_CONFIG")
        .env_remove("ACPD_DEPTH")
        .env_remove("ACPD_MAX_DEPTH")
        .env("XDG_CONFIG_HOME", "/nonexistent-acpd-test-config")
        // Child records go to a scratch directory, not the user's state directory.
        .env(
            "STATE_DIRECTORY",
            std::env::temp_dir().join("acpd-test-state"),
        )
        .env("ACPD_LOG", "warn")
        // Tests read plain text, whatever colour the caller's environment forces.
        .env_remove("CLICOLOR_FORCE");
    cmd
}

/// `git -C dir ARGS` as a test user (no global config needed); its stdout, whole. Fails the
/// test, with git's stderr, when git fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `acpd run --json` and parses its one JSON object.
pub fn run_json(cmd: &mut Command) -> (serde_json::Value, i32, String) {
    let out = cmd.output().expect("run acpd");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("stdout is not one JSON object ({e}): {stdout:?}\nstderr: {stderr}")
    });
    (value, out.status.code().unwrap_or(-1), stderr)
}

pub fn output_text(result: &serde_json::Value) -> String {
    result["output"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<String>()
        })
        .unwrap_or_default()
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// The pid following `label ` in the output text (`pid 123`, `grandchild 456`).
pub fn pid_after(text: &str, label: &str) -> i32 {
    text.lines()
        .find_map(|l| l.strip_prefix(label).and_then(|r| r.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no `{label}` line in {text:?}"))
}

/// True while the process exists in any state, zombies included: a zombie is a survivor.
pub fn exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Polls `cond` until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `acpd serve` on the socket `<dir>/run/acpd.sock`, logging to `<dir>/serve.log`, started from
/// `cmd` (acpd with its config and environment); killed and reaped on drop.
pub struct Served(pub std::process::Child, pub PathBuf);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Served {
    pub fn start(mut cmd: Command, dir: &Path) -> Served {
        let socket = dir.join("run/acpd.sock");
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let child = cmd
            .args(["serve", "--socket"])
            .arg(&socket)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        assert!(
            eventually(Duration::from_secs(20), || socket.exists()),
            "acpd serve did not listen on {}",
            socket.display()
        );
        Served(child, socket)
    }
}

/// The Landlock ABI the kernel enforces; 0 when none.
pub fn landlock_abi() -> i64 {
    // SAFETY: the documented version query (no attribute, size 0, the version flag).
    unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    }
}
