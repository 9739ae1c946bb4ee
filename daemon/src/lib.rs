//! acpd: an ACP bridge daemon with a subagent registry.

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
