#![warn(unreachable_pub)]
//! acpd: an ACP bridge daemon with a subagent registry.
//!
//! # Layout
//!
//! Toward editors and parent agents acpd is an ACP agent (`server`, one connection each,
//! over `runtime`'s stdio or socket); toward child agents it is an ACP client (`child`, one
//! driver task per child, which alone owns the child's pipes). Between them the `registry`
//! gates every start, holds each live child's slot and owns delegated runs. Only `supervise`
//! forks, signals and reaps; `wire` is the bounded JSON-RPC engine both sides use; the wire
//! vocabulary and every pure rule live in the `acpd-protocol` crate.
//!
//! Layers, each using only those before it: `acpd-protocol` → `config`, `private_fs`,
//! `trace`, `otel`, `store` → `wire`, `supervise`, `remote` → `child` → `catalog`,
//! `registry` → `server` → `runtime`, `mcp` → `cli`. `agent` (the echo agent) is a
//! separate ACP program that needs only `wire`.
//!
//! `ARCHITECTURE.md` at the repository root has the module map, three flows followed function by
//! function (a delegated run, a bridge session, a teardown) and the invariants with where each
//! is enforced: who owns a child, what bounds every queue, what is refused from a child.

mod agent;
mod catalog;
mod child;
mod cli;
mod config;
mod durations;
mod mcp;
mod metrics;
mod otel;
mod private_fs;
mod registry;
mod remote;
mod runtime;
mod server;
mod store;
mod supervise;
mod trace;
mod trusted_path;
mod wire;
mod workspace;

// The public surface. Every module above is private to the crate, and `unreachable_pub` warns
// about a `pub` item nothing outside it can reach, so `pub(crate)` is the default and `pub`
// marks what is re-exported here: what the `acpd` binary, the integration tests and the
// benchmarks use. None of it is a stable library API.

/// `acpd agent sleeper`: a process that only sleeps, for the teardown tests.
pub use agent::run_sleeper;
/// The command line: `main.rs` parses [`Cli`] and hands it to [`dispatch`].
pub use cli::{AgentCommand, Cli, Command, dispatch, with_status_line_cleared};
/// `main` takes systemd's sockets with it before any thread exists.
pub use runtime::{Activated, ActivationError, activated_listeners};
/// `main` calls it before any thread allocates.
pub use supervise::reaper::tune_allocator;
pub use supervise::sched::favour_throughput;
/// The sentinel process's whole life (`acpd` re-executed as its own crash watcher).
pub use supervise::sentinel::run_sentinel;

/// What the integration tests and benchmarks drive in-process: the registry without a socket
/// (`tests/library`), the wire without a child (`bench/scale.rs`), and a few pure helpers.
pub mod testing {
    pub use crate::catalog::document::platform;
    pub use crate::config::types::{Config, ProviderConfig};
    pub use crate::registry::Registry;
    pub use crate::registry::limits::DepthContext;
    pub use crate::registry::run_events::RunEvent;
    pub use crate::registry::run_start::StartOptions;
    pub use crate::remote::quote::quote;
    pub use crate::supervise::cgroup::own_dir;
    pub use crate::supervise::reaper::init;
    pub use crate::wire::peer::Peer;
    pub use crate::wire::{Connection, connect};
}
