//! `acpd supervise` on its own (no ssh): the relay is byte for byte, the exit status is CMD's,
//! and every way the connection can go — stdin closed, stdout broken, SIGTERM, SIGHUP — ends
//! the whole tree, including a TERM-deaf command and a `setsid` double-fork escapee. Hostile
//! setup lines are refused before anything starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A shell tree: TERM-deaf, with a grandchild in its group and a double-forked `setsid`
/// escapee; prints `esc PID`, `gc PID` and `cmd PID`, then sleeps.
const DEAF_TREE: &str = "trap '' TERM; \
    setsid sh -c 'sleep 600 & echo esc $!' ; \
    sleep 601 & echo gc $!; echo cmd $$; exec sleep 602";

fn supervise(args: &[&str], cmd: &[&str]) -> Command {
    let mut c = base();
    c.arg("supervise").args(args).arg("--").args(cmd);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Starts the deaf tree under supervise and returns it with the tree's pids.
fn deaf_tree() -> (Child, BufReader<std::process::ChildStdout>, Vec<i32>) {
    let mut child = supervise(
        &["--eof-grace", "200ms", "--term-grace", "200ms"],
        &["sh", "-c", DEAF_TREE],
    )
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    for _ in 0..3 {
        out.read_line(&mut text).unwrap();
    }
    let pids = vec![
        child.id() as i32,
        pid_after(&text, "cmd "),
        pid_after(&text, "gc "),
        pid_after(&text, "esc "),
    ];
    assert!(pids.iter().all(|&p| exists(p)));
    (child, out, pids)
}

fn gone(child: &mut Child, pids: &[i32]) -> std::process::ExitStatus {
    let status = child.wait().unwrap();
    let all = eventually(Duration::from_secs(10), || pids.iter().all(|&p| !exists(p)));
    let left: Vec<i32> = pids.iter().copied().filter(|&p| exists(p)).collect();
    // A failing test leaks nothing.
    for &pid in &left {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(all, "left behind (now killed): {left:?}");
    status
}

#[test]
fn relays_bytes_exactly_and_exits_with_the_commands_status() {
    // Supervise's own log lines share stderr (a sweep's warning): none here.
    let mut child = supervise(&[], &["sh", "-c", "cat; printf 'err' >&2; exit 7"])
        .env("ACPD_LOG", "off")
        .spawn()
        .unwrap();
    // Not lines, not UTF-8, no final newline.
    let payload: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = {
        let payload = payload.clone();
        std::thread::spawn(move || stdin.write_all(&payload).unwrap())
    };
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    writer.join().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(7));
    assert!(
        out == payload,
        "relayed {} bytes, sent {}",
        out.len(),
        payload.len()
    );
    assert_eq!(err, "err");
}

#[test]
fn a_signal_ending_the_command_is_128_plus_it() {
    let out = supervise(&[], &["sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 137);
}

#[test]
fn closing_stdin_ends_a_term_deaf_tree_and_its_escapee() {
    let (mut child, _out, pids) = deaf_tree();
    drop(child.stdin.take());
    let status = gone(&mut child, &pids);
    // The deaf command needed SIGKILL.
    assert_eq!(status.code(), Some(137));
}

/// CMD exits by itself, leaving a TERM-deaf `setsid` escapee and a grandchild in its group:
/// supervise exits with CMD's status once the rest of the tree is ended too.
#[test]
fn a_command_that_exits_by_itself_takes_what_it_left_with_it() {
    let mut child = supervise(
        &["--eof-grace", "200ms", "--term-grace", "200ms"],
        &[
            "sh",
            "-c",
            // The command exits only once the setsid'd shell has said who it is (a FIFO,
            // passed as its $0), so the teardown never races those lines.
            "f=$(mktemp -u); mkfifo \"$f\"; \
             setsid sh -c 'trap \"\" TERM; sleep 600 & echo esc $!; echo deaf $$; echo > \"$0\"; wait' \"$f\" & \
             sleep 601 & echo gc $!; read _ < \"$f\"; rm -f \"$f\"; exit 3",
        ],
    )
    .spawn()
    .unwrap();
    // Held open: the command ends by itself, not because stdin closed.
    let _stdin = child.stdin.take();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    for _ in 0..3 {
        out.read_line(&mut text).unwrap();
    }
    let pids = [
        pid_after(&text, "esc "),
        pid_after(&text, "deaf "),
        pid_after(&text, "gc "),
    ];
    let status = gone(&mut child, &pids);
    assert_eq!(status.code(), Some(3));
}

#[test]
fn sigterm_and_sighup_end_the_tree() {
    for sig in [Signal::SIGTERM, Signal::SIGHUP] {
        let (mut child, _out, pids) = deaf_tree();
        kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        gone(&mut child, &pids);
    }
}

#[test]
fn a_broken_stdout_ends_the_tree() {
    let mut child = supervise(
        &["--eof-grace", "200ms", "--term-grace", "200ms"],
        &["sh", "-c", "trap '' TERM; echo cmd $$; exec yes"],
    )
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = pid_after(&line, "cmd ");
    // Nobody reads any more: the next write fails, which is a connection gone.
    drop(out);
    gone(&mut child, &[pid]);
}

#[test]
fn the_setup_line_sets_env_and_cwd_and_nothing_else_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = supervise(
        &["--setup-stdin"],
        &[
            "sh",
            "-c",
            "pwd; echo \"$MODE/$ACPD_DEPTH/${LEAK-unset}\"; cat",
        ],
    )
    .env("LEAK", "from-the-far-side")
    .spawn()
    .unwrap();
    let setup = serde_json::json!({
        "cwd": dir.path(),
        "env": { "MODE": "m", "ACPD_DEPTH": "2" },
        "graces": { "eofMs": 100, "termMs": 100 },
    });
    let mut stdin = child.stdin.take().unwrap();
    // The line and the first bytes of the stream in one write: nothing after the newline is
    // lost to the setup reader.
    stdin
        .write_all(format!("{setup}\nafter-setup").as_bytes())
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let cwd = dir.path().canonicalize().unwrap();
    assert_eq!(text, format!("{}\nm/2/unset\nafter-setup", cwd.display()));
}

#[test]
fn hostile_setup_lines_are_refused_before_anything_starts() {
    let marker = tempfile::tempdir().unwrap();
    let touched = marker.path().join("started");
    let touch = format!("touch {}", touched.display());
    let cases: Vec<Vec<u8>> = vec![
        b"not json\n".to_vec(),
        b"{\"cwd\":\"relative\"}\n".to_vec(),
        b"{\"cwd\":\"/nonexistent-dir\"}\n".to_vec(),
        b"{\"env\":{\"A=B\":\"x\"}}\n".to_vec(),
        b"{\"unknown\":1}\n".to_vec(),
        b"{}".to_vec(), // no newline, then EOF
        // Only an object with named keys: serde would take positional arrays.
        b"[\"/tmp\", {}, null]\n".to_vec(),
        b"{\"graces\": [1, 2]}\n".to_vec(),
        // Graces above the 30-day ceiling.
        b"{\"graces\": {\"eofMs\": 18446744073709551615, \"termMs\": 1}}\n".to_vec(),
        vec![],
        [b"{\"env\":{\"A\":\"".to_vec(), vec![b'x'; 2 << 20]].concat(),
    ];
    for line in cases {
        let mut child = supervise(&["--setup-stdin"], &["sh", "-c", &touch])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // An oversized line is refused before it is all written.
        let _ = stdin.write_all(&line);
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 125, "{err}");
        assert!(err.starts_with("acpd supervise: "), "{err}");
        assert!(!err.contains("xxxx"), "the error echoes its input");
        assert!(!touched.exists(), "the command ran");
    }
}

/// True once `pid` catches `signal` (its handler is installed: /proc/PID/status SigCgt).
fn catches(pid: u32, signal: Signal) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal as i32 - 1)) != 0)
}

