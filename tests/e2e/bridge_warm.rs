#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Warm spares and the directory a child runs in (issue 30). Some agents find a session by
//! their process's working directory rather than by the `cwd` a request names: gemini-cli's
//! `session/load` run anywhere else answers "No previous sessions found for this project". The
//! echo agent does the same when its `--sessions` directory is relative (it resolves against
//! its own cwd), so a session it made in a project can only be loaded by an echo started
//! there — as a new `acpd stdio` with `warm = 1` must do, wherever its spares were started.
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use common::raw::*;
use common::*;
use serde_json::json;

/// `main`: the echo keeping its sessions under `.echo-sessions/` of its own cwd, asking for
/// `authenticate` (as gemini-cli does) and keeping one warm spare.
fn env() -> Env {
    let toml = format!(
        "default_provider = \"main\"\n[providers.main]\ncommand = [{bin:?}, \"agent\", \"echo\", \
         \"--sessions\", \".echo-sessions\", \"--auth\", \"key\"]\nwarm = 1\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        bin = BIN
    );
    let env = Env::raw(&toml);
    for d in ["project", "home", "elsewhere"] {
        std::fs::create_dir_all(env.path().join(d)).unwrap();
    }
    env
}

/// `acpd stdio` started in `cwd` (where an editor started it) with `HOME` under the env,
/// initialized and authenticated.
fn stdio_in(env: &Env, cwd: &Path, log: &str) -> Raw {
    let mut cmd = env.acpd();
    cmd.arg("stdio")
        .current_dir(cwd)
        .env("HOME", env.path().join("home"));
    let mut raw = Raw::process(cmd, &env.path().join(log));
    assert!(raw.initialize(json!({})).is_object(), "{}", raw.log());
    raw.ok("authenticate", json!({"methodId": "key"}));
    raw
}

/// Waits (bounded) until the pool of `main` holds a ready spare.
fn until_spare(raw: &mut Raw) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while raw.ok("_acpd/status", json!({}))["spares"]["main"].as_u64() != Some(1) {
        assert!(Instant::now() < deadline, "no spare; log: {}", raw.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn end(mut raw: Raw) {
    raw.close_write();
    assert!(
        raw.drain_to_eof(Duration::from_secs(10)),
        "acpd stdio did not end after EOF"
    );
}

/// The texts of the `session/update`s among `lines` under `session`.
fn replayed(lines: &[Line], session: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l.method() == "session/update")
        .filter(|l| l.value["params"]["sessionId"] == session)
        .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
        .map(str::to_string)
        .collect()
}

/// A session made through acpd in a project, then loaded by a new `acpd stdio` (started
/// elsewhere, as an editor may start it) whose warm spare is ready: the load runs in the
/// project, so the agent finds its session and replays it. Before the fix the load was
/// handed the spare started in acpd's cwd and the agent found no such session.
#[test]
fn a_load_after_a_restart_with_warm_spares_runs_in_the_sessions_cwd() {
    let env = env();
    let project = env.path().join("project").canonicalize().unwrap();
    let elsewhere = env.path().join("elsewhere").canonicalize().unwrap();

    let mut first = stdio_in(&env, &project, "first.log");
    let session = first.new_session(&project, "main");
    let id = first.send_prompt(&session, "remember me");
    let answer = first.answer(&json!(id));
    assert_eq!(
        answer.value["result"]["stopReason"],
        "end_turn",
        "{}",
        answer.text()
    );
    end(first);
    assert!(
        project.join(".echo-sessions").is_dir(),
        "the session's agent ran in the project"
    );

    let mut second = stdio_in(&env, &elsewhere, "second.log");
    until_spare(&mut second);
    let start = second.seen.len();
    let loaded = second.call(
        "session/load",
        json!({"sessionId": session, "cwd": project, "mcpServers": []}),
    );
    assert!(
        loaded.get("result").is_some(),
        "the load failed: {loaded}; log: {}",
        second.log()
    );
    let texts = replayed(&second.seen[start..], &session);
    assert!(
        texts.iter().any(|t| t.contains("remember me")),
        "no replay of the session: {texts:?}"
    );
    end(second);
}
