//! Config parsing, validation and discovery.
use super::defaults::{ECHO_DESCRIPTION, ETC_CONFIG};
use super::validate::parse_size;
use super::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

const FILE: &str = "/tmp/x/config.toml";
const CODEX: &str = "[providers.codex]\ncommand = [\"codex-acp\"]\n";

fn echo_command() -> Vec<String> {
    vec!["/usr/bin/acpd".into(), "agent".into(), "echo".into()]
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(FILE), echo_command())
}

fn codex(extra: &str) -> String {
    format!("{CODEX}{extra}\n")
}

/// Asserts `text` is rejected with one line `FILE:line: key: …` and returns it.
fn fails(text: &str, line: usize, key: &str) -> String {
    let err = parse(text).expect_err("should be rejected").to_string();
    let at = format!("{FILE}:{line}: {key}: ");
    assert!(err.starts_with(&at), "{err:?} is not at {at:?}");
    assert!(!err.contains('\n'), "error spans several lines: {err:?}");
    err
}

#[test]
fn unknown_keys_are_rejected() {
    let err = fails("max_depth = 1\nbogus = 2\n", 2, "bogus");
    assert!(err.contains("unknown field `bogus`"), "{err}");
    let err = fails(&codex("colour = 1"), 3, "providers.codex.colour");
    assert!(err.contains("unknown field `colour`"), "{err}");
}

#[test]
fn duplicate_provider_is_rejected() {
    let err = fails(&format!("{CODEX}\n{CODEX}"), 4, "providers.codex");
    assert!(err.contains("duplicate"), "{err}");
}

#[test]
fn relative_cwd_is_rejected() {
    let text = format!("\n\n\n\n\n{CODEX}cwd = \"rel/dir\"");
    let err = fails(&text, 8, "providers.codex.cwd");
    assert!(err.ends_with("an absolute path, got \"rel/dir\""), "{err}");
}

#[test]
fn bad_argv_is_rejected() {
    let key = "providers.codex.command";
    fails("[providers.codex]\ncommand = []\n", 2, key);
    fails("[providers.codex]\n\ncommand = [\"\", \"x\"]", 3, key);
    fails("[providers.codex]\ncommand = \"codex --x\"", 2, key);
    let err = fails("[providers.codex]\ndescription = \"d\"\n", 1, key);
    assert!(
        err.ends_with("is required (or a `preset` or `registry` to fill it)"),
        "{err}"
    );
}

#[test]
fn bad_durations_are_rejected() {
    let text = codex("idle_timeout = \"10 parsecs\"");
    let err = fails(&text, 3, "providers.codex.idle_timeout");
    assert!(err.contains("invalid duration \"10 parsecs\""), "{err}");
    let err = fails(
        &codex("cancel_grace = 5"),
        3,
        "providers.codex.cancel_grace",
    );
    assert!(err.contains("expected a string"), "{err}");
}

/// Every duration key of the file: (key, is it a provider's key).
const DURATION_KEYS: &[(&str, bool)] = &[
    ("line_timeout", false),
    ("write_timeout", false),
    ("queue_timeout", false),
    ("detach_timeout", false),
    ("handshake_timeout", true),
    ("idle_timeout", true),
    ("run_timeout", true),
    ("cancel_grace", true),
    ("keep_alive", true),
    ("eof_grace", true),
    ("term_grace", true),
    ("warm_max_age", true),
];

/// A config with `key = "value"` on line 1 (top level) or line 3 (in `[providers.codex]`).
fn with_duration(key: &str, provider: bool, value: &str) -> (String, String, usize) {
    if provider {
        (
            codex(&format!("{key} = \"{value}\"")),
            format!("providers.codex.{key}"),
            3,
        )
    } else {
        (format!("{key} = \"{value}\"\n"), key.to_owned(), 1)
    }
}

/// Every duration in a parsed config, so none can be left out of the ceiling's checks.
fn all_durations(c: &Config) -> Vec<Duration> {
    let mut all = vec![c.line_timeout, c.write_timeout];
    all.extend(c.queue_timeout);
    all.extend(c.detach_timeout);
    for p in c.providers.values() {
        all.extend([
            p.handshake_timeout,
            p.cancel_grace,
            p.keep_alive,
            p.eof_grace,
        ]);
        all.extend([p.term_grace, p.warm_max_age]);
        all.extend(p.idle_timeout);
        all.extend(p.run_timeout);
    }
    all
}

