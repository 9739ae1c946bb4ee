//! What a valid file resolves to: every key, the built-in echo provider, sizes and spares.
use super::*;
use crate::config::defaults::ECHO_DESCRIPTION;
use crate::config::validate::parse_size;

#[test]
fn full_file_round_trips() {
    let text = r#"
default_provider = "codex"
max_depth = 5
max_output = "16MiB"
max_children = 12
containment = "process-group"

[providers.codex]
command = ["codex-acp", "--flag"]
description = "Codex"
cwd = "/srv/work"
env = { RUST_LOG = "debug", "X.Y" = "1" }
env_passthrough = ["OPENAI_API_KEY"]
permission = "reject"
handshake_timeout = "90s"
idle_timeout = "0s"
run_timeout = "1h"
cancel_grace = "500ms"
keep_alive = "0s"
eof_grace = "1s"
term_grace = "4s"
max_concurrent = 3
warm = 2
warm_max_age = "5m"
memory_max = "512MiB"
pids_max = 100
workspace = "worktree"
sandbox = "auto"
network = false
budget = { tokens = 200000, wall = "30m" }
tool_filter = "claude-meta"
"#;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).expect("write config");
    let c = Config::load(Some(&path), echo_command()).expect("valid config");
    assert_eq!(c.source.as_deref(), Some(path.as_path()));
    assert_eq!(c.default_provider, "codex");
    assert_eq!(
        (c.max_depth, c.max_output, c.max_children),
        (5, 16 << 20, 12)
    );
    assert_eq!(c.providers.keys().collect::<Vec<_>>(), ["codex", "echo"]);
    let secs = Duration::from_secs;
    let expected = ProviderConfig {
        name: "codex".into(),
        command: vec!["codex-acp".into(), "--flag".into()],
        description: "Codex".into(),
        cwd: Some(PathBuf::from("/srv/work")),
        env: BTreeMap::from([
            ("RUST_LOG".into(), "debug".into()),
            ("X.Y".into(), "1".into()),
        ]),
        env_passthrough: vec!["OPENAI_API_KEY".into()],
        env_file: None,
        permission: PermissionPolicy::Reject,
        handshake_timeout: secs(90),
        idle_timeout: None,
        run_timeout: Some(secs(3600)),
        cancel_grace: Duration::from_millis(500),
        keep_alive: Duration::ZERO,
        eof_grace: secs(1),
        term_grace: secs(4),
        max_concurrent: 3,
        warm: 2,
        warm_max_age: secs(300),
        preset: None,
        registry: None,
        auth_method: None,
        offer_delegation: false,
        remote: None,
        memory_max: Some(512 << 20),
        pids_max: Some(100),
        workspace: crate::config::WorkspaceMode::Worktree,
        sandbox: crate::config::SandboxMode::Auto,
        network: false,
        budget: crate::config::Budget {
            tokens: Some(200_000),
            wall: Some(secs(1800)),
        },
        tool_filter: crate::config::ToolFilterMode::ClaudeMeta,
        builtin: false,
    };
    assert_eq!(
        c.containment,
        crate::supervise::ContainmentSetting::ProcessGroup
    );
    assert_eq!(c.provider("codex").map(|p| p.as_ref()), Some(&expected));
    assert!(c.provider("echo").is_some_and(|p| p.builtin));
}

#[test]
fn builtin_echo_exists_without_a_file_and_can_be_replaced() {
    let c = Config::builtin(echo_command());
    assert_eq!(c.source, None);
    assert_eq!(
        (c.max_depth, c.max_output, c.max_children),
        (2, 8 << 20, 256)
    );
    let mut expected = ProviderConfig::with_defaults("echo", echo_command());
    expected.description = ECHO_DESCRIPTION.into();
    expected.builtin = true;
    assert_eq!(c.providers.len(), 1);
    assert_eq!(
        c.provider(&c.default_provider).map(|p| p.as_ref()),
        Some(&expected)
    );
    assert_eq!(
        parse("").expect("empty").provider("echo"),
        c.provider("echo")
    );

    let c = parse("[providers.echo]\ncommand = [\"my-echo\"]\n").expect("echo override");
    let own = ProviderConfig::with_defaults("echo", vec!["my-echo".into()]);
    assert_eq!(c.provider("echo").map(|p| p.as_ref()), Some(&own));
}

#[test]
fn sizes() {
    let kib = [
        ("0", 0),
        ("123", 123),
        ("10B", 10),
        ("1kb", 1000),
        ("1KiB", 1024),
    ];
    let big = [
        ("8 MiB", 8 << 20),
        ("2MB", 2_000_000),
        ("3GB", 3_000_000_000),
    ];
    for (text, bytes) in kib
        .into_iter()
        .chain(big)
        .chain([("1gib", 1 << 30), (" 7 ", 7)])
    {
        assert_eq!(parse_size(text), Ok(bytes), "{text}");
    }
    for bad in [
        "",
        "MiB",
        "1.5MiB",
        "-1",
        "8 MiBs",
        "8K",
        "9999999999999999999999B",
    ] {
        assert!(parse_size(bad).is_err(), "{bad} should be rejected");
    }
    assert_eq!(
        parse("max_output = 4096\n").map(|c| c.max_output).ok(),
        Some(4096)
    );
}

#[test]
fn warm_spares_fit_the_providers_limit_and_detach_can_be_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "detach_timeout = \"0s\"\n[providers.a]\ncommand = [\"a\"]\nmax_concurrent = 2\nwarm = 3\n",
    )
    .expect("write config");
    let e = Config::load(Some(&path), echo_command()).expect_err("warm above max_concurrent");
    assert!(
        e.to_string()
            .contains(":5: providers.a.warm: must not exceed max_concurrent (2), got 3"),
        "{e}"
    );
    std::fs::write(&path, "detach_timeout = \"0s\"\n").expect("write config");
    let c = Config::load(Some(&path), echo_command()).expect("valid config");
    assert_eq!(c.detach_timeout, None);
    assert_eq!(
        Config::builtin(echo_command()).detach_timeout,
        Some(Duration::from_secs(600))
    );
}
