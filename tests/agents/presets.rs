#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! A real production agent started through its preset: `acpd install claude` puts the pinned
//! claude-agent-acp into a temporary data directory (npm's cache is warm from the interop tests),
//! and `preset = "claude"` then runs it from there against tests/interop/mock-model.mjs, a
//! stand-in for the Anthropic Messages API on 127.0.0.1. With a dummy key the turn completes with
//! the mock's reply; without one the result is an `auth` failure whose diagnostic names the
//! environment variables that would satisfy it (never their values).
//!
//! Skipped, printing why, only when node is missing; an install that fails is a failure.

use crate::common;
use crate::node::{self, interop_dir};

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use common::{BIN, output_text, run_json};
use serde_json::Value;

const PROMPT: &str = "hello preset";
const REPLY: &str = "REPLY hello preset";
const KEY: &str = "sk-ant-mock-presets";

/// One data directory with claude installed, shared by the tests (None when node is missing).
pub(crate) fn installed() -> Option<&'static Path> {
    static DATA: OnceLock<Option<tempfile::TempDir>> = OnceLock::new();
    DATA.get_or_init(|| {
        if Command::new("node").arg("--version").output().is_err() {
            eprintln!("SKIPPED: node is not installed, so the preset end-to-end test cannot run");
            return None;
        }
        // The interop packages first: that warms npm's cache for the install below.
        let _ = node::install();
        let root = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let out = Command::new(BIN)
            .args(["install", "claude"])
            .env_remove("ACPD_CONFIG")
            .env("XDG_DATA_HOME", root.path().join("data"))
            // The warm cache answers; the registry is asked only for what it lacks.
            .env("npm_config_prefer_offline", "true")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "acpd install claude failed\n{stdout}\n{stderr}"
        );
        eprintln!("acpd install claude: {} ms", started.elapsed().as_millis());
        assert!(stdout.contains("preset = \"claude\""), "{stdout}");
        let bin = root
            .path()
            .join("data/acpd/agents/claude-0.101.0/node_modules/.bin/claude-agent-acp");
        assert!(bin.exists(), "{} after install:\n{stdout}", bin.display());
        Some(root)
    })
    .as_ref()
    .map(|d| d.path())
}

/// The mock model server; it ends when its stdin closes (when this is dropped).
pub(crate) struct Mock {
    child: Child,
    pub(crate) port: u16,
}

impl Mock {
    pub(crate) fn start(log: &Path) -> Mock {
        let mut child = Command::new("node")
            .arg(interop_dir().join("mock-model.mjs"))
            .arg(log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        let port = u16::try_from(port["port"].as_u64().unwrap()).unwrap();
        Mock { child, port }
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The private dirs a claude run under `w` gets: home, project, state, XDG config/cache/state,
/// and Claude Code's config dir (returned) in manual permission mode ("auto" prepends a
/// gateway billing notice to the first reply).
pub(crate) fn claude_dirs(w: &Path) -> std::path::PathBuf {
    for d in [
        "home",
        "project",
        "state",
        "xdg/config",
        "xdg/cache",
        "xdg/state",
        "claude",
    ] {
        std::fs::create_dir_all(w.join(d)).unwrap();
    }
    let claude_dir = w.join("claude");
    std::fs::write(
        claude_dir.join("settings.json"),
        r#"{"permissions":{"defaultMode":"default"}}"#,
    )
    .unwrap();
    claude_dir
}

/// `acpd run --json` of the claude preset in a private HOME, XDG dirs and Claude config dir;
/// `key` is the only credential in acpd's environment (or none).
fn run_claude(data_root: &Path, mock: &Mock, key: Option<&str>) -> (Value, i32, String) {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let claude_dir = claude_dirs(w);
    let config = w.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "default_provider = \"claude\"\n[providers.claude]\npreset = \"claude\"\n\
             eof_grace = \"5s\"\nterm_grace = \"2s\"\n[providers.claude.env]\n\
             CLAUDE_CONFIG_DIR = {:?}\nDISABLE_AUTOUPDATER = \"1\"\nDISABLE_TELEMETRY = \"1\"\n\
             DISABLE_ERROR_REPORTING = \"1\"\n",
            claude_dir.to_string_lossy()
        ),
    )
    .unwrap();
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
        .env(
            "ANTHROPIC_BASE_URL",
            format!("http://127.0.0.1:{}", mock.port),
        )
        .arg("--config")
        .arg(&config)
        .args(["run", "--json", "--timeout", "90s", "--cwd"])
        .arg(w.join("project"))
        .arg(PROMPT)
        .current_dir(w);
    if let Some(key) = key {
        cmd.env("ANTHROPIC_API_KEY", key);
    }
    let started = Instant::now();
    let out = run_json(&mut cmd);
    eprintln!(
        "acpd run (key: {}): {} ms",
        key.is_some(),
        started.elapsed().as_millis()
    );
    out
}

#[test]
fn the_installed_claude_preset_completes_a_turn_against_the_mock() {
    let Some(data) = installed() else { return };
    let log = tempfile::NamedTempFile::new().unwrap();
    let mock = Mock::start(log.path());
    let (result, code, stderr) = run_claude(data, &mock, Some(KEY));
    assert_eq!(code, 0, "{result}\n{stderr}");
    assert_eq!(result["stopReason"], "completed", "{result}\n{stderr}");
    assert_eq!(output_text(&result), REPLY, "{result}\n{stderr}");
    let asked = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        asked.contains("/v1/messages") && asked.contains(PROMPT),
        "the mock never got the prompt: {asked}"
    );
}

#[test]
fn the_preset_lists_itself_installed() {
    let Some(data) = installed() else { return };
    let out = Command::new(BIN)
        .args(["providers", "--presets", "--json"])
        .env_remove("ACPD_CONFIG")
        .env("XDG_DATA_HOME", data.join("data"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let presets = v["presets"].as_array().unwrap();
    let claude = presets.iter().find(|p| p["name"] == "claude").unwrap();
    let bin = claude["installed"].as_str().unwrap();
    assert!(
        bin.ends_with("agents/claude-0.101.0/node_modules/.bin/claude-agent-acp"),
        "{bin}"
    );
    assert_eq!(claude["command"][0].as_str(), Some(bin));
    let codex = presets.iter().find(|p| p["name"] == "codex").unwrap();
    assert!(codex["installed"].is_null());
    assert_eq!(codex["command"][0], "npx");
}

#[test]
fn the_claude_preset_without_credentials_is_an_auth_failure_naming_the_variables() {
    let Some(data) = installed() else { return };
    let log = tempfile::NamedTempFile::new().unwrap();
    let mock = Mock::start(log.path());
    let (result, code, stderr) = run_claude(data, &mock, None);
    // Auth is one exit code, whichever stage the agent fails at.
    assert_eq!(code, 7, "{result}\n{stderr}");
    // A start failure (`{"error": …}`) or a result with a failure: either way category `auth`.
    let category = result["failure"]["category"]
        .as_str()
        .or_else(|| result["error"]["data"]["category"].as_str());
    assert_eq!(category, Some("auth"), "{result}\n{stderr}");
    let said = format!("{result}\n{stderr}");
    eprintln!("without credentials: {said}");
    // What to set, and where a daemon's credential goes.
    for want in [
        "env: ANTHROPIC_API_KEY",
        "set ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN)",
        "env_file in the provider's config",
    ] {
        assert!(
            said.contains(want),
            "the diagnostic does not say {want:?}: {said}"
        );
    }
}
