//! The sentinel: one small process per acpd that outlives it and tears down whatever acpd
//! leaves running, even when acpd is SIGKILLed, no acpd starts again and no systemd is there.
//!
//! acpd re-executes itself (`acpd sentinel`) with the read end of a pipe as stdin and keeps the
//! write end (close-on-exec, so no child inherits it). Only the kernel closing acpd's last
//! descriptor ends the pipe, so EOF means "acpd is gone" however it went. On the pipe acpd
//! says what to kill then, one line each (short lines, so each write is atomic):
//!
//! - `cgroup PATH` — the base cgroup: one `cgroup.kill` takes every child's group with it;
//! - `tree PREFIX` and `sid SID` — the tree-token prefix and acpd's session (process groups);
//! - `+pg PGID START` / `-pg PGID` — a child's process group as it comes and goes.
//!
//! The sentinel has no PDEATHSIG, its own session (a terminal's SIGHUP or Ctrl-C does not reach
//! it) and ignores SIGTERM, SIGINT and SIGHUP: a `pkill acpd` ends acpd, whose EOF then ends
//! the sentinel after its sweep. It costs one process per acpd, not one per child.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{SigHandler, Signal, signal};
use nix::unistd::Pid;

use super::cgroup::Cgroup;
use super::{contain, record_sweep};

static PIPE: Mutex<Option<std::fs::File>> = Mutex::new(None);
static PID: Mutex<Option<u32>> = Mutex::new(None);

/// Starts this acpd's sentinel (once); logs, never fails, when it cannot.
pub(super) fn start(base: Option<&Path>, token_prefix: &str) {
    let mut pipe = PIPE.lock().unwrap_or_else(|p| p.into_inner());
    if pipe.is_some() {
        return;
    }
    let (read, write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(ends) => ends,
        Err(e) => {
            tracing::warn!(
                "cannot start the sentinel (pipe: {e}); a SIGKILLed acpd may leave processes behind"
            );
            return;
        }
    };
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg("sentinel")
        .env_clear()
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; nothing is allocated between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    match cmd.spawn() {
        Ok(child) => {
            *PID.lock().unwrap_or_else(|p| p.into_inner()) = Some(child.id());
            // The stray reaper reaps it if it ever exits before acpd.
            drop(child);
        }
        Err(e) => {
            tracing::warn!(
                "cannot start the sentinel ({e}); a SIGKILLed acpd may leave processes behind"
            );
            return;
        }
    }
    let mut file = std::fs::File::from(write);
    let sid = nix::unistd::getsid(None).map_or(0, |s| s.as_raw());
    let mut hello = format!("tree {token_prefix}\nsid {sid}\n");
    if let Some(base) = base {
        hello.push_str(&format!("cgroup {}\n", base.display()));
    }
    if let Err(e) = file.write_all(hello.as_bytes()) {
        tracing::warn!("the sentinel is not listening: {e}");
    }
    *pipe = Some(file);
}

/// How long a clean exit waits for the sentinel to finish its (empty) sweep and exit.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// On a clean exit: closes the pipe and waits (briefly) for the sentinel to exit, so that
/// acpd leaves no process behind at all — under systemd, a sentinel still running when the
/// main process is gone would be SIGKILLed by `KillMode=mixed` and logged as a leftover.
pub(super) fn finish() {
    drop(PIPE.lock().unwrap_or_else(|p| p.into_inner()).take());
    let Some(pid) = PID.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return;
    };
    let pid = Pid::from_raw(pid as i32);
    let deadline = std::time::Instant::now() + FINISH_WAIT;
    loop {
        match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {}
            // Exited, or already reaped by the stray reaper (ECHILD).
            _ => return,
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!("the sentinel did not exit within {FINISH_WAIT:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn tell(line: &str) {
    let mut pipe = PIPE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(file) = pipe.as_mut()
        && let Err(e) = file.write_all(line.as_bytes())
    {
        tracing::warn!("the sentinel is gone ({e}); a SIGKILLed acpd may leave processes behind");
        *pipe = None;
    }
}

pub(super) fn add_group(pgid: i32, start: u64) {
    tell(&format!("+pg {pgid} {start}\n"));
}

pub(super) fn remove_group(pgid: i32) {
    tell(&format!("-pg {pgid}\n"));
}

/// What the sentinel has been told.
#[derive(Debug, Default, PartialEq, Eq)]
struct Orders {
    cgroup: Option<PathBuf>,
    tree: Option<String>,
    sid: i32,
    groups: BTreeMap<i32, u64>,
}

impl Orders {
    fn apply(&mut self, line: &str) {
        let mut words = line.splitn(2, ' ');
        let (verb, rest) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        match verb {
            "cgroup" if !rest.is_empty() => self.cgroup = Some(PathBuf::from(rest)),
            "tree" if !rest.is_empty() => self.tree = Some(rest.to_owned()),
            "sid" => self.sid = rest.parse().unwrap_or(0),
            "+pg" => {
                if let Some((pgid, start)) = rest.split_once(' ')
                    && let (Ok(pgid), Ok(start)) = (pgid.parse(), start.parse())
                {
                    self.groups.insert(pgid, start);
                }
            }
            "-pg" => {
                if let Ok(pgid) = rest.parse() {
                    self.groups.remove(&pgid);
                }
            }
            _ => {}
        }
    }
}

/// `acpd sentinel`: reads orders until acpd's end of the pipe closes, then kills what is left
/// and removes acpd's cgroups. Returns the exit code.
pub fn run_sentinel() -> u8 {
    // Named in ps and in systemd's logs (exec'd as /proc/self/exe, it would be "exe").
    let _ = nix::sys::prctl::set_name(c"acpd-sentinel");
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        // SAFETY: SIG_IGN installs no handler code.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    let mut orders = Orders::default();
    let stdin = std::io::stdin().lock();
    for line in stdin.lines() {
        match line {
            Ok(line) => orders.apply(line.trim_end()),
            Err(_) => break,
        }
    }
    sweep(&orders);
    0
}

fn sweep(orders: &Orders) {
    if let Some(path) = &orders.cgroup {
        let base = Cgroup::at(path);
        if base.populated() {
            let _ = base.kill();
            base.wait_empty_blocking(Duration::from_secs(5));
        }
        let _ = base.remove();
    }
    for (&pgid, &start) in &orders.groups {
        record_sweep::kill_members(pgid, start, orders.sid);
    }
    if let Some(prefix) = &orders.tree {
        for pid in contain::prefix_bearers(prefix) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_follow_the_lines() {
        let mut o = Orders::default();
        for line in [
            "tree 12-34-",
            "sid 7",
            "cgroup /sys/fs/cgroup/x y/acpd-12-34",
            "+pg 100 5",
            "+pg 200 6",
            "-pg 100",
            "+pg bad",
            "nonsense here",
        ] {
            o.apply(line);
        }
        assert_eq!(o.tree.as_deref(), Some("12-34-"));
        assert_eq!(o.sid, 7);
        assert_eq!(
            o.cgroup.as_deref(),
            Some(Path::new("/sys/fs/cgroup/x y/acpd-12-34"))
        );
        assert_eq!(o.groups, BTreeMap::from([(200, 6)]));
    }
}
