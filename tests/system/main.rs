//! acpd against the operating system's machinery: containment (cgroups, process groups, the
//! sentinel), PDEATHSIG, `acpd supervise`, children on other hosts over a real OpenSSH server, and
//! the systemd units in a booted systemd-nspawn container. Tests skip, saying why, when the machine
//! lacks what they need (root, sshd, cgroup v2, the cached container root).
//!
//! One test binary (each binary links the whole crate, so fewer binaries build and link
//! faster); filter a module with `cargo test --test system <module>::`. Modules run in parallel
//! threads of this one process: a process-wide setting (the subreaper flag) or a fixed path
//! in one of them is shared with all of them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

#[path = "../common/mod.rs"]
mod common;
mod nspawn;

mod containment;
mod deb_nspawn;
mod pdeathsig;
mod remote;
mod supervise;
mod systemd_nspawn;
