//! Authentication and honest failures end to end, against the real echo agent: the provider's
//! `auth_method` replayed after `initialize` (and refused when the agent does not advertise
//! it), −32000 at `session/new` and at `session/prompt` as category `auth` naming the
//! advertised method ids, AIR's typed session-failure record on an `end_turn` as an `error`
//! with the record's category (acpd opts in for its runs; a bridge session passes the record on
//! and logs it), and `acpd doctor` on auth.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic

use crate::common;

use common::raw::Raw;
use common::*;
use serde_json::{Value, json};

fn echo(flags: &[&str]) -> String {
    let mut argv = vec![BIN.to_string(), "agent".into(), "echo".into()];
    argv.extend(flags.iter().map(|f| f.to_string()));
    let argv: Vec<String> = argv
        .iter()
        .map(|a| serde_json::to_string(a).unwrap())
        .collect();
    format!("[{}]", argv.join(", "))
}

/// A config with one provider `p` running the echo with `flags`, plus `extra` keys.
fn env(flags: &[&str], extra: &str) -> Env {
    Env::raw(&format!(
        "default_provider = \"p\"\n[providers.p]\ncommand = {}\n{extra}\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        echo(flags)
    ))
}

fn run(env: &Env, prompt: &str) -> (Value, i32, String) {
    run_json(
        env.acpd()
            .args(["run", "--json", "--provider", "p", prompt]),
    )
}

fn category(v: &Value) -> &str {
    v["failure"]["category"].as_str().unwrap_or("-")
}

fn diagnostic(v: &Value) -> &str {
    v["diagnostic"].as_str().unwrap_or("")
}

#[test]
fn auth_method_is_replayed_after_initialize() {
    let env = env(
        &["--auth", "other", "--auth", "key"],
        "auth_method = \"key\"",
    );
    let (v, code, stderr) = run(&env, ":auth");
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(v["stopReason"], "completed");
    assert_eq!(output_text(&v), "auth key\n");
}

