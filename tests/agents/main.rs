//! acpd with code nobody here wrote: the official ACP TypeScript SDK and real production agents
//! (claude-agent-acp and the others pinned in tests/interop/package.json), offline against mock
//! model APIs, and the SDKs' own network clients against acpd's network face.
//!
//! One test binary (each binary links the whole crate, so fewer binaries build and link
//! faster); filter a module with `cargo test --test agents <module>::`. Modules run in parallel
//! threads of this one process: a process-wide setting (the subreaper flag) or a fixed path
//! in one of them is shared with all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

#[path = "../common/mod.rs"]
mod common;
mod node;

mod differential;
mod interop;
mod isolation_claude;
mod newcomer;
mod presets;
mod real_agent;
mod real_delegate;
mod remote_clients;
mod tool_filter;
