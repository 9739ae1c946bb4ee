use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::*;

fn ssh(url: &str, options: &[&str]) -> Remote {
    Remote {
        via: Via::Ssh {
            host: SshHost::parse(url).unwrap(),
            options: options.iter().map(|s| s.to_string()).collect(),
        },
        remote_acpd: "/opt/acpd bin/acpd".into(),
    }
}

#[test]
fn ssh_urls_parse_and_hostile_ones_do_not() {
    let h = SshHost::parse("ssh://deploy@build-1.example.com:2222").unwrap();
    assert_eq!(
        (h.user.as_deref(), h.host.as_str(), h.port),
        (Some("deploy"), "build-1.example.com", Some(2222))
    );
    assert_eq!(h.display(), "deploy@build-1.example.com:2222");
    let v6 = SshHost::parse("ssh://[::1]:22/").unwrap();
    assert_eq!((v6.host.as_str(), v6.port), ("::1", Some(22)));
    assert_eq!(v6.display(), "[::1]:22");
    assert_eq!(SshHost::parse("ssh://box").unwrap().port, None);
    for bad in [
        "box",
        "http://box",
        "ssh://",
        "ssh://-oProxyCommand=sh",
        "ssh://-l@box",
        "ssh://a b",
        "ssh://box;id",
        "ssh://box:0",
        "ssh://box:99999",
        "ssh://box:x",
        "ssh://@box",
        "ssh://[zz]",
        "ssh://[::1",
        "ssh://u$(id)@box",
        // Junk after a closed bracket used to be dropped.
        "ssh://[::1];x]",
        "ssh://[::1]x",
        "ssh://[::1]:22x",
        "ssh://[::1]:",
        "ssh://[:::]",
        "ssh://[1:2]",
        "ssh://[fe80::1%eth0]",
        "ssh://box:",
        "ssh://box:+22",
        "ssh://box:022",
        "ssh://box:22/x",
        "ssh://box//",
        "ssh://box?x",
        "ssh://box#x",
        "ssh://a..b",
        "ssh://.box",
        "ssh://box.-x",
        "ssh://a:b:c",
        "ssh://a@b@c",
        "ssh://b%6fx",
        "ssh://box\n",
        "ssh://b\u{f6}x",
    ] {
        assert!(SshHost::parse(bad).is_err(), "{bad} parsed");
    }
    for good in [
        "ssh://box.",
        "ssh://10.0.0.7:65535",
        "ssh://_svc.example.com",
        "ssh://u.ser_1-x@h-1:1/",
        "ssh://[2001:db8::7]",
        "ssh://[::ffff:10.0.0.1]:2222",
    ] {
        assert!(SshHost::parse(good).is_ok(), "{good} refused");
    }
}

proptest::proptest! {
    /// Whatever text is accepted is accounted for to the last character: it is exactly
    /// `ssh://` + what the parsed host displays (+ at most one `/`), so nothing was dropped.
    #[test]
    fn an_accepted_ssh_url_is_exactly_what_it_displays(
        text in "ssh://([a-z_.@:\\[\\];/0-9-]|ff|::){0,16}",
    ) {
        if let Ok(h) = SshHost::parse(&text) {
            let shown = format!("ssh://{}", h.display());
            proptest::prop_assert!(text == shown || text == format!("{shown}/"), "{text} shown as {shown}");
            proptest::prop_assert!(!h.host.starts_with('-'));
            proptest::prop_assert_eq!(SshHost::parse(&shown), Ok(h));
        }
    }

    /// Well-formed parts always parse, to those parts.
    #[test]
    fn well_formed_ssh_urls_parse_to_their_parts(
        user in proptest::option::of("[a-z_][a-z0-9_.-]{0,8}"),
        host in "[a-z0-9_][a-z0-9_-]{0,8}(\\.[a-z0-9_][a-z0-9_-]{0,8}){0,3}",
        port in proptest::option::of(1u16..),
    ) {
        let mut text = "ssh://".to_string();
        if let Some(u) = &user { text.push_str(&format!("{u}@")); }
        text.push_str(&host);
        if let Some(p) = port { text.push_str(&format!(":{p}")); }
        let h = SshHost::parse(&text).map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{text}: {e}")))?;
        proptest::prop_assert_eq!(h, SshHost { user, host, port });
    }
}