/// SIGTERM while `--setup-stdin` still waits for its line (stdin open, nothing written):
/// it exits at once, 143 as a shell reports a death by SIGTERM, saying so, and nothing ran.
/// (Before, the signal was caught and queued while the read went on: it never exited.)
#[test]
fn sigterm_before_the_setup_line_ends_supervise_and_starts_nothing() {
    let marker = tempfile::tempdir().unwrap();
    let touched = marker.path().join("started");
    let touch = format!("touch {}", touched.display());
    let mut child = supervise(&["--setup-stdin"], &["sh", "-c", &touch])
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let pid = child.id();
    assert!(
        eventually(Duration::from_secs(10), || catches(pid, Signal::SIGTERM)),
        "supervise never installed its SIGTERM handler"
    );
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).unwrap();
    let exited = eventually(Duration::from_secs(10), || {
        child.try_wait().is_ok_and(|s| s.is_some())
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    assert!(exited, "supervise still running 10 s after SIGTERM");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 143, "{err}");
    assert!(
        err.contains(
            "acpd supervise: SIGTERM while waiting for the setup line; nothing was started"
        ),
        "{err}"
    );
    assert!(!touched.exists(), "the command ran");
}

#[test]
fn a_sigkilled_supervisors_cgroup_is_swept_by_the_next_one() {
    // Orphans of the killed supervise come here (PID 1 reaps nothing on these machines).
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let (mut child, _out, pids) = deaf_tree();
    let (supervise, cmd) = (pids[0], pids[1]);
    let own = std::fs::read_to_string(format!("/proc/{cmd}/cgroup")).unwrap();
    let Some(group) = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|g| g.contains(&format!("/acpd-{supervise}-")))
        .map(str::to_string)
    else {
        kill(Pid::from_raw(supervise), Signal::SIGTERM).unwrap();
        gone(&mut child, &pids);
        eprintln!("SKIP: acpd supervise cannot create cgroups here (CMD is in {own:?})");
        return;
    };
    let dir = acpd::testing::own_dir()
        .unwrap()
        .join(group.rsplit('/').next().unwrap());
    assert!(dir.is_dir(), "{dir:?}");
    kill(Pid::from_raw(supervise), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    // CMD dies by PDEATHSIG; the escapee and the grandchild live on in the dead one's group.
    let reap = |pid: i32| {
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        !exists(pid)
    };
    assert!(eventually(Duration::from_secs(5), || reap(cmd)));
    // (Another test's supervise, starting in the same parent group, may sweep it first.)
    let next = supervise_output(&[], &["true"]);
    assert_eq!(code(&next), 0);
    let swept = eventually(Duration::from_secs(10), || {
        pids[2..].iter().all(|&p| reap(p))
    });
    for &pid in &pids[2..] {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(
        swept,
        "the next supervise did not sweep the dead one's group"
    );
    assert!(!dir.exists(), "{dir:?} is still there");
}

fn supervise_output(args: &[&str], cmd: &[&str]) -> std::process::Output {
    supervise(args, cmd).stdin(Stdio::null()).output().unwrap()
}
