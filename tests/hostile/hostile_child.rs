//! Issue 8, "Strict toward children" and the child half of "Bounded, with deadlines": a
//! scripted hostile child (the echo agent's hostile directives) behind the real `acpd`, driven
//! through `acpd run --json`, delegated runs and bridge sessions under `acpd stdio`, over real
//! pipes. Each test asserts what the parent (a user) would see, per /work/notes/contract.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::raw::*;
use common::*;
use serde_json::{Value, json};

/// Fast graces, a long keep-alive (follow-up turns), and `top` as top-level keys.
fn env_with(top: &str) -> Env {
    Env::raw(&format!(
        "{top}\n[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
         keep_alive = \"600s\"\n"
    ))
}

/// The graces of `env_with` summed, plus slack for a loaded 2-core machine.
const LADDER: Duration = Duration::from_millis(900 + 5000);

fn acpd_run(env: &Env, prompt: &str) -> Value {
    let (value, _code, stderr) =
        run_json(
            env.acpd()
                .args(["run", "--json", "--provider", "fast", prompt]),
        );
    assert!(
        value.get("error").is_none(),
        "run failed: {value}\n{stderr}"
    );
    value
}

fn verdict(result: &Value) -> (String, String) {
    (
        result["stopReason"].as_str().unwrap_or("?").to_string(),
        result["failure"]["category"]
            .as_str()
            .unwrap_or("-")
            .to_string(),
    )
}

fn ready(env: &Env) -> Raw {
    let mut raw = Raw::stdio(env);
    raw.initialize(json!({}));
    raw
}

/// Prompts a bridge session and returns the answer, answering any permission request acpd
/// forwards with `cancelled` (the count of those comes back too).
fn prompt_answering(raw: &mut Raw, session: &str, text: &str) -> (Value, usize) {
    let id = json!(raw.send_prompt(session, text));
    let mut forwarded = 0;
    let deadline = Instant::now() + ANSWER;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = raw
            .next_within(left)
            .unwrap_or_else(|| panic!("no answer to the prompt; seen {:?}", raw.seen_text()));
        if line.is_response() && line.value["id"] == id {
            return (line.value, forwarded);
        }
        if line.is_request() && line.method() == "session/request_permission" {
            forwarded += 1;
            let reply = json!({"jsonrpc": "2.0", "id": line.value["id"],
                "result": {"outcome": {"outcome": "cancelled"}}});
            raw.line(&reply.to_string());
        }
        raw.seen.push(line);
    }
}

// ---- A bad line fails the turn, also right before the answer ----------------------------

#[test]
fn bad_line_right_before_the_answer_fails_every_run() {
    let env = env_with("");
    let verdicts: Vec<(String, String)> = (0..30)
        .map(|_| verdict(&acpd_run(&env, ":garbage-then-stop")))
        .collect();
    let failed = verdicts
        .iter()
        .filter(|v| *v == &("error".to_string(), "protocol".to_string()))
        .count();
    assert_eq!(
        failed, 30,
        "only {failed} of 30 runs failed with category protocol: {verdicts:?}"
    );
}

#[test]
fn bad_line_right_before_the_answer_fails_every_delegated_run() {
    let env = env_with("");
    let mut raw = ready(&env);
    let mut verdicts = Vec::new();
    for _ in 0..30 {
        let run = raw.start_run("fast", ":garbage-then-stop");
        verdicts.push(verdict(&raw.wait_run(&run)));
        raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
    }
    let failed = verdicts
        .iter()
        .filter(|v| *v == &("error".to_string(), "protocol".to_string()))
        .count();
    assert_eq!(
        failed, 30,
        "only {failed} of 30 delegated runs failed with category protocol: {verdicts:?}"
    );
}