#[test]
fn a_duration_above_the_ceiling_is_a_config_error_naming_the_value_and_the_ceiling() {
    for (key, provider) in DURATION_KEYS {
        for value in ["18446744073709551615s", "30days 1ns", "31days", "1000000h"] {
            let (text, full, line) = with_duration(key, *provider, value);
            let err = fails(&text, line, &full);
            assert!(
                err.contains(&format!("{value:?} is longer than the ceiling of 30days")),
                "{err}"
            );
        }
        let (text, ..) = with_duration(key, *provider, "30days");
        let config = parse(&text).unwrap();
        assert!(
            all_durations(&config).contains(&durations::CEILING),
            "{key}"
        );
    }
}

proptest::proptest! {
    /// Any value of any duration key parses to a config error or to a config whose
    /// durations are all at most the ceiling.
    #[test]
    fn every_duration_key_is_an_error_or_at_most_the_ceiling(
        which in 0..DURATION_KEYS.len(),
        number in proptest::prop_oneof![
            proptest::num::u64::ANY,
            0u64..100,
            proptest::sample::select(vec![
                u64::MAX, u64::MAX / 1000, 2_592_000, 2_592_001, 43_200, 43_201, 720, 721, 30, 31,
            ]),
        ],
        unit in proptest::sample::select(vec![
            "ns", "us", "ms", "s", "sec", "m", "min", "h", "hours", "d", "days", "w", "weeks",
            "M", "months", "y", "years", "parsecs", "",
        ]),
        more in proptest::option::of((0u64..1_000_000, proptest::sample::select(vec!["s", "h", "d"]))),
    ) {
        let (key, provider) = DURATION_KEYS[which];
        let mut value = format!("{number}{unit}");
        if let Some((n, u)) = more {
            value.push_str(&format!(" {n}{u}"));
        }
        let (text, full, line) = with_duration(key, provider, &value);
        match parse(&text) {
            Ok(config) => {
                for d in all_durations(&config) {
                    proptest::prop_assert!(d <= durations::CEILING, "{key} = {value:?} gave {d:?}");
                }
            }
            Err(e) => {
                let e = e.to_string();
                let at = format!("{FILE}:{line}: {full}: ");
                proptest::prop_assert!(e.starts_with(&at), "{e:?} is not at {at:?}");
            }
        }
    }
}

#[test]
fn bad_sizes_are_rejected() {
    fails("max_output = \"8 MiBs\"\n", 1, "max_output");
    fails("max_depth = 1\nmax_output = -1\n", 2, "max_output");
    fails("max_output = true\n", 1, "max_output");
    fails("max_output = \"0KiB\"\n", 1, "max_output");
    fails(
        &codex("memory_max = \"1 TiBs\""),
        3,
        "providers.codex.memory_max",
    );
    fails(&codex("pids_max = 0"), 3, "providers.codex.pids_max");
}

#[test]
fn containment_takes_three_values() {
    use crate::supervise::ContainmentSetting as C;
    for (text, want) in [
        ("", C::Auto),
        ("containment = \"auto\"\n", C::Auto),
        ("containment = \"cgroup\"\n", C::Cgroup),
        ("containment = \"process-group\"\n", C::ProcessGroup),
    ] {
        assert_eq!(
            parse(text).map(|c| c.containment).ok(),
            Some(want),
            "{text}"
        );
    }
    let err = fails("max_depth = 2\ncontainment = \"jail\"\n", 2, "containment");
    assert!(err.contains("process-group"), "{err}");
}

#[test]
fn bad_names_are_rejected() {
    let bad_provider = "[providers.\"a b\"]\ncommand = [\"x\"]\n";
    fails(bad_provider, 1, "providers.\"a b\"");
    let text = codex("env = { \"A=B\" = \"x\" }");
    fails(&text, 3, "providers.codex.env.\"A=B\"");
    let text = codex("env = { A = \"x\\u0000\" }");
    fails(&text, 3, "providers.codex.env.A");
    let text = codex("env_passthrough = [\"OK\", \"\"]");
    fails(&text, 3, "providers.codex.env_passthrough");
}

#[test]
fn unknown_default_provider_is_rejected() {
    let text = format!("\ndefault_provider = \"no\"\n{CODEX}");
    let err = fails(&text, 2, "default_provider");
    assert!(err.contains("\"no\" (known: codex, echo)"), "{err}");
    let config = parse(&format!("default_provider = \"codex\"\n{CODEX}"));
    assert_eq!(
        config.map(|c| c.default_provider).ok(),
        Some("codex".into())
    );
}

#[test]
fn zero_limits_are_rejected() {
    let err = fails(
        &codex("max_concurrent = 0"),
        3,
        "providers.codex.max_concurrent",
    );
    assert!(err.ends_with("must be at least 1"), "{err}");
    fails("max_children = 0\n", 1, "max_children");
}

