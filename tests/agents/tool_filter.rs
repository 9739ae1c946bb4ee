#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! A tool filter with the real claude-agent-acp 0.101.0 (the `claude` preset, installed by
//! `acpd install claude`) on tests/interop/mock-model.mjs, through `acpd run`: the mock model
//! answers `BASH <command>` with a `Bash` tool call whether or not Bash is offered. acpd's
//! provider allows every permission (`permission = "allow"`), so only the filter stands between
//! the model's call and the command: without it the marker file appears; with `--deny-tool
//! Bash` Claude Code is never offered Bash, refuses the call ("No such tool available"), the
//! marker never appears, and the run completes with the model's answer to that refusal.
//!
//! Skipped, printing why, only when node is missing (see presets.rs).

use crate::common::{BIN, output_text, run_json};
use crate::presets::{Mock, claude_dirs, installed};

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const KEY: &str = "sk-ant-mock-tool-filter";

/// `acpd run --json` of the claude preset asking the mock for `touch MARKER`, with `args`;
/// the result, the marker's path, and what the mock logged.
fn run_bash(data_root: &Path, args: &[&str]) -> (Value, i32, String, bool, String) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mock = Mock::start(log.path());
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let claude_dir = claude_dirs(w);
    let config = w.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "default_provider = \"claude\"\n[providers.claude]\npreset = \"claude\"\n\
             permission = \"allow\"\neof_grace = \"5s\"\nterm_grace = \"2s\"\n\
             [providers.claude.env]\nCLAUDE_CONFIG_DIR = {:?}\nDISABLE_AUTOUPDATER = \"1\"\n\
             DISABLE_TELEMETRY = \"1\"\nDISABLE_ERROR_REPORTING = \"1\"\n",
            claude_dir.to_string_lossy()
        ),
    )
    .unwrap();
    let marker = w.join("project/MARKER");
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", w.join("home"))
        .env("XDG_DATA_HOME", data_root.join("data"))
        .env("XDG_CONFIG_HOME", w.join("xdg/config"))
        .env("XDG_CACHE_HOME", w.join("xdg/cache"))
        .env("XDG_STATE_HOME", w.join("xdg/state"))
        .env("STATE_DIRECTORY", w.join("state"))
        .env("ACPD_LOG", "warn")
        .env("ANTHROPIC_API_KEY", KEY)
        .env(
            "ANTHROPIC_BASE_URL",
            format!("http://127.0.0.1:{}", mock.port),
        )
        .arg("--config")
        .arg(&config)
        .args(["run", "--json", "--timeout", "90s", "--cwd"])
        .arg(w.join("project"))
        .args(args)
        .arg(format!("BASH touch {}", marker.display()))
        .current_dir(w);
    let (result, code, stderr) = run_json(&mut cmd);
    drop(mock);
    let asked = std::fs::read_to_string(log.path()).unwrap_or_default();
    (result, code, stderr, marker.exists(), asked)
}

#[test]
fn a_filter_that_forbids_bash_means_the_models_bash_call_never_runs() {
    let Some(data) = installed() else { return };
    // Control: the same run without a filter runs the command.
    let (v, code, stderr, touched, asked) = run_bash(data, &[]);
    assert_eq!(code, 0, "{v}\n{stderr}\n{asked}");
    assert!(
        touched,
        "without a filter Bash should have run: {v}\n{asked}"
    );

    let (v, code, stderr, touched, asked) = run_bash(data, &["--deny-tool", "Bash"]);
    eprintln!("with --deny-tool Bash: {v}");
    assert!(
        !touched,
        "Bash ran under a filter that forbids it: {v}\n{asked}"
    );
    assert_eq!(code, 0, "{v}\n{stderr}\n{asked}");
    assert_eq!(v["stopReason"], "completed", "{v}");
    // The model was told the tool does not exist, and said so.
    let text = output_text(&v);
    assert!(text.starts_with("RESULT ERROR"), "{text}");
    assert!(text.contains("Bash"), "{text}");
}
