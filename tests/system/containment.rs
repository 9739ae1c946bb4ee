//! Containment: a child whose grandchild leaves the process group (`setsid` + double fork,
//! reparented to acpd as subreaper) is gone after dispose, after `session/close`, after
//! `acpd run` ends, and after acpd is SIGKILLed with no successor (the sentinel) — with cgroups
//! and with `containment = "process-group"`. Also: a starting acpd removes a dead acpd's
//! leftover cgroup and kills what was in it. Liveness is checked in /proc (a zombie counts as
//! alive until reaped; this test process is a subreaper and reaps what it adopts).
//!
//! The cgroup half needs a writable cgroup v2 hierarchy (root, or a delegated subtree); without
//! one it says so and checks only the fallback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::raw::{Raw, gone_within, subreaper};
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

const GONE: Duration = Duration::from_secs(10);

/// The provider's command: leaves a `sleep` that called `setsid` and was double-forked (so its
/// parent is acpd), records its pid in `$PIDDIR/<child pid>`, waits until it has, then becomes
/// the echo agent
/// (with a session store, so it takes `session/close`).
const ESCAPING: &str = r#"#!/bin/sh
setsid sh -c 'sleep 1000 & echo $! > "$1.tmp" && mv "$1.tmp" "$1"' sh "$PIDDIR/$$" </dev/null >/dev/null 2>&1 &
while [ ! -e "$PIDDIR/$$" ]; do sleep 0.01; done
exec "$ACPD" agent echo --sessions "$PIDDIR/../sessions"
"#;

struct Case {
    env: Env,
    pids: PathBuf,
}

fn case(containment: &str) -> Case {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("escape.sh");
    std::fs::write(&script, ESCAPING).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pids = dir.path().join("pids");
    std::fs::create_dir(&pids).unwrap();
    let toml = format!(
        "containment = \"{containment}\"\ndefault_provider = \"esc\"\n\
         [providers.esc]\ncommand = [\"{}\"]\n\
         env = {{ PIDDIR = \"{}\", ACPD = \"{BIN}\" }}\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
         keep_alive = \"10m\"\n",
        script.display(),
        pids.display()
    );
    let env = Env::raw(&toml);
    // Keep the script's directory alive as long as the env.
    std::mem::forget(dir);
    Case { env, pids }
}

impl Case {
    /// The escapees recorded so far, waiting until one is running (a probe of the provider,
    /// torn down already, may have left a record of its own, dead one).
    fn escapees(&self) -> Vec<i32> {
        let mut found = Vec::new();
        let running = eventually(GONE, || {
            found = self.recorded();
            found.iter().any(|&pid| exists(pid))
        });
        assert!(running, "the provider's escapee never ran: {found:?}");
        for &pid in found.iter().filter(|&&pid| exists(pid)) {
            assert_ne!(
                sid(pid),
                sid(std::process::id() as i32),
                "escapee {pid} did not leave the session"
            );
        }
        found
    }

    /// Every escapee pid written so far.
    fn recorded(&self) -> Vec<i32> {
        std::fs::read_dir(&self.pids)
            .unwrap()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().ends_with(".tmp"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| t.trim().parse().ok())
            .collect()
    }

    fn assert_gone(&self, escapees: &[i32], after: &str) {
        for &pid in escapees {
            assert!(
                gone_within(pid, GONE),
                "escapee {pid} outlived {after} ({}): {}",
                self.mode(),
                std::fs::read_to_string(self.env.path().join("acpd.log")).unwrap_or_default()
            );
        }
    }

    fn mode(&self) -> String {
        std::fs::read_to_string(&self.env.config)
            .unwrap()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

fn sid(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    after
        .split_whitespace()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1)
}

/// Whether acpd can create cgroups here; prints why not.
fn cgroups_work() -> bool {
    match acpd::testing::own_dir() {
        Ok(dir) => {
            let probe = dir.join(format!("acpd-test-probe-{}", std::process::id()));
            match std::fs::create_dir(&probe) {
                Ok(()) => {
                    let kill = probe.join("cgroup.kill").exists();
                    let _ = std::fs::remove_dir(&probe);
                    if !kill {
                        println!("skipping the cgroup half: no cgroup.kill (Linux < 5.14)");
                    }
                    kill
                }
                Err(e) => {
                    println!(
                        "skipping the cgroup half: cannot create {}: {e}",
                        probe.display()
                    );
                    false
                }
            }
        }
        Err(e) => {
            println!("skipping the cgroup half: {e}");
            false
        }
    }
}

fn modes() -> Vec<&'static str> {
    if cgroups_work() {
        vec!["cgroup", "process-group"]
    } else {
        vec!["process-group"]
    }
}

fn stdio(case: &Case) -> Raw {
    let mut raw = Raw::stdio(&case.env);
    raw.initialize(json!({}));
    raw
}

fn status_mode(raw: &mut Raw) -> String {
    let status = raw.ok("_acpd/status", json!({}));
    status["containment"]["mode"]
        .as_str()
        .unwrap_or_else(|| panic!("no containment in {status}"))
        .to_owned()
}

