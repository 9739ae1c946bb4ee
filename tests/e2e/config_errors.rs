//! Config errors through the real binary: exit 2, and the message names file, line and key.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use common::*;

/// Asserts both `acpd providers` and `acpd run` exit 2 naming file, line and key; returns
/// the last stderr.
fn expect_error(toml: &str, line: usize, key: &str) -> String {
    let env = Env::raw(toml);
    let mut last = String::new();
    for args in [&["providers"][..], &["run", "hi"][..]] {
        let out = env.acpd().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{args:?}: {stderr}");
        let want = format!("{}:{line}:", env.config.display());
        assert!(stderr.contains(&want), "missing {want} in: {stderr}");
        assert!(stderr.contains(key), "missing key {key} in: {stderr}");
        assert!(out.stdout.is_empty(), "nothing on stdout");
        last = stderr.into_owned();
    }
    last
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

/// Formerly `acpd run` panicked (exit 101) computing `now + eof_grace`; now every duration
/// above the 30-day ceiling is a config error naming the value and the ceiling.
#[test]
fn a_duration_above_the_ceiling_is_a_config_error() {
    for key in [
        "eof_grace",
        "handshake_timeout",
        "idle_timeout",
        "run_timeout",
    ] {
        let stderr = expect_error(
            &format!("[providers.a]\n{CMD}\n{key} = \"18446744073709551615s\"\n"),
            3,
            &format!("providers.a.{key}"),
        );
        assert!(
            stderr.contains("\"18446744073709551615s\" is longer than the ceiling of 30days"),
            "{stderr}"
        );
    }
    let out = base()
        .args(["run", "--timeout", "18446744073709551615s", "hi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(stderr.contains("ceiling of 30days"), "{stderr}");
}

/// Every duration just below the ceiling: a run starts, answers and ends as usual.
#[test]
fn durations_just_below_the_ceiling_run_fine() {
    let near = "29days 23h 59m 59s";
    let mut toml = format!(
        "line_timeout = \"{near}\"\nwrite_timeout = \"{near}\"\nqueue_timeout = \"{near}\"\n\
         detach_timeout = \"{near}\"\n[providers.a]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n"
    );
    for key in [
        "handshake_timeout",
        "idle_timeout",
        "run_timeout",
        "cancel_grace",
        "keep_alive",
        "eof_grace",
        "term_grace",
        "warm_max_age",
    ] {
        toml.push_str(&format!("{key} = \"{near}\"\n"));
    }
    let env = Env::raw(&toml);
    let (result, code, stderr) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "a",
        "--timeout",
        "30days",
        "still fine",
    ]));
    assert_eq!(code, 0, "{result} {stderr}");
    assert!(output_text(&result).contains("still fine"), "{result}");
}
