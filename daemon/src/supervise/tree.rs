//! One child's process tree: the leader's exit, and the idempotent teardown ladder for its
//! whole process group.
//!
//! Ladder: close stdin (EOF is ACP's "end the session") → `eof_grace` → SIGTERM the group →
//! `term_grace` → SIGKILL the group → reap. The leader is reaped by tokio (which needs its exit
//! status), then the group by `waitpid(-pgid)` until no member is left; never `waitpid(-1)`.
//!
//! Contained by a cgroup, "the tree" is the whole cgroup: each rung waits for it to empty,
//! SIGTERM goes to every member too, and the ladder always ends with `cgroup.kill` and the
//! group's removal, so a descendant that left the process group dies as well. In the
//! fallback, the rungs are the process group's, and the ladder ends by killing every adopted
//! escapee that still carries the run's tree token.
//!
//! Under `acpd supervise` (a subreaper running one command), the rungs are the process
//! group's, and the ladder ends with the rest of the tree — every other descendant of the
//! process, found through its cgroup or `/proc` — given SIGTERM, the term grace, then SIGKILL
//! (and `cgroup.kill`), and the cgroup removed.

use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::sync::{OnceCell, watch};
use tokio::time::Instant;

use super::cgroup::Cgroup;
use super::reaper;

/// How a tree is held together besides its process group.
pub(super) enum Contained {
    /// The process group only ([`super::contain`] never ran).
    Group,
    /// Its own cgroup.
    Cgroup(Cgroup),
    /// A tree token in every descendant's environment.
    Token(String),
    /// Every descendant of this process (`acpd supervise`), and its cgroup where it has one.
    Descendants(Option<Cgroup>),
}

/// A resource limit the tree ran into (cgroup `memory.events` `oom_kill`, `pids.events` `max`).
pub(crate) use acpd_protocol::outcome::ResourceLimit as LimitHit;

/// How long each rung of the ladder waits for the tree to exit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Graces {
    pub eof: Duration,
    pub term: Duration,
}

/// Which rung ended the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeardownOutcome {
    /// Gone after stdin closed (or already gone).
    Exited,
    /// Gone after SIGTERM.
    Terminated,
    /// Needed SIGKILL.
    Killed,
}

/// A handle to a child's process tree. Clones share the same tree and teardown.
#[derive(Clone)]
pub(crate) struct ProcessTree {
    inner: Arc<Inner>,
}

struct Inner {
    pid: i32,
    /// The leader's start time: a token bearer older than it is not the tree's.
    start: u64,
    status: watch::Receiver<Option<ExitStatus>>,
    teardown: OnceCell<TeardownOutcome>,
    contained: Contained,
    /// Read just before the cgroup is removed, so it is still known afterwards.
    limit_hit: std::sync::Mutex<Option<LimitHit>>,
    /// The tree's sandbox, held as long as the tree (its private tmp goes with it).
    sandbox: Option<Arc<super::sandbox::Sandbox>>,
}

/// Upper bound on waiting for a SIGKILLed group to disappear; only zombies we cannot reap
/// (their parent is alive and not us) can hold it, and we log them.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// Scans for token bearers at the end of a fallback ladder, at most.
const TOKEN_ROUNDS: usize = 8;