#[test]
fn every_kind_of_bad_line_fails_the_run() {
    let env = env_with("");
    // Not JSON, not UTF-8, over the default 16 MiB line cap: each just before the answer.
    let mut verdicts = Vec::new();
    for prompt in [
        "x\n:garbage",
        "x\n:binary",
        "x\n:oversize 17000000",
        ":garbage-then-stop",
    ] {
        for _ in 0..3 {
            verdicts.push((prompt, verdict(&acpd_run(&env, prompt))));
        }
    }
    let wrong: Vec<_> = verdicts
        .iter()
        .filter(|(_, v)| v != &("error".to_string(), "protocol".to_string()))
        .collect();
    assert!(
        wrong.is_empty(),
        "runs that did not fail with protocol: {wrong:?}"
    );
}

#[test]
fn bad_line_right_before_the_answer_fails_every_bridge_turn() {
    let env = env_with("");
    let mut outcomes = Vec::new();
    let mut survivors = Vec::new();
    // 3 connections of 10 sessions: below max_sessions_per_connection however ended sessions
    // are counted.
    for _ in 0..3 {
        let mut raw = ready(&env);
        for _ in 0..10 {
            let sid = raw.new_session(env.path(), "fast");
            let id = json!(raw.send_prompt(&sid, ":pid\n:garbage-then-stop"));
            let answer = raw.answer(&id).value;
            let pid = pid_after(&raw.chunk_text(&sid), "pid ");
            let error = &answer["error"];
            outcomes.push(format!(
                "{} {} {}",
                error["code"], error["data"]["category"], error["data"]["provider"]
            ));
            // The session ended: its child is torn down and the session is gone.
            if !gone_within(pid, LADDER) {
                survivors.push(pid);
            }
            let again = raw.call(
                "session/prompt",
                json!({"sessionId": sid, "prompt": [{"type": "text", "text": "again"}]}),
            );
            assert!(
                again.get("error").is_some(),
                "a prompt after the protocol failure was served: {again}"
            );
        }
    }
    let good = outcomes
        .iter()
        .filter(|o| *o == "-32603 \"protocol\" \"fast\"")
        .count();
    assert_eq!(
        good, 30,
        "only {good} of 30 bridge turns failed with -32603 category protocol: {outcomes:?}"
    );
    assert!(
        survivors.is_empty(),
        "children outlived their session: {survivors:?}"
    );
}

// ---- Updates between turns are dropped -----------------------------------------------------

#[test]
fn updates_after_an_answer_never_reach_the_next_turn() {
    let env = env_with("");
    let mut raw = ready(&env);
    let run = raw.start_run("fast", "turn 1\n:after-answer LATE 1");
    let mut outputs = vec![output_text(&raw.wait_run(&run))];
    for turn in 2..=5 {
        let sent = raw.ok(
            "_acpd/subagent/send",
            json!({"runId": run, "prompt": [{"type": "text",
                "text": format!("turn {turn}\n:after-answer LATE {turn}")}]}),
        );
        assert_eq!(sent["turn"], turn);
        outputs.push(output_text(&raw.wait_run(&run)));
    }
    let expected: Vec<String> = (1..=5).map(|t| format!("turn {t}\n")).collect();
    assert_eq!(
        outputs, expected,
        "updates sent after a turn's answer leaked into the output"
    );
}

// ---- A child never emits _acpd/* ------------------------------------------------------------

const FORGERIES: &str = "before\n:forge-acpd\n:notify _acpd/subagent/started\n\
                         :notify _acpd/anything\nafter";

#[test]
fn forged_acpd_notifications_never_leave_a_bridge_session() {
    let env = env_with("");
    let mut raw = ready(&env);
    let sid = raw.new_session(env.path(), "fast");
    let id = json!(raw.send_prompt(&sid, FORGERIES));
    let answer = raw.answer(&id).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // A round trip after the answer, so anything forwarded late is in `seen` too.
    raw.ok("_acpd/providers", json!({}));
    let forged: Vec<String> = raw
        .seen
        .iter()
        .filter(|l| l.method().starts_with("_acpd/"))
        .map(Line::text)
        .collect();
    assert!(
        forged.is_empty(),
        "the child's _acpd/* reached the parent: {forged:?}"
    );
    assert_eq!(raw.chunk_text(&sid), "before\nafter");
}

