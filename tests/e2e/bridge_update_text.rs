#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What an agent writes in its updates reaches the editor whatever the text holds: escapes
//! (`json.dumps` writes every non-ASCII character as `\uXXXX`, serde_json a terminal colour
//! as `\u001b`) and words that look like keys (a chunk of code that ends in `…SessionId`).
//! Only a place where ACP names a session (the update's own `sessionId`, say) keeps an update
//! from an editor that did not opt in to subagents; a tool's input or output that happens to
//! hold a `sessionId` key is the tool's, and arrives as written, numbers and all. The agent is a
//! real Python process writing the way Python agents write.

use crate::common;

use common::raw::*;
use common::*;
use serde_json::json;

/// An ACP agent in Python, no SDK: every message through `json.dumps` (ASCII only, so every
/// non-ASCII character is escaped), one write and flush each, answers with `"error": null`. A prompt streams the texts of
/// `TEXTS`, then one update that names another session in a nested key, then `after`.
const AGENT: &str = r#"
import json, sys
TEXTS = ["café — naïve ✓", "\x1b[31mred\x1b[0m", "const parentSessionId",
         "crab 🦀 \"quoted\"", "tab\there\u2028"]
def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n"); sys.stdout.flush()
def chunk(sid, text, **extra):
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    update.update(extra)
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}})
for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if mid is None:
        continue
    if method == "initialize":
        result = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
    elif method == "session/new":
        result = {"sessionId": "py-séance"}
    elif method == "session/prompt":
        sid = msg["params"]["sessionId"]
        for text in TEXTS:
            chunk(sid, text)
        chunk(sid, "nested", toolSessionId="someone-else")
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
            "sessionUpdate": "tool_call", "toolCallId": "t1", "title": "ls",
            "rawInput": {"sessionId": "abc", "command": "ls"},
            "_meta": {"tool": {"parentSessionId": sid}}}}})
        sys.stdout.write('{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"%s",'
                         '"update":{"sessionUpdate":"tool_call_update","toolCallId":"t1",'
                         '"rawOutput":{"sessionId":"abc","n":12345678901234567890123,"e":1e2}}}}\n' % sid)
        sys.stdout.flush()
        chunk(sid, "after")
        result = {"stopReason": "end_turn"}
    else:
        send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})
        continue
    # As pydantic-style models write a response: every member, the absent one null.
    send({"jsonrpc": "2.0", "id": mid, "result": result, "error": None})
"#;

#[test]
fn escaped_text_and_key_like_words_in_updates_reach_the_editor() {
    for subagents in [false, true] {
        updates_reach_an_editor(subagents);
    }
}

/// The agent's updates through `acpd stdio` to an editor that opted in to subagents or not.
fn updates_reach_an_editor(subagents: bool) {
    let env = Env::raw(&format!(
        "default_provider = \"py\"\n[providers.py]\ncommand = [\"python3\", \"-c\", {}]\n",
        serde_json::to_string(AGENT).unwrap()
    ));
    let mut raw = Raw::stdio(&env);
    let caps = match subagents {
        true => json!({"subagents": {}}),
        false => json!({}),
    };
    assert!(raw.initialize(caps).is_object(), "log: {}", raw.log());
    let new = raw.ok("session/new", json!({"cwd": env.path(), "mcpServers": []}));
    let session = new["sessionId"].as_str().unwrap().to_string();
    let start = raw.seen.len();
    let id = raw.send_prompt(&session, "go");
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let streamed: Vec<&str> = raw.seen[start..]
        .iter()
        .filter(|l| l.method() == "session/update")
        .inspect(|l| assert_eq!(l.value["params"]["sessionId"], session, "{}", l.value))
        .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(
        streamed,
        [
            "café — naïve ✓",
            "\u{1b}[31mred\u{1b}[0m",
            "const parentSessionId",
            "crab 🦀 \"quoted\"",
            "tab\there\u{2028}",
            "after",
        ],
        "every update but the one naming another session, in order; log: {}",
        raw.log()
    );
    let tools: Vec<&Line> = raw.seen[start..]
        .iter()
        .filter(|l| l.value["params"]["update"]["toolCallId"] == "t1")
        .collect();
    assert_eq!(
        tools.len(),
        2,
        "both tool updates arrived; log: {}",
        raw.log()
    );
    assert_eq!(
        tools[0].value["params"]["update"]["rawInput"],
        json!({"sessionId": "abc", "command": "ls"}),
        "a tool's input is the tool's: {}",
        tools[0].text()
    );
    assert!(
        tools[1].text().ends_with(&format!(
            r#""params":{{"sessionId":"{session}","update":{{"sessionUpdate":"tool_call_update","toolCallId":"t1","rawOutput":{{"sessionId":"abc","n":12345678901234567890123,"e":1e2}}}}}}}}"#
        )),
        "the tool's output as the agent wrote it, numbers and all: {}",
        tools[1].text()
    );
    let log = raw.log();
    let dropped = log.matches("dropping a child notification").count();
    assert_eq!(
        dropped, 1,
        "only the update naming another session was dropped (subagents: {subagents}): {log}"
    );
    raw.close_write();
    assert!(raw.drain_to_eof(ANSWER), "acpd stdio did not exit");
}