impl ProcessTree {
    pub(super) fn adopt(
        mut child: Child,
        contained: Contained,
        sandbox: Option<Arc<super::sandbox::Sandbox>>,
    ) -> Self {
        let pid = child.id().map_or(-1, |p| p as i32);
        let start = super::records::start_time(pid).unwrap_or(0);
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status,
                Err(e) => {
                    tracing::warn!(pid, "waiting for child failed: {e}");
                    ExitStatus::from_raw(255 << 8)
                }
            };
            reaper::leaders().remove(&pid);
            let _ = tx.send(Some(status));
        });
        ProcessTree {
            inner: Arc::new(Inner {
                pid,
                start,
                status: rx,
                teardown: OnceCell::new(),
                contained,
                limit_hit: std::sync::Mutex::new(None),
                sandbox,
            }),
        }
    }

    /// What the tree's sandbox lets it write, when it has one.
    pub(crate) fn confinement(&self) -> Option<Arc<super::sandbox::Confinement>> {
        self.inner.sandbox.as_ref().map(|s| s.confinement().clone())
    }

    /// The leader's pid, which is also the process group id.
    pub(crate) fn pid(&self) -> i32 {
        self.inner.pid
    }

    /// The leader's exit status, once it has exited and been reaped.
    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        *self.inner.status.borrow()
    }

    /// Waits for the leader to exit.
    pub(crate) async fn exited(&self) -> ExitStatus {
        let mut rx = self.inner.status.clone();
        loop {
            if let Some(status) = *rx.borrow_and_update() {
                return status;
            }
            if rx.changed().await.is_err() {
                return ExitStatus::from_raw(255 << 8);
            }
        }
    }

    /// Runs the ladder once; concurrent and later callers get the same outcome. `close_stdin`
    /// must drop the child's stdin writer.
    pub(crate) async fn teardown(
        &self,
        close_stdin: impl FnOnce(),
        graces: Graces,
    ) -> TeardownOutcome {
        *self
            .inner
            .teardown
            .get_or_init(|| self.ladder(close_stdin, graces))
            .await
    }

    async fn ladder(&self, close_stdin: impl FnOnce(), graces: Graces) -> TeardownOutcome {
        let started = Instant::now();
        crate::metrics::get().teardown_step(crate::metrics::Step::Eof);
        close_stdin();
        let outcome = if self
            .wait_tree(crate::durations::deadline_from(started, graces.eof))
            .await
        {
            TeardownOutcome::Exited
        } else {
            crate::metrics::get().teardown_step(crate::metrics::Step::Term);
            self.signal(Signal::SIGTERM);
            if self
                .wait_tree(crate::durations::deadline(graces.term))
                .await
            {
                TeardownOutcome::Terminated
            } else {
                crate::metrics::get().teardown_step(crate::metrics::Step::Kill);
                self.signal(Signal::SIGKILL);
                if !self.wait_tree(Instant::now() + KILL_WAIT).await {
                    tracing::warn!(
                        pgid = self.pid(),
                        "process group still has members after SIGKILL"
                    );
                }
                TeardownOutcome::Killed
            }
        };
        self.end_escapees(graces.term).await;
        // Not awaited: a gone group left in the record a moment longer is skipped by the sweep
        // (its leader's start time no longer matches).
        let _ = super::records::remove(self.pid(), self.inner.start);
        reaper::churned();
        tracing::debug!(pgid = self.pid(), ?outcome, elapsed = ?started.elapsed(), "child tree torn down");
        outcome
    }

    /// The last rung, whatever the outcome: `cgroup.kill` and removal of the child's cgroup,
    /// SIGKILL for every escapee carrying the tree token, or SIGTERM → `term` → SIGKILL for
    /// every other descendant of `acpd supervise`.
    async fn end_escapees(&self, term: Duration) {
        match &self.inner.contained {
            Contained::Group => {}
            Contained::Descendants(group) => self.end_descendants(term, group.as_ref()).await,
            Contained::Cgroup(group) => {
                self.note_limit_hit();
                crate::metrics::get().teardown_step(crate::metrics::Step::CgroupKill);
                if let Err(e) = group.kill_and_remove(KILL_WAIT).await {
                    tracing::warn!(pgid = self.pid(), "cannot remove the child's cgroup: {e}");
                }
            }
            Contained::Token(token) => {
                // Again until a scan finds none: an escapee may fork while it is being killed.
                let mut killed = 0;
                for _ in 0..TOKEN_ROUNDS {
                    let escapees = super::contain::token_bearers_below(
                        token,
                        self.inner.start,
                        self.pid(),
                        -1,
                    );
                    if escapees.is_empty() {
                        break;
                    }
                    for pid in &escapees {
                        let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
                    }
                    killed += escapees.len();
                }
                if killed > 0 {
                    tracing::debug!(
                        pgid = self.pid(),
                        killed,
                        "killed escapees of the process group"
                    );
                    reaper::scan_strays();
                }
            }
        }
    }

    /// The limit the tree ran into, if any (cgroup mode with `memory_max` / `pids_max`).
    pub(crate) fn limit_hit(&self) -> Option<LimitHit> {
        self.note_limit_hit();
        *self
            .inner
            .limit_hit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn note_limit_hit(&self) {
        let Contained::Cgroup(group) = &self.inner.contained else {
            return;
        };
        let hit = if group.counter("memory.events", "oom_kill") > 0 {
            Some(LimitHit::Memory)
        } else if group.counter("pids.events", "max") > 0 {
            Some(LimitHit::Pids)
        } else {
            None
        };
        let mut seen = self
            .inner
            .limit_hit
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seen.is_none() {
            *seen = hit;
            hit.inspect(|h| {
                crate::metrics::get().limit_hit(match h {
                    LimitHit::Memory => crate::metrics::Limit::MemoryMax,
                    LimitHit::Pids => crate::metrics::Limit::PidsMax,
                })
            });
        }
    }

    /// Ends whatever of an `acpd supervise` tree outlived its process group — every
    /// descendant that left it, and everything in its cgroup — with SIGTERM, then after
    /// `term` SIGKILL (and `cgroup.kill`), reaping as it goes, and removes the cgroup.
    async fn end_descendants(&self, term: Duration, group: Option<&Cgroup>) {
        let pgid = Pid::from_raw(self.inner.pid);
        reaper::reap_strays();
        let left = descendants_left(group);
        if !left.is_empty() || group.is_some_and(Cgroup::populated) {
            let _ = killpg(pgid, Signal::SIGTERM);
            signal_each(&left, Signal::SIGTERM);
            if !descendants_gone_by(crate::durations::deadline(term), group).await {
                if let Some(g) = group {
                    let _ = g.kill();
                }
                let _ = killpg(pgid, Signal::SIGKILL);
                signal_each(&descendants_left(group), Signal::SIGKILL);
                if !descendants_gone_by(Instant::now() + KILL_WAIT, group).await {
                    tracing::warn!(left = ?super::procfs::descendants(), "processes left after SIGKILL");
                }
            }
            // A cgroup empties before its last processes are zombies we can reap: wait for those.
            if group.is_some() {
                descendants_gone_by(Instant::now() + KILL_WAIT, None).await;
            }
        }
        if let Some(Err(e)) = group.map(Cgroup::remove) {
            tracing::warn!("cannot remove the command's cgroup: {e}");
        }
    }

    /// The child's own cgroup, in cgroup mode.
    pub(crate) fn cgroup(&self) -> Option<&Cgroup> {
        match &self.inner.contained {
            Contained::Cgroup(group) => Some(group),
            _ => None,
        }
    }

    /// SIGKILLs the whole group at once (a second shutdown signal, or a spawn gone wrong).
    pub(crate) fn kill_now(&self) {
        self.signal(Signal::SIGKILL);
    }

    fn signal(&self, sig: Signal) {
        if self.inner.pid > 0 {
            let _ = killpg(Pid::from_raw(self.inner.pid), sig);
        }
        match &self.inner.contained {
            Contained::Group => {}
            Contained::Cgroup(group) if sig == Signal::SIGKILL => {
                let _ = group.kill();
            }
            Contained::Cgroup(group) => {
                for pid in group.all_members() {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
                }
            }
            Contained::Token(token) => {
                for pid in super::contain::token_bearers_below(
                    token,
                    self.inner.start,
                    self.pid(),
                    self.pid(),
                ) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
                }
            }
            // The rungs are the process group's; the rest comes in `end_descendants`.
            Contained::Descendants(_) => {}
        }
    }

    /// True once the leader is reaped and no process is left in the group; reaps members that
    /// became ours on the way.
    async fn wait_tree(&self, deadline: Instant) -> bool {
        if tokio::time::timeout_at(deadline, self.exited())
            .await
            .is_err()
        {
            return false;
        }
        let pgid = Pid::from_raw(self.inner.pid);
        super::poll_until(deadline, || {
            reap_group(pgid);
            let cgroup_empty = self.cgroup().is_none_or(|g| !g.populated());
            killpg(pgid, None).is_err() && cgroup_empty
        })
        .await
    }
}

