//! Process-wide setup and the stray reaper.
//!
//! acpd makes itself a child subreaper, so descendants orphaned inside a child's tree are
//! reparented to acpd rather than to a PID 1 that may reap nothing. Group members are reaped by
//! `waitpid(-pgid)` during teardown; anything that left its group (`setsid`, daemonising
//! helpers) is reaped here, on SIGCHLD, from `/proc`. Leaders are never touched here: tokio
//! owns their exit status, and `LEADERS` (held across spawn) says which pids those are.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

static LEADERS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());
static ORIGINAL_NOFILE: OnceLock<(u64, u64)> = OnceLock::new();
static INIT: OnceLock<()> = OnceLock::new();

pub(super) fn leaders() -> MutexGuard<'static, BTreeSet<i32>> {
    LEADERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `RLIMIT_NOFILE` acpd started with, restored in every child.
pub(super) fn original_nofile() -> Option<(u64, u64)> {
    ORIGINAL_NOFILE.get().copied()
}

/// Prepares the process for supervising children. Call once before the first spawn; later
/// calls do nothing.
pub fn init() {
    INIT.get_or_init(|| {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!(
                "cannot become a child subreaper ({e}); orphaned grandchildren may stay zombies"
            );
        }
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            let _ = ORIGINAL_NOFILE.set((soft, hard));
            // Each child costs about four descriptors; take what the hard limit allows.
            if soft < hard {
                let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            }
        }
        super::spawn::start_thread();
        // Its own thread and runtime, so it outlives whichever runtime called init.
        let reaper = std::thread::Builder::new()
            .name("acpd-reaper".into())
            .spawn(|| {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(stray_reaper()),
                    Err(e) => tracing::warn!("cannot start the stray reaper: {e}"),
                }
            });
        if let Err(e) = reaper {
            tracing::warn!("cannot start the stray reaper thread: {e}");
        }
    });
}

async fn stray_reaper() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        tracing::warn!("cannot watch SIGCHLD; stray zombies will not be reaped");
        return;
    };
    while sigchld.recv().await.is_some() {
        reap_strays();
    }
}

/// Reaps zombies whose parent is acpd and which are not leaders tokio is waiting for.
pub(super) fn reap_strays() {
    let me = std::process::id() as i32;
    let leaders = leaders();
    for pid in super::procfs::pids().filter(|p| !leaders.contains(p)) {
        if let Some(stat) = super::procfs::stat(pid)
            && stat.state == 'Z'
            && stat.ppid == me
        {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}
