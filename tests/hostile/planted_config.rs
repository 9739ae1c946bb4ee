//! A config (or env file) another user could swap: every directory above it must be acpd's
//! user's or root's and writable by nobody else (a sticky one such as `/tmp` aside), as
//! OpenSSH's StrictModes asks; `acpd init` checks before it makes anything, and every command
//! that loads a config refuses one, since that is where its commands get executed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

/// A uid that is not the test's (nobody).
const OTHER: u32 = 65534;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Only root can give a directory to another user; elsewhere these tests say why they skip.
fn root() -> bool {
    let me = nix::unistd::geteuid();
    if !me.is_root() {
        eprintln!("skipped: chown to uid {OTHER} needs root, and this runs as uid {me}");
    }
    me.is_root()
}

/// A scratch dir with an `xdg` directory in it, for `XDG_CONFIG_HOME`.
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    (dir, xdg)
}

fn acpd(dir: &Path, xdg: &Path, args: &[&str]) -> Output {
    base()
        .env("XDG_CONFIG_HOME", xdg)
        .env("HOME", dir)
        .env("STATE_DIRECTORY", dir.join("state"))
        .current_dir(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn acpd_init_refuses_a_config_home_another_user_owns_and_makes_nothing() {
    if !root() {
        return;
    }
    let (dir, xdg) = scratch();
    nix::unistd::chown(&xdg, Some(nix::unistd::Uid::from_raw(OTHER)), None).unwrap();
    let out = acpd(dir.path(), &xdg, &["init"]);
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("{} is owned by uid {OTHER}", xdg.display())),
        "{err}"
    );
    assert!(err.contains(&format!("chown 0 {}", xdg.display())), "{err}");
    assert!(!xdg.join("acpd").exists(), "init made a directory in it");
}

#[test]
fn acpd_init_refuses_a_config_home_others_can_write_but_not_a_sticky_one() {
    let (dir, xdg) = scratch();
    chmod(&xdg, 0o777);
    let out = acpd(dir.path(), &xdg, &["init"]);
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!("{} is writable by every user", xdg.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!("chmod go-w {}", xdg.display())),
        "{err}"
    );
    assert!(!xdg.join("acpd").exists(), "init made a directory in it");
    // Sticky, as /tmp is: nobody else can rename or remove the user's own entry in it.
    chmod(&xdg, 0o1777);
    let out = acpd(dir.path(), &xdg, &["init"]);
    assert!(xdg.join("acpd/config.toml").is_file(), "{}", stderr(&out));
}

/// The config root's `acpd run` would execute: refused where another user can swap it, and
/// its command never runs.
#[test]
fn a_config_another_user_can_swap_is_refused_on_load_and_runs_nothing() {
    let (dir, xdg) = scratch();
    std::fs::create_dir(xdg.join("acpd")).unwrap();
    let ran = dir.path().join("ran");
    let config = format!(
        "default_provider = \"p\"\n[providers.p]\ncommand = [\"/usr/bin/touch\", \"{}\"]\n",
        ran.display()
    );
    std::fs::write(xdg.join("acpd/config.toml"), config).unwrap();
    chmod(&xdg.join("acpd"), 0o757);
    let out = acpd(dir.path(), &xdg, &["run", "hi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let acpd_dir = xdg.join("acpd");
    assert!(
        err.contains(&format!("{} is writable by every user", acpd_dir.display())),
        "{err}"
    );
    assert!(
        err.contains(&format!("chmod go-w {}", acpd_dir.display())),
        "{err}"
    );
    assert!(!ran.exists(), "the provider's command ran");
    chmod(&xdg.join("acpd"), 0o700);
    if root() {
        nix::unistd::chown(&xdg, Some(nix::unistd::Uid::from_raw(OTHER)), None).unwrap();
        let out = acpd(dir.path(), &xdg, &["run", "hi"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("{} is owned by uid {OTHER}", xdg.display())),
            "{err}"
        );
        assert!(!ran.exists(), "the provider's command ran");
    }
}