/// Reaps every exited member of `pgid` that is our child (orphans adopted as subreaper).
fn reap_group(pgid: Pid) {
    while let Ok(status) = waitpid(Pid::from_raw(-pgid.as_raw()), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

fn signal_each(pids: &[i32], sig: Signal) {
    for &pid in pids {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// What is left of an `acpd supervise` tree: with a cgroup, nothing once it is empty
/// (everything the command started was born in it; reading `cgroup.events` spares a `/proc`
/// scan at every poll), else every descendant, zombies included.
fn descendants_left(group: Option<&Cgroup>) -> Vec<i32> {
    match group {
        Some(g) if !g.populated() => Vec::new(),
        _ => super::procfs::descendants(),
    }
}

/// Reaps until no descendant is left (and `group` is empty) or `deadline` passes; true when
/// none is left. The leader is reaped already: every exited child is a stray of ours.
async fn descendants_gone_by(deadline: Instant, group: Option<&Cgroup>) -> bool {
    super::poll_until(deadline, || {
        reaper::reap_strays();
        descendants_left(group).is_empty() && !group.is_some_and(Cgroup::populated)
    })
    .await
}

/// `SIGKILL`-style name of the signal that ended `status`, if one did.
pub(crate) fn signal_name(status: &ExitStatus) -> Option<String> {
    let sig = status.signal()?;
    Some(
        Signal::try_from(sig)
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|_| format!("SIG{sig}")),
    )
}
