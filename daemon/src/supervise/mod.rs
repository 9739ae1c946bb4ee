//! Child processes: spawning into their own process group with PDEATHSIG from one long-lived
//! thread, the allowlisted environment, the stderr tail, the idempotent teardown ladder, and
//! reaping everything the tree leaves behind (acpd is a subreaper), and containment: each
//! child in its own cgroup where acpd can create them, a sentinel that outlives acpd.

pub mod cgroup;
mod contain;
mod env;
mod helper;
pub(crate) mod procfs;
mod reaper;
mod record_sweep;
mod records;
mod sandbox;
mod sentinel;
mod spawn;
mod stderr;
mod tree;

pub use contain::{
    ChildLimits, ContainError, Containment, ContainmentSetting, Mode as ContainmentMode, TREE_VAR,
    contain, current as containment, in_child_group, limit_warnings, status as containment_status,
};
pub use sentinel::{pid as sentinel_pid, run_sentinel};

pub use env::{DEPTH_VAR, MAX_DEPTH_VAR, child_env};
pub use helper::{HelperOutput, run_helper};
pub use procfs::{Ancestry, ancestry};
pub use reaper::{init, tune_allocator};
pub(crate) use records::default_state_dir;
pub use records::{enable_default as keep_records, forget as forget_records, kill_all};
pub use records::{is_own_child, start_time};
pub use sandbox::{Sandbox, SandboxError, SandboxPlan, landlock_abi};
pub use spawn::{
    SpawnError, SpawnSpec, Spawned, spawn, spawn_limited, spawn_sandboxed, spawn_standalone,
};
pub use stderr::{ChildStderrMode, StderrTail, flush_child_stderr, forward_child_stderr};
pub use tree::{Graces, LimitHit, ProcessTree, TeardownOutcome, signal_name};

/// Polls `done` until it holds or `deadline` passes (true when it held), backing off from 1 ms
/// to 20 ms: the waits of the teardown ladder, where the kernel gives no event to wait on for a
/// process group (and a cgroup's `cgroup.events` would need inotify).
pub async fn poll_until(deadline: tokio::time::Instant, mut done: impl FnMut() -> bool) -> bool {
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
