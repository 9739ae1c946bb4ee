#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `session/cancel` over the transparent bridge, as the agent receives it: in the order the
//! editor sent it among its other messages (a user who stops a turn and at once sends a new
//! message cancels the old turn, never the new one), with the editor's own fields (`_meta`)
//! and only the session id rewritten; not lost when the editor hangs up right after it, and
//! sent to no other session. The agent is a small Python process that writes down every
//! message it receives, in order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;

use common::raw::*;
use common::*;
use serde_json::{Value, json};

/// An ACP agent in Python that appends every message it receives (after the handshake) to
/// the file named by its argument, one JSON line each. A prompt `hold` stays open until a
/// `session/cancel` ends it `cancelled`; any other prompt ends at once. Its session id is
/// `child-<pid>`, so each agent process is told apart in the shared file.
const AGENT: &str = r#"
import json, os, sys
LOG = sys.argv[1]
held = []
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n"); sys.stdout.flush()
def answer(mid, result):
    send({"jsonrpc": "2.0", "id": mid, "result": result})
for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if method is None:
        continue
    if method == "initialize":
        answer(mid, {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []})
        continue
    if method == "session/new":
        answer(mid, {"sessionId": "child-%d" % os.getpid()})
        continue
    with open(LOG, "a") as f:
        f.write(json.dumps({"method": method, "id": mid, "params": msg.get("params")}) + "\n")
    if method == "session/prompt":
        if msg["params"]["prompt"][0]["text"] == "hold":
            held.append(mid)
        else:
            answer(mid, {"stopReason": "end_turn"})
    elif method == "session/cancel":
        for h in held:
            answer(h, {"stopReason": "cancelled"})
        held = []
    elif mid is not None:
        answer(mid, {})
"#;

const WAIT: Duration = Duration::from_secs(20);

/// An env whose default provider is the recording agent, and the file it writes to.
fn recording(extra: &str) -> (Env, PathBuf) {
    let env = Env::raw("");
    let log = env.path().join("received.jsonl");
    let toml = format!(
        "{extra}\ndefault_provider = \"py\"\n[providers.py]\ncommand = [\"python3\", \"-c\", {}, {}]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        serde_json::to_string(AGENT).unwrap(),
        serde_json::to_string(&log).unwrap(),
    );
    std::fs::write(&env.config, toml).unwrap();
    (env, log)
}

/// Every message the agents received so far, in order.
fn received(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What the agents received once `done` holds of it, under a deadline.
fn received_until(log: &Path, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let reached = eventually(WAIT, || done(&received(log)));
    let seen = received(log);
    assert!(
        reached,
        "the agent did not receive it; it received: {seen:#?}"
    );
    seen
}

/// The agent's session id (`child-<pid>`) of the editor's session `sid`: the one its prompt
/// `text` reached.
fn child_of(log: &Path, text: &str) -> String {
    let seen = received_until(log, |s| s.iter().any(|m| prompt_text(m) == Some(text)));
    let m = seen.iter().find(|m| prompt_text(m) == Some(text)).unwrap();
    m["params"]["sessionId"].as_str().unwrap().to_string()
}

fn prompt_text(m: &Value) -> Option<&str> {
    (m["method"] == "session/prompt")
        .then(|| m["params"]["prompt"][0]["text"].as_str())
        .flatten()
}

/// A message as the test names it: the method, and a prompt's text after a space.
fn named(m: &Value) -> String {
    match prompt_text(m) {
        Some(text) => format!("session/prompt {text}"),
        None => m["method"].as_str().unwrap_or("?").to_string(),
    }
}

fn names(seen: &[Value], child: &str) -> Vec<String> {
    seen.iter()
        .filter(|m| m["params"]["sessionId"] == child)
        .map(named)
        .collect()
}

fn line(v: Value) -> String {
    let mut s = v.to_string();
    s.push('\n');
    s
}

fn prompt_line(id: u64, session: &str, text: &str) -> String {
    line(
        json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
        "params": {"sessionId": session, "prompt": [{"type": "text", "text": text}]}}),
    )
}

fn cancel_line(session: &str) -> String {
    line(json!({"jsonrpc": "2.0", "method": "session/cancel",
        "params": {"sessionId": session, "_meta": {"reason": "user"}, "extra": [1, 2]}}))
}

/// The answers to `ids`, in whatever order they come.
fn answers<const N: usize>(raw: &mut Raw, ids: [u64; N]) -> [Value; N] {
    let mut got: [Value; N] = std::array::from_fn(|_| Value::Null);
    while got.iter().any(Value::is_null) {
        let line = raw.next_response();
        match ids.iter().position(|id| line.value["id"] == *id) {
            Some(i) => got[i] = line.value,
            None => raw.seen.push(line),
        }
    }
    got
}

fn editor(env: &Env) -> Raw {
    let mut raw = Raw::stdio(env);
    assert!(raw.initialize(json!({})).is_object(), "log: {}", raw.log());
    raw
}

fn new_session(raw: &mut Raw, env: &Env) -> String {
    let r = raw.ok("session/new", json!({"cwd": env.path(), "mcpServers": []}));
    r["sessionId"].as_str().unwrap().to_string()
}