#[test]
fn escapee_is_gone_after_dispose() {
    subreaper();
    for mode in modes() {
        let case = case(mode);
        let mut raw = stdio(&case);
        assert_eq!(status_mode(&mut raw), mode);
        let run = raw.start_run("esc", "hello");
        raw.wait_run(&run);
        let escapees = case.escapees();
        raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
        case.assert_gone(&escapees, "dispose");
    }
}

#[test]
fn escapee_is_gone_after_session_close() {
    subreaper();
    for mode in modes() {
        let case = case(mode);
        let mut raw = stdio(&case);
        let session = raw.new_session(case.env.path(), "esc");
        let escapees = case.escapees();
        raw.ok("session/close", json!({"sessionId": session}));
        case.assert_gone(&escapees, "session/close");
    }
}

#[test]
fn escapee_is_gone_after_acpd_run_ends() {
    subreaper();
    for mode in modes() {
        let case = case(mode);
        let out = case.env.acpd().args(["run", "hello"]).output().unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        // acpd has exited: whatever escapee its child left must be gone already or soon.
        let escapees = case.recorded();
        assert!(!escapees.is_empty(), "the provider's escapee never started");
        case.assert_gone(&escapees, "acpd run");
    }
}

#[test]
fn escapee_is_gone_after_acpd_is_sigkilled_with_no_successor() {
    subreaper();
    for mode in modes() {
        let case = case(mode);
        let mut raw = stdio(&case);
        let run = raw.start_run("esc", "hello");
        raw.wait_run(&run);
        let escapees = case.escapees();
        let acpd = raw.pid();
        kill(Pid::from_raw(acpd as i32), Signal::SIGKILL).unwrap();
        // No acpd starts again: only the sentinel can end the escapee.
        case.assert_gone(&escapees, "a SIGKILLed acpd");
        drop(raw);
        if mode == "cgroup" {
            let base = acpd_base_groups(acpd);
            assert!(
                eventually(GONE, || acpd_base_groups(acpd).is_empty()),
                "the dead acpd's cgroups are left: {base:?}"
            );
        }
    }
}

/// This process's own cgroup directory holds the acpds' base groups (they start from here).
fn acpd_base_groups(pid: u32) -> Vec<PathBuf> {
    let own = acpd::testing::own_dir().unwrap();
    std::fs::read_dir(&own)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("acpd-{pid}-")))
        })
        .collect()
}

#[test]
fn a_starting_acpd_sweeps_a_dead_acpds_cgroups() {
    subreaper();
    if !cgroups_work() {
        return;
    }
    // A dead acpd: a pid that exited, with a start time no live process has.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let own = acpd::testing::own_dir().unwrap();
    let base = own.join(format!("acpd-{dead}-1"));
    let child = base.join("child-1");
    std::fs::create_dir_all(&child).unwrap();
    // What it left: a sleeper inside its child group.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("1000")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::fs::write(child.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    let case = case("cgroup");
    let out = case.env.acpd().args(["run", "hello"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        eventually(GONE, || sleeper.try_wait().unwrap().is_some()),
        "the dead acpd's sleeper survived the sweep"
    );
    assert!(
        !Path::new(&base).exists(),
        "{} was not removed",
        base.display()
    );
}

/// Where acpd may not create groups (here: run as `nobody`, who cannot write the hierarchy),
/// `containment = "cgroup"` refuses to start and says why; `auto` falls back and still works.
#[test]
fn cgroup_mode_fails_start_where_impossible_and_auto_falls_back() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("skipping: needs root to run acpd as another user");
        return;
    }
    let nobody = 65534;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let run = |containment: &str| {
        let config = dir.path().join(format!("{containment}.toml"));
        std::fs::write(&config, format!("containment = \"{containment}\"\n")).unwrap();
        let mut cmd = base();
        cmd.arg("--config")
            .arg(&config)
            .args(["run", "--json", "hello"])
            .current_dir(dir.path())
            .env("STATE_DIRECTORY", dir.path().join("state"))
            .env("HOME", dir.path());
        std::os::unix::process::CommandExt::uid(&mut cmd, nobody);
        std::os::unix::process::CommandExt::gid(&mut cmd, nobody);
        cmd.output().unwrap()
    };
    let own = acpd::testing::own_dir().unwrap();
    let writable_by_nobody = nix::unistd::access(&own, nix::unistd::AccessFlags::W_OK).is_ok()
        && std::fs::metadata(&own).is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == nobody);
    if writable_by_nobody {
        println!("skipping: nobody may write {}", own.display());
        return;
    }
    let refused = run("cgroup");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(code(&refused), 1, "{stderr}");
    assert!(
        stderr.contains("containment = \"cgroup\"") && stderr.contains("cannot use cgroups"),
        "{stderr}"
    );
    let fallback = run("auto");
    assert_eq!(
        code(&fallback),
        0,
        "{}",
        String::from_utf8_lossy(&fallback.stderr)
    );
}