#[test]
fn an_unadvertised_auth_method_is_start_failed_naming_the_advertised_ids() {
    let env = env(
        &["--auth", "key", "--auth", "other"],
        "auth_method = \"nope\"",
    );
    let (v, code, _) = run(&env, "hi");
    assert_eq!(code, 7, "{v}");
    assert_eq!(v["error"]["name"], "START_FAILED");
    let msg = v["error"]["message"].as_str().unwrap();
    for want in [
        "stage: initialize",
        "category: auth",
        "auth methods: key, other",
        "configured auth_method: nope",
        "not advertised",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
}

#[test]
fn auth_required_at_session_new_names_the_advertised_methods() {
    let env = env(&["--auth", "key", "--auth", "other"], "");
    let (v, code, _) = run(&env, "hi");
    assert_eq!(code, 7, "{v}");
    assert_eq!(v["error"]["name"], "START_FAILED");
    let d = v["error"]["message"].as_str().unwrap();
    for want in [
        "stage: session-new",
        "category: auth",
        "error code: -32000",
        "auth methods: key, other",
    ] {
        assert!(d.contains(want), "{want}: {d}");
    }
    // The agent's own message never rides along.
    assert!(!d.contains("Authentication required"), "{d}");
}

#[test]
fn auth_required_at_prompt_is_an_auth_result_naming_the_methods() {
    let env = env(&["--auth", "key"], "auth_method = \"key\"");
    let (v, code, _) = run(&env, "MARKER\n:error -32000 token expired");
    assert_eq!(code, 7, "{v}");
    assert_eq!(
        (v["stopReason"].as_str(), category(&v)),
        (Some("error"), "auth")
    );
    let d = diagnostic(&v);
    assert!(
        d.contains("auth methods: key") && d.contains("error code: -32000"),
        "{d}"
    );
    assert!(!d.contains("token expired") && !d.contains("MARKER"), "{d}");
}

#[test]
fn an_air_session_failure_on_end_turn_is_an_error_with_its_category() {
    let env = env(&["--air"], "");
    let (v, code, _) = run(&env, "MARKER partial\n:air-failure limit");
    assert_eq!(code, 1, "{v}");
    assert_eq!(
        (v["stopReason"].as_str(), category(&v)),
        (Some("error"), "limit")
    );
    assert_eq!(output_text(&v), "MARKER partial\n", "partial output kept");
    let d = diagnostic(&v);
    assert!(
        d.contains("category: limit") && d.contains("stop reason: end_turn"),
        "{d}"
    );
    // The record's title is the agent's text: never in the diagnostic.
    assert!(
        !d.contains("scripted failure") && !d.contains("MARKER"),
        "{d}"
    );
    // A turn without a record is still a success.
    let (v, code, _) = run(&env, "fine");
    assert_eq!((code, v["stopReason"].as_str()), (0, Some("completed")));
}

#[test]
fn an_air_access_failure_is_an_auth_result_naming_the_methods() {
    // claude-agent-acp reports a sign-in failure as AIR category `access` (action `login`).
    let env = env(&["--air", "--auth", "key"], "auth_method = \"key\"");
    let (v, code, _) = run(&env, ":air-failure access");
    assert_eq!(code, 7, "{v}");
    assert_eq!(
        (v["stopReason"].as_str(), category(&v)),
        (Some("error"), "auth")
    );
    assert!(diagnostic(&v).contains("auth methods: key"), "{v}");
}

#[test]
fn an_agent_without_air_support_keeps_its_plain_error() {
    // The echo without --air ignores the opt-in, as any agent that does not know AIR does.
    let env = env(&[], "");
    let (v, _, _) = run(&env, ":air-failure limit");
    assert_eq!(
        (v["stopReason"].as_str(), category(&v)),
        (Some("error"), "rpc")
    );
    assert_eq!(v["failure"]["code"], -32603);
}

/// `acpd stdio` as an editor with `caps`; returns the connection and a session of `p`.
fn bridge(env: &Env, caps: Value) -> (Raw, String) {
    let mut raw = Raw::stdio(env);
    let init = raw.initialize(caps);
    assert!(init.is_object(), "initialize failed; log: {}", raw.log());
    let session = raw.new_session(env.path(), "p");
    (raw, session)
}

fn prompt(raw: &mut Raw, session: &str, text: &str) -> Value {
    raw.call(
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    )
}

#[test]
fn a_bridge_session_passes_an_air_record_on_and_logs_it() {
    let env = env(&["--air"], "");
    let air = json!({"_meta": {"jetbrains": {"air": {"version": 1, "capabilities": ["sessionFailure"]}}}});
    let (mut raw, session) = bridge(&env, air);
    let answer = prompt(&mut raw, &session, ":air-failure service");
    let result = &answer["result"];
    assert_eq!(result["stopReason"], "end_turn", "{answer}");
    assert_eq!(
        result["_meta"]["jetbrains"]["air"]["sessionFailure"]["category"], "service",
        "the editor gets the record as the agent sent it: {answer}"
    );
    assert!(
        eventually(std::time::Duration::from_secs(5), || raw
            .log()
            .contains("the agent reported a failed turn")),
        "log: {}",
        raw.log()
    );
    let log = raw.log();
    assert!(log.contains("category: service"), "{log}");
    assert!(
        !log.contains("scripted failure"),
        "the record's title stays out: {log}"
    );
}

#[test]
fn a_bridge_session_is_never_opted_in_behind_its_editors_back() {
    // An editor that does not read AIR records keeps getting the agent's plain error, not an
    // end_turn it would show as success.
    let env = env(&["--air"], "");
    let (mut raw, session) = bridge(&env, json!({}));
    let answer = prompt(&mut raw, &session, ":air-failure service");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
}

#[test]
fn doctor_shows_auth_methods_and_a_configured_method_that_is_not_advertised() {
    let env = Env::raw(&format!(
        "default_provider = \"keyed\"\n\
         [providers.keyed]\ncommand = {}\nauth_method = \"key\"\n\
         [providers.wrong]\ncommand = {}\nauth_method = \"nope\"\n\
         [providers.open]\ncommand = {}\n",
        echo(&["--auth", "key"]),
        echo(&["--auth", "key"]),
        echo(&[]),
    ));
    let out = env.acpd().args(["doctor", "keyed"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{text}");
    assert!(
        text.contains("keyed: OK")
            && text.contains("auth methods: key; auth_method key is advertised"),
        "{text}"
    );
    assert!(!text.contains("unknown"), "{text}");
    let out = env.acpd().args(["doctor", "wrong"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 1, "{text}");
    assert!(
        text.contains("wrong: FAIL") && text.contains("auth_method nope is NOT advertised"),
        "{text}"
    );
    let out = env.acpd().args(["doctor", "open"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("open: OK") && text.contains("auth methods: none advertised"),
        "{text}"
    );
}