#[test]
fn forged_acpd_notifications_never_leave_a_delegated_run() {
    let env = env_with("");
    let mut raw = ready(&env);
    let run = raw.start_run("fast", FORGERIES);
    let result = raw.wait_run(&run);
    assert_eq!(output_text(&result), "before\nafter", "{result}");
    raw.ok("_acpd/providers", json!({}));
    let forged: Vec<String> = raw
        .seen
        .iter()
        .filter(|l| l.method().starts_with("_acpd/"))
        .filter(|l| l.value["params"]["runId"] != run.as_str() || l.text().contains("forged"))
        .map(Line::text)
        .collect();
    assert!(
        forged.is_empty(),
        "the child's _acpd/* reached the parent: {forged:?}"
    );
    let methods: Vec<&str> = raw.seen.iter().map(Line::method).collect();
    assert_eq!(
        methods,
        ["_acpd/subagent/started", "_acpd/subagent/ended"],
        "exactly acpd's own pair"
    );
}

#[test]
fn a_bridge_childs_notifications_pass_under_the_parents_session_id_but_acpds_own() {
    let env = env_with("");
    let mut raw = ready(&env);
    let sid = raw.new_session(env.path(), "fast");
    let id = json!(raw.send_prompt(
        &sid,
        ":notify weird/method\n:notify _vendor/ping\n:notify _acpd/subagent/ended\nend"
    ));
    raw.answer(&id);
    raw.ok("_acpd/providers", json!({}));
    // A transparent bridge forwards what it does not know (the editor ignores what it does
    // not know), with the session id remapped; only acpd's own namespace is refused.
    for method in ["weird/method", "_vendor/ping"] {
        let line = raw.seen.iter().find(|l| l.method() == method);
        let line = line.unwrap_or_else(|| panic!("{method} was not forwarded"));
        assert_eq!(
            line.value["params"],
            json!({"sessionId": sid, "acpdProbe": true}),
            "{}",
            line.text()
        );
    }
    assert!(
        raw.seen.iter().all(|l| !l.method().starts_with("_acpd/")),
        "a child's _acpd/ notification was forwarded: {:?}",
        raw.seen_text()
    );
}

// ---- A forwarded or collected update carries exactly the child's own sessionId -------------

const WRONG_SESSIONS: [&str; 3] = ["foreign-session", "no-session", "dup-session"];

#[test]
fn updates_with_a_wrong_session_id_never_reach_the_parent() {
    let env = env_with("");
    let mut raw = ready(&env);
    let a = raw.new_session(env.path(), "fast");
    let b = raw.new_session(env.path(), "fast");
    // The child of A learns B's id and writes into it, and into a session it does not own.
    let script = format!(
        "a\n:foreign-session {b}\n:foreign-session echo-2\n:no-session\n\
         :dup-session {b}\n:dup-session\nz"
    );
    let id = json!(raw.send_prompt(&a, &script));
    let answer = raw.answer(&id).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let id = json!(raw.send_prompt(&b, "b"));
    raw.answer(&id);
    let leaked: Vec<String> = raw
        .seen
        .iter()
        .map(Line::text)
        .filter(|t| WRONG_SESSIONS.iter().any(|w| t.contains(w)))
        .collect();
    assert!(
        leaked.is_empty(),
        "updates under a wrong sessionId reached the parent: {leaked:?}"
    );
    assert_eq!(raw.chunk_text(&a), "a\nz");
    assert_eq!(raw.chunk_text(&b), "b");
}

const WRONG_SESSION_SCRIPT: &str = "a\n:foreign-session echo-2\n:no-session\n:dup-session\nz";

#[test]
fn updates_with_a_wrong_session_id_never_enter_acpd_run_output() {
    let env = env_with("");
    let result = acpd_run(&env, WRONG_SESSION_SCRIPT);
    assert_eq!(output_text(&result), "a\nz", "{result}");
}

#[test]
fn updates_with_a_wrong_session_id_never_enter_a_delegated_run() {
    let env = env_with("");
    let mut raw = ready(&env);
    let run = raw.start_run("fast", WRONG_SESSION_SCRIPT);
    let result = raw.wait_run(&run);
    assert_eq!(output_text(&result), "a\nz", "{result}");
    let leaked: Vec<String> = raw
        .seen
        .iter()
        .map(Line::text)
        .filter(|t| WRONG_SESSIONS.iter().any(|w| t.contains(w)))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
}

