//! Presets expanded into their pinned commands, and remote host keys.
use super::*;

/// Presets expanded with no data dir (so `npx`) and as root or not, independent of this host.
fn parse_presets(text: &str, is_root: bool) -> Result<Config, ConfigError> {
    let ctx = presets::PresetContext {
        data_dir: None,
        is_root,
    };
    Config::parse_in(text, Path::new(FILE), echo_command(), &ctx)
}

#[test]
fn each_preset_expands_to_its_pinned_command_and_needs() {
    for preset in presets::PRESETS {
        let text = format!("[providers.a]\npreset = \"{}\"\n", preset.name);
        let c = parse_presets(&text, false).unwrap();
        let p = c.provider("a").unwrap();
        assert_eq!(p.command, preset.command(None), "{}", preset.name);
        assert_eq!(p.preset.as_deref(), Some(preset.name));
        assert_eq!(p.description, preset.description);
        assert_eq!(p.env_passthrough, preset.env_passthrough);
        assert!(p.env.is_empty(), "{}: no env as a user", preset.name);
    }
    let c = parse_presets("[providers.g]\npreset = \"gemini\"\n", false).unwrap();
    assert_eq!(
        c.provider("g").unwrap().command,
        ["npx", "-y", "@google/gemini-cli@0.61.0", "--acp"]
    );
    let c = parse_presets("[providers.c]\npreset = \"claude\"\n", true).unwrap();
    assert_eq!(
        c.provider("c")
            .unwrap()
            .env
            .get("IS_SANDBOX")
            .map(String::as_str),
        Some("1")
    );
}

#[test]
fn the_table_overrides_the_preset() {
    let text = "[providers.c]\npreset = \"codex\"\ncommand = [\"/opt/codex-acp\"]\n\
                description = \"mine\"\neof_grace = \"1s\"\n\
                env_passthrough = [\"EXTRA\", \"OPENAI_API_KEY\"]\n";
    let c = parse_presets(text, false).unwrap();
    let p = c.provider("c").unwrap();
    assert_eq!(p.command, ["/opt/codex-acp"]);
    assert_eq!(p.description, "mine");
    assert_eq!(p.eof_grace, Duration::from_secs(1));
    assert_eq!(p.preset.as_deref(), Some("codex"));
    let names = &p.env_passthrough;
    assert_eq!(names.first().map(String::as_str), Some("CODEX_API_KEY"));
    assert_eq!(names.last().map(String::as_str), Some("EXTRA"));
    assert_eq!(names.iter().filter(|n| *n == "OPENAI_API_KEY").count(), 1);
    // Without the override the preset's quirk holds.
    let c = parse_presets("[providers.c]\npreset = \"codex\"\n", false).unwrap();
    assert_eq!(c.provider("c").unwrap().eof_grace, Duration::from_secs(5));
    // The table's env wins over the preset's root rule.
    let text = "[providers.c]\npreset = \"claude\"\n[providers.c.env]\nIS_SANDBOX = \"0\"\n";
    let c = parse_presets(text, true).unwrap();
    assert_eq!(
        c.provider("c")
            .unwrap()
            .env
            .get("IS_SANDBOX")
            .map(String::as_str),
        Some("0")
    );
}

#[test]
fn an_unknown_preset_names_the_valid_ones() {
    let err = fails(
        "[providers.x]\n\npreset = \"codx\"\n",
        3,
        "providers.x.preset",
    );
    assert!(
        err.ends_with(
            "unknown preset \"codx\"; did you mean \"codex\"? (valid: claude, codex, gemini, \
             goose, opencode)"
        ),
        "{err}"
    );
    let err = fails(
        "[providers.x]\npreset = \"codex\"\nregistry = \"codex\"\n",
        3,
        "providers.x.registry",
    );
    assert!(err.ends_with("cannot be combined with `preset`"), "{err}");
}

#[test]
fn remote_keys_parse_into_a_remote_and_reject_what_cannot_work() {
    use crate::config::{Remote, SshHost, Via};
    let c = parse(&codex(
        "host = \"ssh://dev@box:2222\"\nssh_options = [\"-F\", \"/etc/acpd/ssh_config\"]\n\
         remote_acpd = \"/opt/acpd/bin/acpd\"",
    ))
    .unwrap();
    let remote = c.provider("codex").unwrap().remote.clone();
    assert_eq!(
        remote,
        Some(Remote {
            via: Via::Ssh {
                host: SshHost::parse("ssh://dev@box:2222").unwrap(),
                options: vec!["-F".into(), "/etc/acpd/ssh_config".into()],
            },
            remote_acpd: "/opt/acpd/bin/acpd".into(),
        })
    );
    let c = parse(&codex(
        "launcher = [\"kubectl\", \"exec\", \"-i\", \"pod\", \"--\"]",
    ))
    .unwrap();
    let remote = c.provider("codex").unwrap().remote.clone().unwrap();
    assert_eq!(remote.remote_acpd, "acpd");
    assert!(matches!(remote.via, Via::Launcher(ref argv) if argv.len() == 5));
    assert_eq!(
        parse(CODEX).unwrap().provider("codex").unwrap().remote,
        None
    );

    let key = |k: &str| format!("providers.codex.{k}");
    let err = fails(&codex("host = \"ssh://-oProxyCommand=x\""), 3, &key("host"));
    assert!(err.contains("bad host name"), "{err}");
    fails(&codex("host = \"box\""), 3, &key("host"));
    let err = fails(&codex("\nssh_options = [\"-v\"]"), 4, &key("ssh_options"));
    assert!(err.ends_with("needs `host`"), "{err}");
    let err = fails(&codex("remote_acpd = \"/x\""), 3, &key("remote_acpd"));
    assert!(err.ends_with("needs `host` or `launcher`"), "{err}");
    let err = fails(
        &codex("host = \"ssh://box\"\nlauncher = [\"env\"]"),
        4,
        &key("launcher"),
    );
    assert!(err.ends_with("cannot be combined with `host`"), "{err}");
    fails(&codex("launcher = []"), 3, &key("launcher"));
    fails(&codex("launcher = [\"\"]"), 3, &key("launcher"));
    fails(
        &codex("host = \"ssh://box\"\nremote_acpd = \"\""),
        4,
        &key("remote_acpd"),
    );
    let err = fails(
        "[providers.r]\nregistry = \"some-agent\"\nhost = \"ssh://box\"\n",
        3,
        "providers.r.host",
    );
    assert!(err.contains("cannot be combined with `registry`"), "{err}");
}
