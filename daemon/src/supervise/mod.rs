//! Child processes: spawning into their own process group with PDEATHSIG from one long-lived
//! thread, the allowlisted environment, the stderr tail, the idempotent teardown ladder, and
//! reaping everything the tree leaves behind (acpd is a subreaper).

mod env;
pub(crate) mod procfs;
mod reaper;
mod records;
mod spawn;
mod stderr;
mod tree;

pub use env::{DEPTH_VAR, MAX_DEPTH_VAR, child_env};
pub use reaper::{init, tune_allocator};
pub(crate) use records::default_state_dir;
pub use records::{enable_default as keep_records, forget as forget_records, kill_all};
pub use spawn::{SpawnError, SpawnSpec, Spawned, spawn};
pub use stderr::StderrTail;
pub use tree::{Graces, ProcessTree, TeardownOutcome, signal_name};
