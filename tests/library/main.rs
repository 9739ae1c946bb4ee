//! The registry through its library API, in this process (no acpd binary between).
//!
//! A binary of its own, and it must stay alone: the library makes the process it runs in a
//! supervisor — a child subreaper whose reaper thread (`supervise::reaper`) reaps every child
//! that is not one of its own leaders, the test harness's `std::process::Child`ren included
//! (another test's `wait()` then fails with ECHILD), and it raises RLIMIT_NOFILE and tunes the
//! allocator process-wide. Tests that spawn processes themselves belong in the other binaries.
//! `docs` (README.md and the book's links) spawns nothing, so it lives here, where it is cheap.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

#[path = "../common/mod.rs"]
mod common;

mod docs;
mod registry;
