//! End-to-end tests of the real `acpd` binary against the echo agent, one module per concern:
//! `acpd run` and its teardown ladder, `acpd stdio` and the transparent bridge, persisted
//! sessions, nested delegation, registry providers, traces and config errors.
//!
//! One test binary (each binary links the whole crate, so fewer binaries build and link
//! faster); filter a module with `cargo test --test e2e <module>::`. Modules run in parallel
//! threads of this one process: a process-wide setting (the subreaper flag) or a fixed path
//! in one of them is shared with all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

#[path = "../common/mod.rs"]
mod common;

mod auth_failures;
mod bridge_cancel;
mod bridge_raw;
mod bridge_session_end;
mod bridge_sessions;
mod bridge_transparent;
mod bridge_update_text;
mod bridge_warm;
mod budget;
mod catalog;
mod cli;
mod config_errors;
mod confinement;
mod echo_sessions;
mod failures;
mod isolation;
mod isolation_commit;
mod isolation_sweep;
mod nested;
mod otlp;
mod otlp_bounds;
mod run;
mod sandbox_doors;
mod stdio;
mod teardown;
mod terminal;
mod tokens;
mod tool_filter;
mod trace;
