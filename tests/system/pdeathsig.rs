//! acpd SIGKILLed mid-run: its child dies with it (PDEATHSIG). PID 1 on these machines reaps
//! nothing, so this test process makes itself a subreaper and reaps what it adopts before it
//! counts survivors. The subreaper flag is process-wide: every module of this binary shares it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

#[test]
fn child_dies_with_a_sigkilled_acpd() {
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let env = Env::new("");
    let mut acpd = env
        .acpd()
        .args([
            "run",
            "--provider",
            "fast",
            ":pid\n:ignore-eof\n:ignore-term\n:hang-deaf",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(acpd.stdout.take().unwrap()).lines();
    let pid = pid_after(&lines.next().unwrap().unwrap(), "pid ");
    assert!(exists(pid));
    kill(Pid::from_raw(acpd.id() as i32), Signal::SIGKILL).unwrap();
    acpd.wait().unwrap();
    let gone = eventually(Duration::from_secs(5), || {
        // Adopted as a zombie by this subreaper: reap it, then it is gone.
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        !exists(pid)
    });
    assert!(gone, "child {pid} outlived the SIGKILLed acpd");
}
