//! acpd: an ACP bridge daemon with a subagent registry.

pub mod agent;
pub mod child;
pub mod cli;
pub mod config;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod supervise;
pub mod wire;
