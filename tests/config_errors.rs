//! Config errors through the real binary: exit 2, and the message names file, line and key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

mod common;

use common::*;

fn expect_error(toml: &str, line: usize, key: &str) {
    let env = Env::raw(toml);
    for args in [&["providers"][..], &["run", "hi"][..]] {
        let out = env.acpd().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {stderr}");
        let want = format!("{}:{line}:", env.config.display());
        assert!(stderr.contains(&want), "missing {want} in: {stderr}");
        assert!(stderr.contains(key), "missing key {key} in: {stderr}");
        assert!(out.stdout.is_empty(), "nothing on stdout");
    }
}

const CMD: &str = "command = [\"x\"]";

#[test]
fn unknown_key() {
    expect_error(
        &format!("[providers.a]\n{CMD}\ncomand = [\"y\"]\n"),
        3,
        "comand",
    );
}

#[test]
fn unknown_top_level_key() {
    expect_error("max_dpeth = 3\n", 1, "max_dpeth");
}

#[test]
fn duplicate_provider() {
    expect_error(
        &format!("[providers.a]\n{CMD}\n[providers.a]\n{CMD}\n"),
        3,
        "providers.a",
    );
}

#[test]
fn relative_cwd() {
    expect_error(
        &format!("[providers.a]\n{CMD}\ncwd = \"rel/dir\"\n"),
        3,
        "providers.a.cwd",
    );
}

#[test]
fn empty_argv() {
    expect_error("[providers.a]\ncommand = []\n", 2, "providers.a.command");
}

#[test]
fn bad_duration() {
    expect_error(
        &format!("[providers.a]\n{CMD}\n\nidle_timeout = \"10 parsecs\"\n"),
        4,
        "providers.a.idle_timeout",
    );
}

#[test]
fn bad_size() {
    expect_error("max_output = \"lots\"\n", 1, "max_output");
}

#[test]
fn default_provider_must_exist() {
    expect_error("default_provider = \"ghost\"\n", 1, "default_provider");
}

#[test]
fn bad_permission_policy() {
    expect_error(
        &format!("[providers.a]\n{CMD}\npermission = \"maybe\"\n"),
        3,
        "providers.a.permission",
    );
}

#[test]
fn explicit_missing_file_is_an_error() {
    let out = base()
        .args(["--config", "/nonexistent/acpd.toml", "providers"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/acpd.toml"));
}

#[test]
fn usage_error_exits_2() {
    let out = base().args(["run", "--bogus", "x"]).output().unwrap();
    assert_eq!(code(&out), 2);
}
