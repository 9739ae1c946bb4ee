//! A bad value is refused with one line naming the file, the line and the key.
use super::*;

#[test]
fn unknown_keys_are_rejected() {
    let err = fails("max_depth = 1\nbogus = 2\n", 2, "bogus");
    assert!(
        err.contains("unknown key \"bogus\": acpd reads no such key"),
        "{err}"
    );
    assert!(!err.contains("max_children"), "every key listed: {err}");
    let err = fails(&codex("colour = 1"), 3, "providers.codex.colour");
    assert!(err.contains("unknown key \"colour\""), "{err}");
    let err = fails(&codex("preest = \"codex\""), 3, "providers.codex.preest");
    assert!(
        err.ends_with("unknown key \"preest\"; did you mean \"preset\"?"),
        "{err}"
    );
    let err = fails("max_chidlren = 2\n", 1, "max_chidlren");
    assert!(err.ends_with("did you mean \"max_children\"?"), "{err}");
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
    ("budget.wall", true),
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
        all.extend(p.budget.wall);
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
fn metrics_listen_is_an_ip_address_and_port() {
    assert_eq!(parse("").map(|c| c.metrics_listen).ok(), Some(None));
    for (text, want) in [("127.0.0.1:9464", "127.0.0.1:9464"), ("[::1]:0", "[::1]:0")] {
        let c = parse(&format!("metrics_listen = \"{text}\"\n")).map(|c| c.metrics_listen);
        assert_eq!(
            c.ok().flatten().map(|a| a.to_string()).as_deref(),
            Some(want)
        );
    }
    for bad in [
        "localhost:9464",
        "127.0.0.1",
        ":9464",
        "127.0.0.1:99999",
        "",
    ] {
        let err = fails(
            &format!("\nmetrics_listen = \"{bad}\"\n"),
            2,
            "metrics_listen",
        );
        assert!(
            err.ends_with(&format!(
                "like \"127.0.0.1:9464\" or \"[::1]:9464\", got {bad:?}"
            )),
            "{err}"
        );
    }
    fails("metrics_listen = 9464\n", 1, "metrics_listen");
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
    assert!(err.contains("\"no\"; configured: codex, echo"), "{err}");
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
    let err = fails(
        &codex("budget = { tokens = 0 }"),
        3,
        "providers.codex.budget.tokens",
    );
    assert!(err.contains("must be at least 1"), "{err}");
    let err = fails(
        &codex("budget = { wall = \"0s\" }"),
        3,
        "providers.codex.budget.wall",
    );
    assert!(err.contains("longer than 0s"), "{err}");
    fails(
        &codex("budget = { tokens = -5 }"),
        3,
        "providers.codex.budget.tokens",
    );
    fails(
        &codex("budget = { dollars = 5 }"),
        3,
        "providers.codex.budget.dollars",
    );
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
fn env_file_is_an_absolute_path_or_a_systemd_credential_and_stays_local() {
    let c = parse(&codex("env_file = \"${CREDENTIALS_DIRECTORY}/openai\"")).unwrap();
    assert_eq!(
        c.providers["codex"].env_file,
        Some(env_file::EnvFile::Credential("openai".into()))
    );
    let c = parse(&codex("env_file = \"/etc/acpd/openai.env\"")).unwrap();
    assert_eq!(
        c.providers["codex"].env_file,
        Some(env_file::EnvFile::Path("/etc/acpd/openai.env".into()))
    );
    let err = fails(
        &codex("env_file = \"openai.env\""),
        3,
        "providers.codex.env_file",
    );
    assert!(err.contains("absolute"), "{err}");
    let err = fails(
        &codex("env_file = \"$HOME/openai.env\""),
        3,
        "providers.codex.env_file",
    );
    assert!(err.contains("only ${CREDENTIALS_DIRECTORY}"), "{err}");
    let err = fails(
        &codex("host = \"ssh://box\"\nenv_file = \"/etc/acpd/openai.env\""),
        1,
        "providers.codex.env_file",
    );
    assert!(err.contains("another"), "{err}");
}
