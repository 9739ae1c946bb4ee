#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! A newcomer's first minutes, scripted: from an empty HOME and empty XDG directories,
//! `acpd init claude` writes the config and installs the real claude-agent-acp (from npm's
//! cache, offline), `acpd doctor` warns that there is no key (exit 1), then a key — first in
//! the environment, then in the env_file the config points at — and `acpd run` prints the
//! reply of tests/interop/mock-model.mjs. The env_file is refused while others may read it,
//! with what to run and without its value.
//!
//! Skipped, printing why, only when node is missing.

use crate::common::BIN;
use crate::node;
use crate::presets::Mock;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const KEY: &str = "sk-ant-newcomer-secret";

struct Newcomer {
    root: tempfile::TempDir,
    base_url: String,
}

impl Newcomer {
    fn dir(&self, d: &str) -> PathBuf {
        self.root.path().join(d)
    }

    /// `acpd ARGS` with nothing of this machine's but PATH, npm's cache and the mock's URL.
    fn acpd(&self, args: &[&str], key: Option<&str>) -> (i32, String, String) {
        let npm_cache = Command::new("npm")
            .args(["config", "get", "cache"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir("home"))
            .env("XDG_CONFIG_HOME", self.dir("xdg/config"))
            .env("XDG_DATA_HOME", self.dir("xdg/data"))
            .env("XDG_CACHE_HOME", self.dir("xdg/cache"))
            .env("XDG_STATE_HOME", self.dir("xdg/state"))
            // The agent comes from npm's cache, never the network.
            .env("npm_config_cache", npm_cache)
            .env("npm_config_offline", "true")
            .env("npm_config_update_notifier", "false")
            .env("ANTHROPIC_BASE_URL", &self.base_url)
            .args(args)
            .current_dir(self.dir("home"));
        if let Some(key) = key {
            cmd.env("ANTHROPIC_API_KEY", key);
        }
        let started = Instant::now();
        let out: Output = cmd.output().unwrap();
        eprintln!(
            "acpd {}: {} ms",
            args.join(" "),
            started.elapsed().as_millis()
        );
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_newcomer_gets_from_acpd_init_to_a_reply() {
    if !node::present() {
        eprintln!("SKIPPED: node is not installed, so the newcomer test cannot run");
        return;
    }
    // The interop packages warm npm's cache with the pinned claude-agent-acp.
    let _ = node::install();
    let root = tempfile::tempdir().unwrap();
    for d in ["home/.claude", "xdg", "project"] {
        std::fs::create_dir_all(root.path().join(d)).unwrap();
    }
    // The mock's answers, not the agent's: manual permission mode ("auto" prepends a billing
    // notice) and nothing that would phone home.
    std::fs::write(
        root.path().join("home/.claude/settings.json"),
        r#"{"permissions":{"defaultMode":"default"},"env":{"DISABLE_AUTOUPDATER":"1",
            "DISABLE_TELEMETRY":"1","DISABLE_ERROR_REPORTING":"1"}}"#,
    )
    .unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mock = Mock::start(log.path());
    let n = Newcomer {
        root,
        base_url: format!("http://127.0.0.1:{}", mock.port),
    };
    let config = n.dir("xdg/config/acpd/config.toml");
    let project = n.dir("project");
    let project = project.to_str().unwrap();

    // 1. init: the config where acpd reads it, the agent installed, what is missing.
    let (code, out, err) = n.acpd(&["init", "claude"], None);
    assert!(
        out.contains(&format!("wrote {}", config.display())),
        "{out}\n{err}"
    );
    assert_eq!(
        (mode(&config), mode(config.parent().unwrap())),
        (0o600, 0o700)
    );
    assert!(out.contains("claude: installed"), "{out}\n{err}");
    assert!(
        out.contains("still missing") && out.contains("set ANTHROPIC_API_KEY"),
        "{out}"
    );
    let env_file = n.dir("xdg/config/acpd/claude.env");
    assert!(out.contains(&env_file.display().to_string()), "{out}");
    assert_eq!(code, 1, "init says something is missing: {out}\n{err}");
    // Again: it never overwrites.
    let (code, _, err) = n.acpd(&["init", "claude"], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );

    // 2. doctor warns: no key.
    let (code, out, err) = n.acpd(&["doctor"], None);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("claude: WARN"), "{out}");
    assert!(
        out.contains("warning: claude has no credential: set ANTHROPIC_API_KEY"),
        "{out}"
    );

    // 3. The key in the environment: doctor is happy and a run prints the reply.
    let (code, out, err) = n.acpd(&["doctor", "claude"], Some(KEY));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("claude: OK"), "{out}");
    let args = [
        "run",
        "--timeout",
        "90s",
        "--cwd",
        project,
        "hello newcomer",
    ];
    let (code, out, err) = n.acpd(&args, Some(KEY));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("REPLY hello newcomer"), "{out}\n{err}");

    // 4. The key in the env_file instead, as the config's comment says.
    std::fs::write(&env_file, format!("# for acpd\nANTHROPIC_API_KEY={KEY}\n")).unwrap();
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let line = format!("# env_file = \"{}\"", env_file.display());
    assert!(text.contains(&line), "{text}");
    std::fs::write(&config, text.replacen(&line, &line[2..], 1)).unwrap();
    let (code, out, err) = n.acpd(&["doctor", "claude"], None);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("claude: FAIL") && out.contains(&format!("chmod 600 {}", env_file.display())),
        "{out}"
    );
    assert!(
        !format!("{out}{err}").contains(KEY),
        "the key leaked: {out}\n{err}"
    );
    std::fs::set_permissions(&env_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out, err) = n.acpd(&["doctor", "claude"], None);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("claude: OK"), "{out}");
    let args = [
        "run",
        "--timeout",
        "90s",
        "--cwd",
        project,
        "hello env file",
    ];
    let (code, out, err) = n.acpd(&args, None);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("REPLY hello env file"), "{out}\n{err}");
    assert!(
        !format!("{out}{err}").contains(KEY),
        "the key leaked: {out}\n{err}"
    );
}
