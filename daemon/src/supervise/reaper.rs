//! Process-wide setup and the stray reaper.
//!
//! acpd makes itself a child subreaper, so descendants orphaned inside a child's tree are
//! reparented to acpd rather than to a PID 1 that may reap nothing. Group members are reaped by
//! `waitpid(-pgid)` during teardown; anything that left its group (`setsid`, daemonising
//! helpers) is reaped here, on SIGCHLD, found with `waitid(WNOWAIT)` (a `/proc` scan only as
//! a fallback). Leaders are never touched here: tokio
//! owns their exit status, and `LEADERS` (held across spawn) says which pids those are.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::wait::{Id, WaitPidFlag, waitid, waitpid};
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
        tune_allocator();
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
                    Ok(rt) => rt.block_on(async {
                        tokio::spawn(trimmer());
                        stray_reaper().await
                    }),
                    Err(e) => tracing::warn!("cannot start the stray reaper: {e}"),
                }
            });
        if let Err(e) = reaper {
            tracing::warn!("cannot start the stray reaper thread: {e}");
        }
    });
}

/// How long the reaper waits before looking again while a leader's zombie (tokio reaps it in
/// a moment) hides the children behind it, at first and at most.
const BEHIND_LEADER_FIRST: Duration = Duration::from_millis(2);
const BEHIND_LEADER_MAX: Duration = Duration::from_millis(100);
/// Past this, stuck behind leaders, one full `/proc` scan makes sure no stray waits forever.
const BEHIND_LEADER_SCAN: Duration = Duration::from_secs(1);

/// Blocks of this size or more get their own mapping, so only the pages a block really uses
/// count. A supervisor holds a few 64 KiB buffers per child that mostly stay empty; from glibc's
/// heap they land on memory earlier requests had already touched, so resident memory per idle
/// child grew with the number of children (measured: ~40 KiB each at 64 children, ~85 KiB at
/// 1 024); mapped, it stays flat.
const MMAP_THRESHOLD: i32 = 32 * 1024;
/// glibc's default is 8 arenas per core, each keeping its own free memory; acpd's threads
/// are few and mostly waiting.
const ARENA_MAX: i32 = 2;

/// Tunes glibc's allocator for many idle children (see `MMAP_THRESHOLD`). Idempotent; the
/// earlier it runs (before other threads allocate), the more `ARENA_MAX` applies.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use nix::libc::{M_ARENA_MAX, M_MMAP_THRESHOLD, mallopt};
        // SAFETY: mallopt only sets allocator parameters; it is thread-safe in glibc.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            mallopt(M_ARENA_MAX, ARENA_MAX);
        }
    }
}

/// Children came or went (a spawn, a teardown): the allocator has holes worth returning.
static CHURN: tokio::sync::Notify = tokio::sync::Notify::const_new();
/// How long the churn must have stopped before the allocator is trimmed.
const TRIM_QUIET: Duration = Duration::from_millis(250);

pub(super) fn churned() {
    CHURN.notify_one();
}

/// After a burst of spawns or teardowns has settled, hands the free pages inside the
/// allocator's heaps back to the kernel. A burst of K concurrent starts leaves holes between
/// the K children's long-lived allocations (the handshakes' transient ones, freed); glibc
/// keeps them resident, so without this the idle daemon's RSS per child grew with K.
async fn trimmer() {
    loop {
        CHURN.notified().await;
        loop {
            tokio::select! {
                _ = CHURN.notified() => {}
                _ = tokio::time::sleep(TRIM_QUIET) => break,
            }
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free memory to the kernel; it is thread-safe.
        unsafe {
            nix::libc::malloc_trim(0);
        }
    }
}

async fn stray_reaper() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut sigchld) = signal(SignalKind::child()) else {
        tracing::warn!("cannot watch SIGCHLD; stray zombies will not be reaped");
        return;
    };
    let mut behind_since: Option<Instant> = None;
    let mut delay = BEHIND_LEADER_FIRST;
    loop {
        match reap_strays() {
            Peek::Clear => {
                behind_since = None;
                delay = BEHIND_LEADER_FIRST;
                if sigchld.recv().await.is_none() {
                    return;
                }
            }
            Peek::BehindLeader => {
                let since = *behind_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= BEHIND_LEADER_SCAN {
                    scan_strays();
                    behind_since = None;
                }
                tokio::select! {
                    got = sigchld.recv() => if got.is_none() { return },
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(BEHIND_LEADER_MAX);
            }
        }
    }
}

/// What the reaper saw of acpd's exited children.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Peek {
    /// No exited child is waiting (strays found on the way were reaped).
    Clear,
    /// The first exited child is a leader that tokio has not reaped yet; others may be behind.
    BehindLeader,
}

/// Reaps zombies whose parent is acpd and which are not leaders tokio is waiting for.
///
/// O(1) per exit, whatever the number of children: `waitid(P_ALL, WNOWAIT)` names an exited
/// child without reaping it; a stray is reaped by pid, and a leader is left to tokio (which
/// needs its status). The kernel always names the same first zombie, so a leader not yet
/// reaped hides the rest until tokio has reaped it: the caller looks again shortly.
/// (This used to read every `/proc/PID/stat` on the machine on each SIGCHLD: O(K) per exit
/// with K children, O(K²) to dispose of K at once, with the leader lock held meanwhile.)
pub(super) fn reap_strays() -> Peek {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    loop {
        let pid = match waitid(Id::All, flags) {
            Ok(status) => match status.pid() {
                Some(pid) => pid,
                None => return Peek::Clear,
            },
            // ECHILD: no children at all.
            Err(_) => return Peek::Clear,
        };
        let leaders = leaders();
        if leaders.contains(&pid.as_raw()) {
            return Peek::BehindLeader;
        }
        // Not a leader, and its zombie keeps the pid from being reused until this reaps it.
        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
    }
}

/// The fallback: every zombie on the machine whose parent is acpd and that is not a leader,
/// from `/proc`, without holding the leader lock while reading.
pub(super) fn scan_strays() {
    let me = std::process::id() as i32;
    let zombies: Vec<i32> = super::procfs::pids()
        .filter(|pid| {
            super::procfs::stat(*pid).is_some_and(|stat| stat.state == 'Z' && stat.ppid == me)
        })
        .collect();
    let leaders = leaders();
    for pid in zombies.into_iter().filter(|p| !leaders.contains(p)) {
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
    }
}
