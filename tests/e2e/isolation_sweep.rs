//! A sandboxed child's private tmp (`<data dir>/acpd/tmp/<id>`) outlives a SIGKILLed acpd
//! only until the next acpd starts, whose sweep removes it by its owner marker; the tmp of
//! an acpd still running beside it is never touched, and a link planted in a tmp is removed,
//! never followed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::common::raw::Raw;
use crate::common::{eventually, exists};
use crate::isolation::Setup;

const GONE: Duration = Duration::from_secs(20);

/// Whether this kernel enforces Landlock, as acpd reports it for the sandboxed provider; the
/// test says why it skips when it does not.
fn landlock(raw: &mut Raw) -> bool {
    let providers = raw.ok("_acpd/providers", json!({}));
    let sandbox = providers["providers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "wt"))
        .map(|p| p["sandbox"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let on = sandbox.starts_with("landlock (ABI ");
    if !on {
        eprintln!("skipped: this kernel does not enforce Landlock (acpd reports {sandbox:?})");
    }
    on
}

fn acpd(s: &Setup, log: &str, level: &str) -> Raw {
    let mut cmd = s.command();
    cmd.arg("stdio").env("ACPD_LOG", level);
    let mut raw = Raw::process(cmd, &s.env.path().join(log));
    raw.initialize(json!({}));
    raw
}

/// The child tmps in `dir` (directories only, not their markers).
fn tmps(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// Starts a run whose turn never ends and returns the tmp it was given (the one new in `dir`).
fn hanging_run(raw: &mut Raw, s: &Setup, dir: &Path) -> PathBuf {
    let before = tmps(dir);
    raw.ok(
        "_acpd/subagent/start",
        json!({"cwd": s.repo, "prompt": [{"type": "text", "text": ":hang"}]}),
    );
    let mut found = None;
    assert!(
        eventually(GONE, || {
            found = tmps(dir).into_iter().find(|t| !before.contains(t));
            found.is_some()
        }),
        "the run got no tmp in {}",
        dir.display()
    );
    found.unwrap()
}

#[test]
fn a_sigkilled_acpd_s_run_tmp_is_swept_and_a_live_acpd_s_never() {
    let s = Setup::new("sandbox = \"landlock\"");
    let dir = s.worktrees().with_file_name("tmp");
    let mut live = acpd(&s, "live.log", "warn");
    if !landlock(&mut live) {
        return;
    }
    let live_tmp = hanging_run(&mut live, &s, &dir);
    let mut killed = acpd(&s, "killed.log", "warn");
    let killed_tmp = hanging_run(&mut killed, &s, &dir);
    // What a hostile child could leave in its tmp: a link out of it, to a file it may not
    // touch, which the sweep must remove without following.
    let outside = s.env.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep.txt"), "keep\n").unwrap();
    std::os::unix::fs::symlink(&outside, killed_tmp.join("link")).unwrap();
    let pid = killed.pid() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(GONE, || !exists(pid) || zombie(pid)));
    assert!(killed_tmp.is_dir(), "nothing removed it yet");

    let _next = acpd(&s, "next.log", "info");
    let log = s.env.path().join("next.log");
    assert!(
        eventually(GONE, || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("startup sweep done"))),
        "the next acpd's sweep never finished"
    );
    assert!(
        !killed_tmp.exists(),
        "the sweep left {}",
        killed_tmp.display()
    );
    let mut marker = killed_tmp.clone().into_os_string();
    marker.push(".owner");
    assert!(!Path::new(&marker).exists());
    assert!(live_tmp.is_dir(), "the sweep took a live acpd's tmp");
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).unwrap(),
        "keep\n",
        "the sweep followed a link out of the tmp"
    );
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}