/// A lone surrogate escape (`\ud800`, what JavaScript's `JSON.stringify` writes for half an
/// emoji) is JSON's grammar but no Unicode: an editor that decodes strings (serde_json) would
/// refuse the whole line. acpd replaces each lone one with `\ufffd` on both relay paths: the
/// full one (an update of a new shape) and the hot one (the same shape again, only the text
/// differing); a pair passes byte for byte.
#[test]
fn a_lone_surrogate_reaches_the_editor_as_a_replacement_character_on_both_paths() {
    let env = Env::new("");
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let session = raw.new_session(env.path(), "fast");
    let update = |kind: &str, text: &str| {
        format!(
            ":raw-update {{\"sessionUpdate\":\"{kind}\",\"content\":{{\"type\":\"text\",\"text\":\"{text}\"}}}}\n"
        )
    };
    let chunk = |text: &str| update("agent_message_chunk", text);
    let script = [
        // Another shape first: the next chunk is the full path's, the ones after it fit it.
        update("agent_thought_chunk", "thinking"),
        chunk(r"full \ud800 path"),
        chunk(r"hot \ud800 path"),
        chunk(r"low \udc00 half"),
        chunk(r"pair \ud83d\ude00 kept"),
        chunk(r"cut \ud83d"),
        chunk(r"\ude00 after the cut"),
    ]
    .concat();
    let start = raw.seen.len();
    let id = raw.send_prompt(&session, &script);
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let chunks: Vec<&Line> = raw.seen[start..]
        .iter()
        .filter(|l| String::from_utf8_lossy(&l.raw).contains("agent_message_chunk"))
        .collect();
    let texts: Vec<&str> = chunks
        .iter()
        .map(|l| {
            l.value["params"]["update"]["content"]["text"]
                .as_str()
                .unwrap_or_else(|| panic!("a line serde_json cannot read: {}", l.text()))
        })
        .collect();
    assert_eq!(
        texts,
        [
            "full \u{fffd} path",
            "hot \u{fffd} path",
            "low \u{fffd} half",
            "pair 😀 kept",
            "cut \u{fffd}",
            "\u{fffd} after the cut",
        ]
    );
    assert!(
        chunks[3].text().contains(r"pair \ud83d\ude00 kept"),
        "{}",
        chunks[3].text()
    );
    // An id is echoed as its sender wrote it, lone half and all: only text is replaced.
    raw.line(r#"{"jsonrpc":"2.0","id":"x\ud800","method":"_acpd/runs","params":{}}"#);
    let answer = raw.next();
    assert!(
        answer
            .text()
            .starts_with(r#"{"jsonrpc":"2.0","id":"x\ud800","result":"#),
        "{}",
        answer.text()
    );
}

/// The same in a run (collect mode, which parses every line whole): the lone half is kept as
/// U+FFFD in the run's output, not a chunk dropped as unreadable.
#[test]
fn a_lone_surrogate_in_a_runs_output_is_a_replacement_character() {
    let env = Env::new("");
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let script = concat!(
        r#":raw-update {"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"run \ud800 "}}"#,
        "\n",
        r#":raw-update {"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"pair \ud83d\ude00"}}"#,
        "\n"
    );
    let run = raw.start_run("fast", script);
    let result = raw.wait_run(&run);
    assert_eq!(output_text(&result), "run \u{fffd} pair 😀", "{result}");
}