// ---- A malformed permission request is -32602 where acpd answers or asks itself ------------

const BAD_PERMISSION_ANSWER: &str = "permission: error -32602\n";

#[test]
fn malformed_permission_request_is_invalid_params_in_acpd_run() {
    let env = env_with("");
    let result = acpd_run(&env, ":bad-permission");
    assert_eq!(output_text(&result), BAD_PERMISSION_ANSWER, "{result}");
}

/// A bridge session's editor reads the request itself (acpd only checks it names the
/// session), as it would from the agent directly: asked once, and its answer reaches the child.
/// A policy that answers by itself must read it, and refuses it.
#[test]
fn malformed_permission_request_goes_to_a_bridge_editor_as_it_would_directly() {
    for (policy, expected, asked) in [
        ("forward", "permission: cancelled\n", 1),
        ("allow", BAD_PERMISSION_ANSWER, 0),
    ] {
        let env = Env::raw(&format!(
            "[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             permission = \"{policy}\"\n"
        ));
        let mut raw = ready(&env);
        let sid = raw.new_session(env.path(), "fast");
        let (answer, forwarded) = prompt_answering(&mut raw, &sid, ":bad-permission");
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        assert_eq!(
            (raw.chunk_text(&sid).as_str(), forwarded),
            (expected, asked),
            "{policy}: what the child got back, and how often acpd forwarded the request to \
             the parent"
        );
    }
}

#[test]
fn malformed_permission_request_is_invalid_params_in_a_delegated_run() {
    let env = env_with("");
    // A parent that advertises subagent sessions, so there is someone acpd could ask.
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({"subagents": {}}));
    let parent = raw.new_session(env.path(), "fast");
    let r = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "fast", "parentSessionId": parent,
               "prompt": [{"type": "text", "text": ":bad-permission"}]}),
    );
    let run = r["runId"].as_str().unwrap().to_string();
    let wait = json!(raw.send("_acpd/subagent/wait", json!({"runId": run})));
    let mut forwarded = 0;
    let result = loop {
        let line = raw.next();
        if line.is_response() && line.value["id"] == wait {
            break line.value["result"].clone();
        }
        if line.is_request() && line.method() == "session/request_permission" {
            forwarded += 1;
            let reply = json!({"jsonrpc": "2.0", "id": line.value["id"],
                "result": {"outcome": {"outcome": "cancelled"}}});
            raw.line(&reply.to_string());
        }
    };
    assert_eq!(
        (output_text(&result).as_str(), forwarded),
        (BAD_PERMISSION_ANSWER, 0),
        "{result}"
    );
}

// ---- Writes toward a child have a deadline --------------------------------------------------

#[test]
fn a_child_that_stops_reading_fails_its_turn_hung_after_write_timeout() {
    let env = env_with("write_timeout = \"2s\"");
    let mut raw = ready(&env);
    let run = raw.start_run("fast", ":deaf-stdin\nready");
    assert_eq!(output_text(&raw.wait_run(&run)), "ready");
    // A follow-up prompt far larger than a pipe buffer: acpd's write to the child blocks.
    let big = "y".repeat(4 << 20);
    let started = Instant::now();
    raw.ok(
        "_acpd/subagent/send",
        json!({"runId": run, "prompt": [{"type": "text", "text": big}]}),
    );
    let result = raw.wait_run(&run);
    let took = started.elapsed();
    assert_eq!(
        verdict(&result),
        ("error".into(), "hung".into()),
        "{result}"
    );
    assert!(took < Duration::from_secs(2) + LADDER, "took {took:?}");
}

