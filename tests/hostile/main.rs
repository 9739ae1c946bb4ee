//! acpd against parties that do not behave, one module per concern: hostile children and parents,
//! sessions owned by someone else, the command line against sockets that lie or stall, a flood read
//! slowly (bounded memory), and property tests of the router.
//!
//! One test binary (each binary links the whole crate, so fewer binaries build and link
//! faster); filter a module with `cargo test --test hostile <module>::`. Modules run in parallel
//! threads of this one process: a process-wide setting (the subreaper flag) or a fixed path
//! in one of them is shared with all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

#[path = "../common/mod.rs"]
mod common;

mod backpressure;
mod cli_safety;
mod half_messages;
mod hostile_child;
mod hostile_parent;
mod network;
mod network_floods;
mod planted_config;
mod router_props;
mod sessions_owner;