#[test]
fn wrong_types_and_syntax_errors_name_the_key() {
    fails("max_depth = -1\n", 1, "max_depth");
    let err = fails("providers.codex = 3\n", 1, "providers.codex");
    assert!(err.contains("expected a provider table"), "{err}");
    let err = fails(
        &codex("permission = \"maybe\""),
        3,
        "providers.codex.permission",
    );
    assert!(err.contains("unknown variant `maybe`"), "{err}");
    fails("max_depth = \n", 1, "max_depth");
    fails(
        &codex("cwd = \"/a\"\ncwd = \"/b\""),
        4,
        "providers.codex.cwd",
    );
}

#[test]
fn missing_or_unreadable_files_name_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.toml");
    let err = Config::load(Some(&missing), echo_command()).expect_err("missing file");
    assert!(matches!(err, ConfigError::Missing { .. }), "{err:?}");
    assert_eq!(err.path(), missing);
    let err = Config::load(Some(dir.path()), echo_command()).expect_err("a directory");
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}: ", dir.path().display())),
        "{shown}"
    );
}

/// A FIFO nobody writes (or a device) would block the read forever: refused at once, by
/// name. Before, the read blocked; the deadline turns that into a failure, not a hang.
#[test]
fn a_config_that_is_not_a_regular_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("config.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Config::load(Some(&path), echo_command()));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("reading a FIFO config blocked")
        .expect_err("a FIFO");
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains("not a regular file (it is a FIFO)"),
        "{shown}"
    );
    assert!(
        shown.starts_with(&format!("{}: ", fifo.display())),
        "{shown}"
    );
    let err = Config::load(Some(Path::new("/dev/zero")), echo_command()).expect_err("a device");
    assert!(
        err.to_string()
            .contains("not a regular file (it is a device)"),
        "{err}"
    );
    // A regular file too large to be a config (sparse: costs no disk) is refused unread.
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let err = Config::load(Some(&huge), echo_command()).expect_err("a huge file");
    assert!(
        err.to_string().contains("larger than 16777216 bytes"),
        "{err}"
    );
}

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

/// Runs discovery with `vars` as the environment and `existing` as the
/// only files; renders the outcome as the path, "" for none, or the error.
fn found(explicit: Option<&str>, vars: &[(&str, &str)], existing: &[&str]) -> String {
    let vars: HashMap<&str, &str> = vars.iter().copied().collect();
    let env = |k: &str| vars.get(k).map(|v| v.to_string());
    let exists = |p: &Path| existing.iter().any(|e| Path::new(e) == p);
    match Config::discover(explicit.map(Path::new), env, exists) {
        Ok(path) => path.map(|p| p.display().to_string()).unwrap_or_default(),
        Err(err) => err.to_string(),
    }
}

#[test]
fn discovery_order() {
    let vars = [
        ("ACPD_CONFIG", "/e.toml"),
        ("XDG_CONFIG_HOME", "/x"),
        ("HOME", "/h"),
    ];
    let home = "/h/.config/acpd/config.toml";
    let all = [
        "/f.toml",
        "/e.toml",
        "/x/acpd/config.toml",
        home,
        ETC_CONFIG,
    ];
    assert_eq!(found(Some("/f.toml"), &vars, &all), "/f.toml");
    assert_eq!(found(None, &vars, &all), "/e.toml");
    assert_eq!(found(None, &vars[1..], &all), "/x/acpd/config.toml");
    // XDG_CONFIG_HOME replaces ~/.config rather than adding to it.
    assert_eq!(found(None, &vars[1..], &all[3..]), ETC_CONFIG);
    let empty = [("ACPD_CONFIG", ""), ("XDG_CONFIG_HOME", ""), ("HOME", "/h")];
    assert_eq!(found(None, &empty, &all), home);
    assert_eq!(
        found(None, &[("XDG_CONFIG_HOME", "rel"), ("HOME", "/h")], &all),
        home
    );
    assert_eq!(found(None, &vars[2..], &all[4..]), ETC_CONFIG);
    assert_eq!(found(None, &[], &all[4..]), ETC_CONFIG);
    assert_eq!(found(None, &vars[1..], &[]), "");
}

#[test]
fn explicitly_named_files_must_exist() {
    let err = found(Some("/f.toml"), &[], &[ETC_CONFIG]);
    assert_eq!(err, "/f.toml: config file named by --config does not exist");
    let err = found(None, &[("ACPD_CONFIG", "/e.toml")], &[ETC_CONFIG]);
    assert_eq!(
        err,
        "/e.toml: config file named by ACPD_CONFIG does not exist"
    );
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
        err.ends_with("unknown preset \"codx\" (valid: claude, codex, gemini, goose, opencode)"),
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
