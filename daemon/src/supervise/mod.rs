//! Child processes: spawning into their own process group with PDEATHSIG from one long-lived
//! thread, the allowlisted environment, the stderr tail, the idempotent teardown ladder, and
//! reaping everything the tree leaves behind (acpd is a subreaper), and containment: each
//! child in its own cgroup where acpd can create them, a sentinel that outlives acpd.

pub(crate) mod cgroup;
mod contain;
mod env;
mod helper;
mod owner;
pub(crate) mod procfs;
pub(crate) mod reaper;
mod record_sweep;
mod records;
mod sandbox;
pub(crate) mod sched;
pub(crate) mod sentinel;
mod spawn;
mod stderr;
mod tree;

pub(crate) use contain::{
    ChildLimits, ContainmentSetting, contain, in_child_group, limit_warnings,
    status as containment_status,
};
pub(crate) use sentinel::run_sentinel;

pub(crate) use env::{DEPTH_VAR, MAX_DEPTH_VAR, child_env};
pub(crate) use helper::run_helper;
pub(crate) use owner::Owner;
pub(crate) use procfs::{Ancestry, ancestry};
pub(crate) use reaper::init;
pub(crate) use records::default_state_dir;
pub(crate) use records::{enable_default as keep_records, forget as forget_records, kill_all};
pub(crate) use records::{is_own_child, start_time};
pub(crate) use sandbox::{Confinement, Sandbox, SandboxError, SandboxPlan, landlock_abi};
pub(crate) use spawn::{SpawnError, SpawnSpec, spawn_sandboxed, spawn_standalone};
#[cfg(test)]
pub(crate) use spawn::{Spawned, spawn};
pub(crate) use stderr::{ChildStderrMode, StderrTail, flush_child_stderr, forward_child_stderr};
pub(crate) use tree::{Graces, ProcessTree, TeardownOutcome, signal_name};

/// Polls `done` until it holds or `deadline` passes (true when it held), backing off from 1 ms
/// to 20 ms: the waits of the teardown ladder, where the kernel gives no event to wait on for a
/// process group (and a cgroup's `cgroup.events` would need inotify).
pub(crate) async fn poll_until(
    deadline: tokio::time::Instant,
    mut done: impl FnMut() -> bool,
) -> bool {
    let mut delay = std::time::Duration::from_millis(1);
    loop {
        if done() {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(delay.min(deadline - now)).await;
        delay = (delay * 2).min(std::time::Duration::from_millis(20));
    }
}
