//! acpd: an ACP bridge daemon with a subagent registry.

pub mod config;
pub mod wire;
pub mod supervise;
pub mod agent;
