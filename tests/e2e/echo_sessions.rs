//! `acpd agent echo` with its ACP v1 feature flags, driven directly over real pipes: persisted
//! sessions seen by a second process, pagination, auth, prompt blocks, subagents and `_`
//! extensions. These are the behaviours acpd's own bridge tests rely on, so they are pinned here
//! against the agent alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

/// One echo agent process and a line-level JSON-RPC client for it.
struct Echo {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    next_id: u64,
}

impl Echo {
    fn spawn(args: &[&str]) -> Echo {
        let mut child = Command::new(common::BIN)
            .args(["agent", "echo"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn acpd agent echo");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Echo {
            stdin: child.stdin.take(),
            child,
            lines,
            next_id: 1,
        }
    }

    fn write(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    fn next(&self) -> Value {
        self.lines.recv_timeout(WAIT).expect("a line from the echo")
    }

    /// Sends a request; returns what came before its answer, and the answer.
    fn call(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        let id = self.send(method, params);
        let mut before = Vec::new();
        loop {
            let line = self.next();
            if line["id"] == json!(id) && line.get("method").is_none() {
                return (before, line);
            }
            before.push(line);
        }
    }

    fn ok(&mut self, method: &str, params: Value) -> Value {
        let (_, answer) = self.call(method, params);
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    fn error_code(&mut self, method: &str, params: Value) -> (i64, Value) {
        let (_, answer) = self.call(method, params);
        let error = &answer["error"];
        (error["code"].as_i64().expect("an error"), error.clone())
    }

    fn initialize(&mut self, client_capabilities: Value) -> Value {
        self.ok(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": client_capabilities}),
        )
    }

    fn new_session(&mut self, cwd: &Path) -> String {
        let result = self.ok("session/new", json!({"cwd": cwd, "mcpServers": []}));
        result["sessionId"].as_str().unwrap().to_string()
    }

    /// Prompts and returns the agent text streamed under `session`, and the stop reason.
    fn prompt(&mut self, session: &str, blocks: Value) -> (String, String) {
        let (before, answer) = self.call(
            "session/prompt",
            json!({"sessionId": session, "prompt": blocks}),
        );
        (
            agent_text(&before, session),
            answer["result"]["stopReason"].as_str().unwrap().to_string(),
        )
    }

    fn say(&mut self, session: &str, text: &str) -> String {
        let (text, stop) = self.prompt(session, json!([{"type": "text", "text": text}]));
        assert_eq!(stop, "end_turn");
        text
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text of the `agent_message_chunk`s among `lines` under `session`.
fn agent_text(lines: &[Value], session: &str) -> String {
    updates(lines, session)
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

fn updates<'a>(lines: &'a [Value], session: &'a str) -> impl Iterator<Item = &'a Value> {
    lines
        .iter()
        .filter(|l| l["method"] == "session/update")
        .filter(move |l| l["params"]["sessionId"] == session)
        .map(|l| &l["params"]["update"])
}

fn ids(result: &Value) -> Vec<String> {
    result["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn sessions_outlive_the_process_that_made_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("sessions");
    let store_arg = store.to_str().unwrap();
    let work = dir.path();

    let mut first = Echo::spawn(&["--sessions", store_arg]);
    let init = first.initialize(json!({}));
    let caps = &init["agentCapabilities"];
    assert_eq!(caps["loadSession"], true);
    for name in ["list", "resume", "close", "delete", "fork"] {
        assert_eq!(caps["sessionCapabilities"][name], json!({}), "{name}");
    }
    let sid = first.new_session(work);
    assert!(sid.starts_with("echo-") && sid.len() > 30, "{sid}");
    assert_eq!(
        first.say(&sid, "hello there\nsecond"),
        "hello there\nsecond"
    );
    drop(first);

    let mut second = Echo::spawn(&["--sessions", store_arg]);
    second.initialize(json!({}));
    let listed = second.ok("session/list", json!({}));
    assert_eq!(ids(&listed), std::slice::from_ref(&sid));
    let info = &listed["sessions"][0];
    assert_eq!(info["cwd"], work.to_str().unwrap());
    assert_eq!(info["title"], "hello there");
    assert!(info["updatedAt"].as_str().unwrap().ends_with('Z'), "{info}");
    assert!(listed.get("nextCursor").is_none());

    // Load replays the history, under the session's id, before answering.
    let (replay, answer) = second.call(
        "session/load",
        json!({"sessionId": sid, "cwd": work, "mcpServers": []}),
    );
    assert_eq!(answer["result"], json!({}));
    let replayed: Vec<(String, String)> = updates(&replay, &sid)
        .map(|u| {
            (
                u["sessionUpdate"].as_str().unwrap().to_string(),
                u["content"]["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(replay.len(), replayed.len(), "{replay:?}");
    assert_eq!(
        replayed,
        [
            ("user_message_chunk".into(), "hello there\nsecond".into()),
            ("agent_message_chunk".into(), "hello there\nsecond".into()),
        ]
    );
    // The loaded session is live: it takes prompts, and they extend the history.
    assert_eq!(second.say(&sid, "more"), "more");

    // Fork copies the history into a new session.
    let forked = second.ok(
        "session/fork",
        json!({"sessionId": sid, "cwd": work, "mcpServers": []}),
    );
    let fork = forked["sessionId"].as_str().unwrap().to_string();
    assert_ne!(fork, sid);
    drop(second);

    let mut third = Echo::spawn(&["--sessions", store_arg]);
    third.initialize(json!({}));
    let (replay, _) = third.call(
        "session/load",
        json!({"sessionId": fork, "cwd": work, "mcpServers": []}),
    );
    assert_eq!(replay.len(), 4, "{replay:?}");
    assert_eq!(agent_text(&replay, &fork), "hello there\nsecondmore");
    // Resume answers without a replay, and the session takes prompts.
    let (replay, answer) = third.call(
        "session/resume",
        json!({"sessionId": sid, "cwd": work, "mcpServers": []}),
    );
    assert!(replay.is_empty(), "{replay:?}");
    assert_eq!(answer["result"], json!({}));
    assert_eq!(third.say(&sid, "again"), "again");

    // Close forgets the live session; its file stays.
    assert_eq!(
        third.ok("session/close", json!({"sessionId": sid})),
        json!({})
    );
    let (code, _) = third.error_code(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}),
    );
    assert_eq!(code, -32002);
    assert_eq!(ids(&third.ok("session/list", json!({}))).len(), 2);

    // Delete removes the file: the session is gone for every process.
    assert_eq!(
        third.ok("session/delete", json!({"sessionId": sid})),
        json!({})
    );
    let (code, error) = third.error_code(
        "session/load",
        json!({"sessionId": sid, "cwd": work, "mcpServers": []}),
    );
    assert_eq!(code, -32002);
    assert_eq!(error["message"], "Session not found");
    assert_eq!(error["data"], json!({"sessionId": sid}));
    // Deleting is idempotent (as in claude-agent-acp and codex-acp); a close is not.
    assert_eq!(
        third.ok("session/delete", json!({"sessionId": sid})),
        json!({})
    );
    let (code, _) = third.error_code("session/close", json!({"sessionId": sid}));
    assert_eq!(code, -32002);
    let (code, _) = third.error_code(
        "session/resume",
        json!({"sessionId": "../etc/passwd", "cwd": work, "mcpServers": []}),
    );
    assert_eq!(code, -32002);
    assert_eq!(ids(&third.ok("session/list", json!({}))), [fork]);
}

#[test]
fn list_pages_newest_first_and_filters_by_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let mut echo = Echo::spawn(&["--sessions", store.to_str().unwrap(), "--list-page", "2"]);
    echo.initialize(json!({}));
    let mut made = Vec::new();
    for i in 0..5 {
        let sid = echo.new_session(&a);
        echo.say(&sid, &format!("prompt {i}"));
        made.push(sid);
        // Distinct updatedAt values (milliseconds), so the order is the creation order.
        std::thread::sleep(Duration::from_millis(5));
    }
    let other = echo.new_session(&b);
    made.reverse();

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut params = json!({"cwd": a});
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let page = echo.ok("session/list", params);
        pages += 1;
        assert!(ids(&page).len() <= 2);
        seen.extend(ids(&page));
        match page.get("nextCursor") {
            Some(next) => cursor = Some(next.as_str().unwrap().to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, made);
    assert_eq!(ids(&echo.ok("session/list", json!({"cwd": b}))), [other]);
    let (code, _) = echo.error_code("session/list", json!({"cursor": "not-ours"}));
    assert_eq!(code, -32602);
}

#[test]
fn without_sessions_the_lifecycle_methods_are_not_found() {
    let mut echo = Echo::spawn(&[]);
    let init = echo.initialize(json!({}));
    assert_eq!(init["agentCapabilities"]["loadSession"], false);
    assert_eq!(init["agentCapabilities"]["sessionCapabilities"], json!({}));
    assert_eq!(init["authMethods"], json!([]));
    let cwd = std::env::temp_dir();
    assert_eq!(echo.new_session(&cwd), "echo-1");
    for method in [
        "session/load",
        "session/resume",
        "session/list",
        "session/close",
        "session/delete",
        "session/fork",
        "authenticate",
    ] {
        let (code, _) = echo.error_code(method, json!({"sessionId": "echo-1", "cwd": cwd}));
        assert_eq!(code, -32601, "{method}");
    }
}

#[test]
fn auth_gates_sessions_until_an_advertised_method_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s");
    let mut echo = Echo::spawn(&[
        "--auth",
        "api-key",
        "--auth",
        "login",
        "--sessions",
        store.to_str().unwrap(),
    ]);
    let init = echo.initialize(json!({}));
    assert_eq!(
        init["authMethods"],
        json!([{"id": "api-key", "name": "api-key"}, {"id": "login", "name": "login"}])
    );
    for (method, params) in [
        ("session/new", json!({"cwd": dir.path(), "mcpServers": []})),
        ("session/list", json!({})),
        (
            "session/load",
            json!({"sessionId": "echo-x", "cwd": dir.path(), "mcpServers": []}),
        ),
        (
            "session/resume",
            json!({"sessionId": "echo-x", "cwd": dir.path()}),
        ),
    ] {
        let (code, error) = echo.error_code(method, params);
        assert_eq!(code, -32000, "{method}");
        assert_eq!(error["message"], "Authentication required");
        assert_eq!(error["data"], json!({"authMethods": ["api-key", "login"]}));
    }
    let (code, _) = echo.error_code("authenticate", json!({"methodId": "nope"}));
    assert_eq!(code, -32602);
    assert_eq!(
        echo.ok("authenticate", json!({"methodId": "login"})),
        json!({})
    );
    let sid = echo.new_session(dir.path());
    assert_eq!(echo.say(&sid, ":auth"), "auth login\n");

    let mut plain = Echo::spawn(&[]);
    plain.initialize(json!({}));
    let sid = plain.new_session(dir.path());
    assert_eq!(plain.say(&sid, ":auth"), "auth none\n");
}

#[test]
fn prompt_caps_are_advertised_and_blocks_reported() {
    let mut echo = Echo::spawn(&["--prompt-caps", "image,embedded"]);
    let init = echo.initialize(json!({}));
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"],
        json!({"image": true, "audio": false, "embeddedContext": true})
    );
    let sid = echo.new_session(&std::env::temp_dir());
    let (text, stop) = echo.prompt(
        &sid,
        json!([
            {"type": "text", "text": "look\n"},
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
            {"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs"},
            {"type": "resource", "resource": {"uri": "file:///b.md", "text": "b"}},
            {"type": "text", "text": ":blocks\n"},
        ]),
    );
    assert_eq!(stop, "end_turn");
    assert_eq!(
        text,
        "look\nblock image image/png\nblock resource_link file:///a.rs\n\
         block resource file:///b.md\n"
    );
}

#[test]
fn subagents_announce_stream_and_cancel() {
    let mut echo = Echo::spawn(&["--subagents"]);
    let init = echo.initialize(json!({"subagents": {}}));
    assert_eq!(
        init["agentCapabilities"]["sessionCapabilities"]["subagents"],
        json!({})
    );
    let sid = echo.new_session(&std::env::temp_dir());
    let (before, answer) = echo.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": ":subagent digging"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn");
    let announce = &before[0]["params"];
    assert_eq!(announce["sessionId"], sid);
    let update = &announce["update"];
    assert_eq!(update["sessionUpdate"], "subagent_update");
    assert_eq!(update["title"], "echo sub");
    assert_eq!(update["capabilities"], json!({"cancel": {}}));
    let sub = update["sessionId"].as_str().unwrap().to_string();
    assert_ne!(sub, sid);
    assert_eq!(agent_text(&before[1..2], &sub), "digging\n");
    assert_eq!(agent_text(&before, &sid), format!("subagent {sub} done\n"));

    // The hanging subagent waits for its own cancel, then the parent's turn ends normally.
    let id = echo.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": ":subagent-hang wait\nnot reached"}]}),
    );
    let announce = echo.next();
    let sub = announce["params"]["update"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let chunk = echo.next();
    assert_eq!(chunk["params"]["sessionId"], sub);
    assert!(
        echo.lines.recv_timeout(Duration::from_millis(200)).is_err(),
        "the turn waits for the subagent's cancel"
    );
    echo.notify("session/cancel", json!({"sessionId": sub}));
    let mut rest = Vec::new();
    loop {
        let line = echo.next();
        if line["id"] == json!(id) {
            assert_eq!(line["result"]["stopReason"], "end_turn");
            break;
        }
        rest.push(line);
    }
    assert_eq!(agent_text(&rest, &sid), "subagent cancelled\n");

    // A client that did not opt in is told so.
    let mut shy = Echo::spawn(&["--subagents"]);
    shy.initialize(json!({}));
    let sid = shy.new_session(&std::env::temp_dir());
    assert_eq!(
        shy.say(&sid, ":subagent x"),
        "subagent: client did not opt in\n"
    );
}

#[test]
fn extensions_are_echoed_recorded_and_sent() {
    let mut echo = Echo::spawn(&[]);
    echo.initialize(json!({}));
    assert_eq!(
        echo.ok("_echo/ping", json!({"n": 1})),
        json!({"echo": "_echo/ping", "params": {"n": 1}})
    );
    // Any other `_` request is unknown to the agent: -32601, as a real agent answers.
    assert_eq!(echo.error_code("_vendor/ping", json!({"n": 1})).0, -32601);
    echo.notify("_vendor/one", json!({}));
    echo.notify("_vendor/two", json!({"x": 1}));
    let sid = echo.new_session(&std::env::temp_dir());
    assert_eq!(echo.say(&sid, ":ext"), "ext _vendor/one\next _vendor/two\n");

    // :ext-request asks the client; its answer or error is streamed.
    for (reply, expected) in [
        (json!({"result": {"pong": 1}}), "ext-reply {\"pong\":1}\n"),
        (
            json!({"error": {"code": -32601, "message": "no"}}),
            "ext-error -32601\n",
        ),
    ] {
        let id = echo.send(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": ":ext-request _client/ping"}]}),
        );
        let request = echo.next();
        assert_eq!(request["method"], "_client/ping");
        assert_eq!(request["params"], json!({"sessionId": sid}));
        let mut answer = reply.clone();
        answer["jsonrpc"] = json!("2.0");
        answer["id"] = request["id"].clone();
        echo.write(&answer);
        let chunk = echo.next();
        assert_eq!(chunk["params"]["update"]["content"]["text"], expected);
        let done = echo.next();
        assert_eq!(done["id"], json!(id));
    }
}
