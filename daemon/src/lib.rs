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
//! `trace`, `store` → `wire`, `supervise`, `remote` → `child` → `catalog`,
//! `registry` → `server` → `runtime`, `mcp` → `cli`. `agent` (the echo agent) is a
//! separate ACP program that needs only `wire`.
//!
//! `ARCHITECTURE.md` at the repository root has the module map, three flows followed function by
//! function (a delegated run, a bridge session, a teardown) and the invariants with where each
//! is enforced: who owns a child, what bounds every queue, what is refused from a child.

pub mod agent;
pub mod catalog;
pub(crate) mod child;
pub mod cli;
pub mod config;
pub mod durations;
pub mod mcp;
pub mod private_fs;
pub mod registry;
pub mod remote;
pub(crate) mod runtime;
pub(crate) mod server;
pub mod store;
pub mod supervise;
pub mod trace;
pub mod wire;
pub mod workspace;