/// A bridge child that stops reading stdin while the parent pushes ~200 MiB of prompts into
/// its session: every queue on the way is bounded, so acpd's memory stays far below the volume,
/// and past `write_timeout` the child is gone and the parent gets errors, not silence.
#[test]
fn deaf_bridge_child_under_a_prompt_flood_keeps_acpd_bounded() {
    const PROMPTS: u64 = 800;
    const SIZE: usize = 256 * 1024; // 800 × 256 KiB = 200 MiB
    const BOUND_KIB: u64 = 100 * 1024;
    subreaper();
    let env = env_with("write_timeout = \"2s\"");
    let mut raw = ready(&env);
    let acpd = raw.pid();
    let sid = raw.new_session(env.path(), "fast");
    let id = json!(raw.send_prompt(&sid, ":pid\n:deaf-stdin\nok"));
    let answer = raw.answer(&id).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let child = pid_after(&raw.chunk_text(&sid), "pid ");

    let mut writer = raw.take_writer();
    let text = "x".repeat(SIZE);
    let flood = std::thread::spawn(move || {
        for n in 1..=PROMPTS {
            let msg = json!({"jsonrpc": "2.0", "id": n, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}});
            let mut line = msg.to_string().into_bytes();
            line.push(b'\n');
            if writer.write_all(&line).is_err() {
                return (n - 1, None);
            }
        }
        (PROMPTS, Some(writer))
    });
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    let (mut errors, mut results, mut first_error) = (0u64, 0u64, None);
    while errors + results < PROMPTS && Instant::now() < deadline {
        let Some(line) = raw.next_within(Duration::from_millis(500)) else {
            if raw.eof {
                break;
            }
            continue;
        };
        let id = line.value["id"].as_u64();
        if line.is_response() && id.is_some_and(|n| (1..=PROMPTS).contains(&n)) {
            if line.value.get("error").is_some() {
                errors += 1;
                first_error.get_or_insert(started.elapsed());
            } else {
                results += 1;
            }
        }
    }
    let peak = peak_kib(acpd);
    eprintln!(
        "acpd peak {peak} KiB; {errors} errors, {results} results; first error after \
         {first_error:?}"
    );
    assert!(
        peak < BOUND_KIB,
        "acpd peaked at {peak} KiB under the flood"
    );
    assert_eq!(
        (errors, results),
        (PROMPTS, 0),
        "every prompt into the deaf child's session is answered with an error"
    );
    let first = first_error.unwrap_or(Duration::MAX);
    assert!(
        first < Duration::from_secs(2) + LADDER,
        "first error only after {first:?}"
    );
    assert!(
        gone_within(child, LADDER),
        "the deaf child {child} is still alive"
    );
    assert!(
        eventually(Duration::from_secs(30), || flood.is_finished()),
        "acpd stopped taking the parent's bytes"
    );
    let (pushed, writer) = flood.join().unwrap();
    assert_eq!(pushed, PROMPTS, "acpd hung up on the parent mid-flood");
    drop(writer);
}

// ---- A key written twice on the routing path never reaches a parent (issue 18) -------------

/// A child agent that, on each prompt, writes updates that say one thing to a reader taking a
/// key's first value and another to one taking its last (the prompt's text is another
/// session's id, which it writes second), then one honest chunk `ok`.
const DOUBLING_CHILD: &str = r#"
import sys, json
def send(o):
    sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
def chunk(t):
    return '{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%s"}}' % t
n = 0
for line in sys.stdin:
    m = json.loads(line)
    meth, i = m.get("method"), m.get("id")
    if meth == "initialize":
        send({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}})
    elif meth == "session/new":
        n += 1
        send({"jsonrpc": "2.0", "id": i, "result": {"sessionId": "own-%d" % n}})
    elif meth == "session/prompt":
        own, other = m["params"]["sessionId"], m["params"]["prompt"][0]["text"]
        for params in [
            '{"sessionId":"%s","update":%s,"sessionId":"%s"}' % (own, chunk("LEAK-top"), other),
            '{"sessionId":"%s","session\\u0049d":"%s","update":%s}' % (own, other, chunk("LEAK-escaped")),
            '{"sessionId":"%s","update":%s,"update":%s}' % (own, chunk("LEAK-first"), chunk("LEAK-second")),
            '{"sessionId":"%s","update":{"sessionUpdate":"agent_message_chunk","sessionUpdate":"subagent_update","sessionId":"%s","content":{"type":"text","text":"LEAK-kind"}}}' % (own, other),
            '{"sessionId":"%s","update":{"sessionUpdate":"session_message","senderSessionId":"x","senderSessionId":"%s","text":"LEAK-nested"}}' % (own, other),
            '{"sessionId":"%s","update":%s}' % (own, chunk("ok")),
        ]:
            sys.stdout.write('{"jsonrpc":"2.0","method":"session/update","params":%s}\n' % params)
        sys.stdout.flush()
        send({"jsonrpc": "2.0", "id": i, "result": {"stopReason": "end_turn"}})