#[test]
fn ssh_argv_ends_options_before_the_host_and_quotes_the_far_command() {
    let r = ssh("ssh://root@127.0.0.1:2200", &["-F", "/t/ssh config"]);
    let argv = r.local_argv(&["agent".into(), "it's $(here)".into()]);
    assert_eq!(
        argv,
        [
            "ssh",
            "-T",
            "-o",
            "BatchMode=yes",
            "-F",
            "/t/ssh config",
            "-p",
            "2200",
            "-l",
            "root",
            "--",
            "127.0.0.1",
            "'/opt/acpd bin/acpd' supervise --setup-stdin -- agent 'it'\\''s $(here)'",
        ]
    );
}

#[test]
fn a_launcher_gets_the_far_command_as_words() {
    let r = Remote {
        via: Via::Launcher(vec![
            "kubectl".into(),
            "exec".into(),
            "-i".into(),
            "pod".into(),
            "--".into(),
        ]),
        remote_acpd: "acpd".into(),
    };
    assert_eq!(r.target(), "kubectl");
    let argv = r.local_argv(&["codex-acp".into(), "a b".into()]);
    assert_eq!(
        argv,
        [
            "kubectl",
            "exec",
            "-i",
            "pod",
            "--",
            "acpd",
            "supervise",
            "--setup-stdin",
            "--",
            "codex-acp",
            "a b"
        ]
    );
}

#[test]
fn secrets_travel_in_the_setup_line_not_in_argv_or_the_local_env() {
    let r = ssh("ssh://box", &[]);
    let env: Vec<(OsString, OsString)> = [
        ("PATH", "/near/bin"),
        ("HOME", "/near/home"),
        ("API_KEY", "sk-secret"),
        ("MODE", "fast"),
        ("ACPD_DEPTH", "1"),
        ("ACPD_MAX_DEPTH", "3"),
    ]
    .map(|(k, v)| (k.into(), v.into()))
    .to_vec();
    let provider_env = BTreeMap::from([("MODE".to_string(), "fast".to_string())]);
    let (spec, line) = r.wrap(
        &["agent".into()],
        PathBuf::from("/far/work"),
        &env,
        &provider_env,
        &["API_KEY".into()],
        (Duration::from_millis(1500), Duration::from_secs(2)),
    );
    assert!(!spec.argv.iter().any(|a| a.contains("sk-secret")));
    assert!(!spec.env.iter().any(|(_, v)| v == "sk-secret"));
    assert!(!spec.env.iter().any(|(k, _)| k == "MODE"));
    assert_eq!(spec.cwd, PathBuf::from("/"));
    let setup = Setup::parse(&line).unwrap();
    assert_eq!(line.last(), Some(&b'\n'));
    assert_eq!(setup.cwd, Some(PathBuf::from("/far/work")));
    let names: Vec<&str> = setup.env.keys().map(String::as_str).collect();
    // The near side's PATH and HOME are not the far side's.
    assert_eq!(names, ["ACPD_DEPTH", "ACPD_MAX_DEPTH", "API_KEY", "MODE"]);
    assert_eq!(
        setup.graces(),
        Some((Duration::from_millis(1500), Duration::from_secs(2)))
    );
}

#[test]
fn setup_lines_are_checked_and_errors_do_not_echo_them() {
    assert!(Setup::parse(b"{}\n").is_ok());
    let err = Setup::parse(b"{\"token\": \"sk-secret\"}").unwrap_err();
    assert!(!err.contains("sk-secret"), "{err}");
    assert!(
        Setup::parse(b"not json sk-secret")
            .unwrap_err()
            .contains("not JSON")
    );
    assert!(Setup::parse(br#"{"cwd":"relative"}"#).is_err());
    assert!(Setup::parse(br#"{"env":{"A=B":"x"}}"#).is_err());
    assert!(Setup::parse(br#"{"env":{"":"x"}}"#).is_err());
    assert!(Setup::parse(br#"{"env":{"A":"x\u0000y"}}"#).is_err());
    // Only an object with named keys, at every level: serde would take positional arrays.
    for positional in [
        &br#"["/tmp", {}, null]"#[..],
        br#"[]"#,
        br#"{"graces": [1, 2]}"#,
        br#"null"#,
        br#""x""#,
    ] {
        let err = Setup::parse(positional).unwrap_err();
        assert!(err.contains("bad setup line"), "{err}");
    }
    let g = Setup::parse(br#"{"graces": {"eofMs": 2592000000, "termMs": 1}}"#).unwrap();
    assert_eq!(g.graces().unwrap().0, crate::durations::CEILING);
    let err =
        Setup::parse(br#"{"graces": {"eofMs": 18446744073709551615, "termMs": 1}}"#).unwrap_err();
    assert!(err.contains("ceiling of 30days"), "{err}");
}
