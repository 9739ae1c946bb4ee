//! A registry document parsed, and the distribution chosen for this host.
use super::*;

#[test]
fn the_aggregate_parses_and_bad_entries_are_skipped() {
    let d = doc();
    assert_eq!(d.version.as_deref(), Some("1.0.0"));
    let ids: Vec<&str> = d.agents.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["npx-agent", "uvx-agent", "both"]);
    assert_eq!(d.skipped, ["Bad_Id", "escape"]);
}

#[test]
fn a_lone_agent_json_is_a_document_of_one() {
    let one = r#"{"id": "codex-acp", "name": "Codex", "version": "1.4.0", "description": "d",
        "distribution": {"npx": {"package": "@agentclientprotocol/codex-acp@1.4.0"}}}"#;
    let d = Document::parse(one.as_bytes(), "file:///x/agent.json").unwrap();
    assert_eq!(d.version, None);
    assert_eq!(d.agents[0].id, "codex-acp");
    let err = Document::parse(b"[1]", "https://u:p@h.test/r.json?tok=1").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("https://h.test/r.json"), "{msg}");
    assert!(!msg.contains("tok") && !msg.contains("u:p"), "{msg}");
}

#[test]
fn npx_and_uvx_commands() {
    let d = doc();
    let all = |_: &str| true;
    let npx = resolve_agent(d.agent("npx-agent").unwrap(), "linux-x86_64", None, all).unwrap();
    assert_eq!(npx.command, ["npx", "--yes", "@scope/pkg@1.2.3", "--acp"]);
    assert_eq!(npx.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(npx.distribution, "npx");
    let uvx = resolve_agent(d.agent("uvx-agent").unwrap(), "linux-x86_64", None, all).unwrap();
    assert_eq!(uvx.command, ["uvx", "py-agent==0.1.0", "acp"]);
}

#[test]
fn the_choice_prefers_a_binary_then_an_installed_runner() {
    let d = doc();
    let both = d.agent("both").unwrap();
    assert_eq!(
        both.choose("linux-aarch64", |_| true).unwrap().kind(),
        "binary"
    );
    assert_eq!(both.choose("linux-x86_64", |_| true).unwrap().kind(), "npx");
    assert_eq!(
        both.choose("linux-x86_64", |t| t == "uvx").unwrap().kind(),
        "uvx"
    );
    // Neither runner installed: npx, so the spawn names what is missing.
    assert_eq!(
        both.choose("linux-x86_64", |_| false).unwrap().kind(),
        "npx"
    );
    let only_binary = Agent {
        distribution: Distribution {
            binary: both.distribution.binary.clone(),
            ..Default::default()
        },
        ..both.clone()
    };
    let err = resolve_agent(&only_binary, "linux-x86_64", None, |_| true).unwrap_err();
    assert!(err.to_string().contains("binary:linux-aarch64"), "{err}");
}

#[test]
fn the_platform_key_is_the_registrys() {
    let p = platform();
    let keys = [
        "darwin-aarch64",
        "darwin-x86_64",
        "linux-aarch64",
        "linux-x86_64",
        "windows-aarch64",
        "windows-x86_64",
    ];
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        assert!(keys.contains(&p.as_str()), "{p}");
    }
}

#[test]
fn urls_are_shown_without_secrets() {
    assert_eq!(
        shown("https://u:p@h.test:8/a/b.tgz?X-Sig=s#f"),
        "https://h.test:8/a/b.tgz"
    );
    assert_eq!(shown("file:///tmp/r.json"), "file:///tmp/r.json");
    assert_eq!(
        fetch::file_path("file:///tmp/a%20b.json").unwrap(),
        Path::new("/tmp/a b.json")
    );
}

#[test]
fn the_table_overrides_the_distributions_env() {
    let r = Resolved {
        id: "a".into(),
        version: "1.0.0".into(),
        distribution: "npx",
        command: vec!["npx".into()],
        env: [
            ("A".to_owned(), "doc".to_owned()),
            ("B".to_owned(), "doc".to_owned()),
        ]
        .into(),
    };
    let mut p = ProviderConfig::with_defaults("p", vec![]);
    p.env.insert("A".into(), "table".into());
    let applied = r.apply(&p);
    assert_eq!(applied.command, ["npx"]);
    assert_eq!(applied.env["A"], "table");
    assert_eq!(applied.env["B"], "doc");
}