"#;

fn doubling_env() -> Env {
    let env = env_with("");
    let script = env.path().join("doubling.py");
    std::fs::write(&script, DOUBLING_CHILD).unwrap();
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str(&format!(
        "\n[providers.doubling]\ncommand = [\"python3\", \"{}\"]\n",
        script.display()
    ));
    std::fs::write(&env.config, config).unwrap();
    env
}

#[test]
fn doubled_routing_keys_from_a_bridge_child_never_reach_the_parent() {
    let env = doubling_env();
    let mut raw = ready(&env);
    let a = raw.new_session(env.path(), "doubling");
    let b = raw.new_session(env.path(), "doubling");
    let id = json!(raw.send_prompt(&a, &b));
    let answer = raw.answer(&id).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let id = json!(raw.send_prompt(&b, &a));
    raw.answer(&id);
    let leaked: Vec<String> = raw
        .seen
        .iter()
        .map(Line::text)
        .filter(|t| t.contains("LEAK"))
        .collect();
    assert!(
        leaked.is_empty(),
        "updates with a doubled routing key reached the parent: {leaked:?}"
    );
    assert_eq!(raw.chunk_text(&a), "ok");
    assert_eq!(raw.chunk_text(&b), "ok");
}

#[test]
fn doubled_routing_keys_from_a_child_never_enter_a_run() {
    let env = doubling_env();
    let (value, _code, stderr) =
        run_json(
            env.acpd()
                .args(["run", "--json", "--provider", "doubling", "another-session"]),
        );
    assert_eq!(output_text(&value), "ok", "{value}\n{stderr}");
}

/// An agent that lists sessions, but answers `session/list` with an error whose message holds
/// a CR, a vertical tab, a NUL, a C1 CSI and a newline, each followed by forged text.
const CONTROL_ERRORS: &str = r#"import json, sys
def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    i, meth = m["id"], m["method"]
    if meth == "initialize":
        out({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1, "authMethods": [],
             "agentCapabilities": {"sessionCapabilities": {"list": {}}}}})
    else:
        out({"jsonrpc": "2.0", "id": i, "error": {"code": -32603,
             "message": "boom\rFORGED-CR\u000bFORGED-VT\u0000NUL\u009b2JCSI\nFORGED-LINE"}})
"#;

/// Hostile review of issue 18: acpd's own log printed an agent's error message raw, so a CR
/// in it returned the terminal's cursor and the agent overwrote the log line (and a newline
/// forged a line of its own). Every control character but ESC and tab reaches the log escaped.
#[test]
fn an_agents_control_characters_reach_the_log_escaped() {
    let env = Env::raw("");
    let script = env.path().join("controls.py");
    std::fs::write(&script, CONTROL_ERRORS).unwrap();
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"c\"\n[providers.c]\ncommand = [\"python3\", \"{}\"]\n",
            script.display()
        ),
    )
    .unwrap();
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let listed = raw.ok("session/list", json!({}));
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    // The warning was written before the answer went out.
    let log = raw.log();
    let line = log
        .lines()
        .find(|l| l.contains("boom"))
        .unwrap_or_else(|| panic!("no warning with the agent's message: {log:?}"));
    for forged in [
        "\\rFORGED-CR",
        "\\u{b}FORGED-VT",
        "\\u{0}NUL",
        "\\u{9b}2JCSI",
        "\\nFORGED-LINE",
    ] {
        assert!(line.contains(forged), "{forged} not escaped in {line:?}");
    }
    assert!(
        !log.chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'),
        "a raw control character in acpd's log: {log:?}"
    );
}