/// The user stops a turn and at once sends a new message, then an extension notification
/// and request: the agent gets the cancel before all of them, so it ends the old turn, and
/// the cancel carries the editor's `_meta` and other fields under the agent's session id.
#[test]
fn a_cancel_reaches_the_agent_before_what_the_editor_sent_after_it_with_its_fields() {
    let (env, log) = recording("");
    let mut raw = editor(&env);
    let s = new_session(&mut raw, &env);
    let held = raw.send_prompt(&s, "hold");
    let child = child_of(&log, "hold");
    // One write, so acpd reads all four together, as it would from a quick editor.
    let burst = [
        cancel_line(&s),
        prompt_line(100, &s, "second"),
        line(json!({"jsonrpc": "2.0", "method": "_zed/hint", "params": {"sessionId": s}})),
        line(
            json!({"jsonrpc": "2.0", "id": 101, "method": "_zed/ask", "params": {"sessionId": s}}),
        ),
    ]
    .concat();
    raw.write(burst.as_bytes()).unwrap();
    let [first, second, ask] = answers(&mut raw, [held, 100, 101]);
    assert_eq!(
        first["result"]["stopReason"], "cancelled",
        "the held turn is the one cancelled: {first}"
    );
    assert_eq!(
        second["result"]["stopReason"], "end_turn",
        "the new turn runs: {second}"
    );
    assert!(ask["result"].is_object(), "{ask}");
    let seen = received_until(&log, |s| s.len() >= 5);
    assert_eq!(
        names(&seen, &child),
        [
            "session/prompt hold",
            "session/cancel",
            "session/prompt second",
            "_zed/hint",
            "_zed/ask"
        ],
        "the agent receives them in the editor's order: {seen:#?}"
    );
    assert_eq!(
        seen[1]["params"],
        json!({"sessionId": child, "_meta": {"reason": "user"}, "extra": [1, 2]}),
        "only the session id is rewritten"
    );
    raw.close_write();
    assert!(raw.drain_to_eof(ANSWER), "acpd stdio did not exit");
}

/// A cancel with no turn running, two in a row, one for a session acpd does not know and one
/// for another session of the same editor: each reaches exactly its own session's agent, in
/// order, and the sessions go on working.
#[test]
fn cancels_with_no_turn_twice_in_a_row_and_for_other_sessions_reach_only_their_agent() {
    let (env, log) = recording("");
    let mut raw = editor(&env);
    let a = new_session(&mut raw, &env);
    let b = new_session(&mut raw, &env);
    let ids = [raw.send_prompt(&a, "a"), raw.send_prompt(&b, "b")];
    for r in answers(&mut raw, ids) {
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    }
    let (child_a, child_b) = (child_of(&log, "a"), child_of(&log, "b"));
    let burst = [
        cancel_line(&a),
        cancel_line(&a),
        cancel_line("acpd-no-such-session"),
        prompt_line(200, &a, "a again"),
        cancel_line(&b),
        prompt_line(201, &b, "b again"),
    ]
    .concat();
    raw.write(burst.as_bytes()).unwrap();
    for r in answers(&mut raw, [200, 201]) {
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    }
    let seen = received_until(&log, |s| s.len() >= 7);
    assert_eq!(
        names(&seen, &child_a),
        [
            "session/prompt a",
            "session/cancel",
            "session/cancel",
            "session/prompt a again"
        ],
        "{seen:#?}"
    );
    assert_eq!(
        names(&seen, &child_b),
        [
            "session/prompt b",
            "session/cancel",
            "session/prompt b again"
        ],
        "{seen:#?}"
    );
    assert_eq!(
        seen.len(),
        7,
        "nothing reached an agent that was not its: {seen:#?}"
    );
    raw.close_write();
    assert!(raw.drain_to_eof(ANSWER), "acpd stdio did not exit");
}

/// The editor cancels and hangs up at once. A session that outlives its connection
/// (`detach_timeout`) still gets the cancel, so its agent stops the turn nobody will read.
#[test]
fn a_cancel_sent_just_before_the_editor_hangs_up_reaches_the_detached_session() {
    let (env, log) = recording("detach_timeout = \"60s\"");
    let served = Serve::start(&env);
    let mut raw = served.connect();
    assert!(raw.initialize(json!({})).is_object());
    let s = new_session(&mut raw, &env);
    raw.send_prompt(&s, "hold");
    let child = child_of(&log, "hold");
    raw.write(cancel_line(&s).as_bytes()).unwrap();
    drop(raw);
    let seen = received_until(&log, |seen| seen.len() >= 2);
    assert_eq!(
        names(&seen, &child),
        ["session/prompt hold", "session/cancel"]
    );
}

/// Without `detach_timeout` the session ends with the connection: a cancel just before the
/// editor hangs up leaves nothing behind (acpd exits, the agent is reaped).
#[test]
fn a_cancel_sent_just_before_the_editor_hangs_up_ends_cleanly_without_detach() {
    let (env, log) = recording("");
    let mut raw = editor(&env);
    let s = new_session(&mut raw, &env);
    raw.send_prompt(&s, "hold");
    child_of(&log, "hold");
    raw.write(cancel_line(&s).as_bytes()).unwrap();
    raw.close_write();
    assert!(raw.drain_to_eof(ANSWER), "acpd stdio did not exit");
}
