//! `acpd serve` end to end, one module per concern: the daemon itself (socket activation,
//! sd_notify, SIGHUP, SIGTERM, strays), `acpd reload`, `acpd mcp` through a daemon, sessions
//! that outlive their connection, and its metrics scraped by a real Prometheus. Every module
//! starts its daemon with `common::daemon::Daemon`.
//!
//! One test binary (each binary links the whole crate, so fewer binaries build and link
//! faster); filter a module with `cargo test --test serve <module>::`. Modules run in parallel
//! threads of this one process: a process-wide setting (the subreaper flag) or a fixed path
//! in one of them is shared with all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

#[path = "../common/mod.rs"]
mod common;

mod bridge_detach;
mod daemon;
mod mcp;
mod metrics;
mod metrics_coverage;
mod network;
mod reload;
