#![allow(clippy::unwrap_used, clippy::expect_used)]
//! acpd forwards what each side writes as it was written, but for session ids and request
//! ids: request ids in any JSON spelling (`1e2`, `"p\u0041"`) still pair a `$/cancel_request`
//! with its request, error `data` arrives byte for byte, permission options and client
//! capabilities acpd's schema does not know pass through, and the methods an agent answers
//! for itself reach it. The agent is a real Python process that logs every line it reads (to
//! `agent.ndjson`, for byte-exact checks) and writes the lines a prompt's script gives it.

use crate::common;

use std::path::PathBuf;

use common::raw::*;
use common::*;
use serde_json::{Value, json};

/// An ACP agent in Python, no SDK. argv: the log file and the `initialize` result. A prompt's
/// text is a script, one command a line: `send LINE` writes LINE as it is, `wait TEXT` reads
/// until a line holding TEXT; then the prompt is answered `end_turn`. `_test/raw` is answered
/// with its params' `line`, `$ID` replaced by the request's id. Requests it does not know are
/// answered `{"echo": METHOD}`; its session is always `py-1`.
const AGENT: &str = r#"
import json, sys
LOG = open(sys.argv[1], "a")
INIT = json.loads(sys.argv[2])
def send(text):
    sys.stdout.write(text + "\n"); sys.stdout.flush()
def answer(mid, result):
    send(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}))
def recv():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    LOG.write(line); LOG.flush()
    return line, json.loads(line)
while True:
    line, msg = recv()
    method, mid = msg.get("method"), msg.get("id")
    if method is None or mid is None:
        continue
    if method == "initialize":
        answer(mid, INIT)
    elif method == "session/new":
        answer(mid, {"sessionId": "py-1"})
    elif method == "session/prompt":
        for command in msg["params"]["prompt"][0]["text"].split("\n"):
            verb, _, rest = command.partition(" ")
            if verb == "send":
                send(rest)
            elif verb == "wait":
                while rest not in recv()[0]:
                    pass
        answer(mid, {"stopReason": "end_turn"})
    elif method == "_test/raw":
        send(msg["params"]["line"].replace("$ID", json.dumps(mid)))
    else:
        answer(mid, {"echo": method})
"#;

struct Agent {
    env: Env,
    log: PathBuf,
}

/// `acpd stdio`'s config with one provider, `py`, running [`AGENT`] with `init` as its
/// `initialize` result, and `extra` lines in its table.
fn agent(init: Value, extra: &str) -> Agent {
    let env = Env::raw("");
    let log = env.path().join("agent.ndjson");
    let argv = [
        "python3",
        "-c",
        AGENT,
        log.to_str().unwrap(),
        &init.to_string(),
    ];
    let argv: Vec<String> = argv
        .iter()
        .map(|a| serde_json::to_string(a).unwrap())
        .collect();
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"py\"\n[providers.py]\ncommand = [{}]\n{extra}\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            argv.join(", ")
        ),
    )
    .unwrap();
    Agent { env, log }
}

fn plain_init() -> Value {
    json!({"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []})
}

impl Agent {
    /// The lines the agent read so far.
    fn read(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits for a line the agent read that `pick` accepts.
    fn until(&self, what: &str, pick: impl Fn(&str) -> bool) -> String {
        let mut found = None;
        let seen = eventually(ANSWER, || {
            found = self.read().into_iter().find(|l| pick(l));
            found.is_some()
        });
        assert!(
            seen,
            "the agent never read {what}; it read: {:?}",
            self.read()
        );
        found.unwrap_or_default()
    }

    fn connect(&self, caps: Value) -> (Raw, String) {
        let mut raw = Raw::stdio(&self.env);
        assert!(raw.initialize(caps).is_object(), "log: {}", raw.log());
        let new = raw.ok(
            "session/new",
            json!({"cwd": self.env.path(), "mcpServers": []}),
        );
        let s = new["sessionId"].as_str().unwrap().to_string();
        (raw, s)
    }
}

/// A prompt whose text is `script`, sent under `id` written as it is.
fn prompt_with_id(raw: &mut Raw, id: &str, session: &str, script: &str) {
    let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": script}]});
    raw.line(&format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{params}}}"#
    ));
}

fn until_method(raw: &mut Raw, method: &str) -> Line {
    loop {
        let line = raw.next();
        if line.method() == method {
            return line;
        }
        raw.seen.push(line);
    }
}

fn close(mut raw: Raw) {
    raw.close_write();
    assert!(raw.drain_to_eof(ANSWER), "acpd stdio did not exit");
    if let Some(mut p) = raw.process.take() {
        p.wait().unwrap();
    }
}

// ---- request ids in any spelling ----

/// The text of `key`'s value in a line's top-level `params`, as written (a flat value).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let at = line.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap();
    &rest[..end]
}

#[test]
fn an_editors_cancel_request_finds_a_prompt_whatever_the_ids_spelling() {
    let a = agent(plain_init(), "");
    let (mut raw, s) = a.connect(json!({}));
    for (n, id) in [r#""p\u0041""#, "1e2", r#""p1""#].into_iter().enumerate() {
        prompt_with_id(&mut raw, id, &s, "wait $/cancel_request");
        let prompts = |a: &Agent| -> Vec<String> {
            a.read()
                .into_iter()
                .filter(|l| l.contains("\"session/prompt\""))
                .collect()
        };
        assert!(
            eventually(ANSWER, || prompts(&a).len() > n),
            "{id}: no prompt reached the agent"
        );
        let child_id = field(&prompts(&a)[n], "id").to_string();
        raw.line(&format!(
            r#"{{"jsonrpc":"2.0","method":"$/cancel_request","params":{{"requestId":{id},"_meta":{{"n":1e2,"s":"\u00e9"}}}}}}"#
        ));
        let cancels = |l: &str| l.contains(r#""method":"$/cancel_request""#);
        let cancel = eventually(ANSWER, || {
            a.read().iter().filter(|l| cancels(l)).count() > n
        });
        assert!(
            cancel,
            "{id}: the agent never got the cancel: {:?}",
            a.read()
        );
        let cancel = a.read().into_iter().filter(|l| cancels(l)).nth(n).unwrap();
        assert_eq!(
            cancel,
            format!(
                r#"{{"jsonrpc":"2.0","method":"$/cancel_request","params":{{"requestId":{child_id},"_meta":{{"n":1e2,"s":"\u00e9"}}}}}}"#
            ),
            "{id}: only the request id differs"
        );
        let answer = raw.next_response();
        assert_eq!(
            answer.value["result"]["stopReason"],
            "end_turn",
            "{}",
            answer.text()
        );
        assert!(
            answer.text().contains(&format!("\"id\":{id}")),
            "{}",
            answer.text()
        );
    }
    // A requestId written twice (however spelled) names no request: dropped, and the cancel
    // after it is the one the agent gets.
    prompt_with_id(&mut raw, "9", &s, "wait $/cancel_request");
    raw.line(r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":9,"request\u0049d":9}}"#);
    raw.line(r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{ "requestId" : 9 }}"#);
    let answer = raw.next_response();
    assert_eq!(answer.value["id"], 9, "{}", answer.text());
    let cancels: Vec<String> = a
        .read()
        .into_iter()
        .filter(|l| l.contains(r#""method":"$/cancel_request""#))
        .collect();
    assert_eq!(cancels.len(), 4, "{cancels:?}");
    let prompts: Vec<String> = a
        .read()
        .into_iter()
        .filter(|l| l.contains("\"session/prompt\""))
        .collect();
    let child_id = field(&prompts[3], "id");
    assert!(
        cancels[3].ends_with(&format!(r#""params":{{ "requestId" : {child_id} }}}}"#)),
        "{cancels:?}"
    );
    close(raw);
}

#[test]
fn a_childs_cancel_request_reaches_the_editor_whatever_the_ids_spelling() {
    let a = agent(plain_init(), "");
    let (mut raw, s) = a.connect(json!({"fs": {"readTextFile": true}}));
    for id in ["1e2", r#""r\u0041""#, "-0", "7"] {
        let script = format!(
            "send {{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"fs/read_text_file\",\"params\":{{\"sessionId\":\"py-1\",\"path\":\"/x\"}}}}\n\
             send {{\"jsonrpc\":\"2.0\",\"method\":\"$/cancel_request\",\"params\":{{\"requestId\":{id}}}}}\n\
             wait \"id\":{id}"
        );
        let prompt = raw.send_prompt(&s, &script);
        let asked = until_method(&mut raw, "fs/read_text_file");
        let cancel = until_method(&mut raw, "$/cancel_request");
        assert_eq!(
            cancel.text(),
            format!(
                r#"{{"jsonrpc":"2.0","method":"$/cancel_request","params":{{"requestId":{}}}}}"#,
                asked.value["id"]
            ),
            "{id}"
        );
        raw.line(
            &json!({"jsonrpc": "2.0", "id": asked.value["id"],
                "error": {"code": -32800, "message": "Request cancelled"}})
            .to_string(),
        );
        let answer = raw.answer(&json!(prompt)).value;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{id}: {answer}");
        a.until("the editor's answer", |l| {
            l.starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"error""#))
        });
    }
    close(raw);
}

// ---- error data ----

/// What the editor's error `data` and the agent's look like after acpd: (as written, as
/// expected). Only a `sessionId` naming the agent's session changes (to the editor's, `$S`).
const DATA: &[(&str, &str)] = &[
    (
        r#"{"n":12345678901234567890123,"e":1e2,"s":"\u00e9"}"#,
        r#"{"n":12345678901234567890123,"e":1e2,"s":"\u00e9"}"#,
    ),
    ("null", "null"),
    (r#"[ -0 , 1.0 ]"#, r#"[ -0 , 1.0 ]"#),
    (
        r#"{"sessionId":"py-1","x":1e2}"#,
        r#"{"sessionId":"$S","x":1e2}"#,
    ),
];

#[test]
fn the_agents_error_data_reaches_the_editor_as_written() {
    let a = agent(plain_init(), "");
    let (mut raw, s) = a.connect(json!({}));
    for (data, expected) in DATA {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":$ID,"error":{{"code":-32603,"message":"m","data":{data}}}}}"#
        );
        let id = raw.send("_test/raw", json!({"sessionId": s, "line": line}));
        let answer = raw.answer(&json!(id));
        assert_eq!(
            answer.text(),
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32603,"message":"m","data":{}}}}}"#,
                expected.replace("$S", &s)
            )
        );
    }
    // No data stays none.
    let line = r#"{"jsonrpc":"2.0","id":$ID,"error":{"code":-32603,"message":"m"}}"#;
    let id = raw.send("_test/raw", json!({"sessionId": s, "line": line}));
    let answer = raw.answer(&json!(id));
    assert_eq!(
        answer.text(),
        format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-32603,"message":"m"}}}}"#)
    );
    close(raw);
}

#[test]
fn the_editors_error_data_reaches_the_agent_as_written() {
    let a = agent(plain_init(), "");
    let (mut raw, s) = a.connect(json!({}));
    for (n, (data, _)) in DATA.iter().enumerate() {
        let ask = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"_vendor/ask","params":{{"sessionId":"py-1"}}}}"#,
            50 + n
        );
        let prompt = raw.send_prompt(&s, &format!("send {ask}\nwait \"id\":{}", 50 + n));
        let asked = until_method(&mut raw, "_vendor/ask");
        raw.line(&format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32603,"message":"m","data":{data}}}}}"#,
            asked.value["id"]
        ));
        let answer = raw.answer(&json!(prompt)).value;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        let expected = format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32603,"message":"m","data":{data}}}}}"#,
            50 + n
        );
        a.until(&expected, |l| l == expected);
    }
    close(raw);
}

// ---- permission requests ----

/// A permission request with an option kind acpd's schema does not know (`allow_session`) and
/// fields it does not know, as the agent writes it.
const ASK: &str = r#"{"jsonrpc":"2.0","id":70,"method":"session/request_permission","params":{"sessionId":"py-1","toolCall":{"toolCallId":"t","future":1e2},"options":[{"optionId":"s","name":"Session","kind":"allow_session"},{"optionId":"o","name":"Once","kind":"allow_once"},{"optionId":"n","name":"No","kind":"reject_once"}],"later":[]}}"#;

#[test]
fn a_permission_request_acpd_cannot_read_is_forwarded_as_written() {
    let a = agent(plain_init(), "");
    let (mut raw, s) = a.connect(json!({}));
    let prompt = raw.send_prompt(&s, &format!("send {ASK}\nwait \"id\":70"));
    let asked = until_method(&mut raw, "session/request_permission");
    let minted = serde_json::to_string(&s).unwrap();
    assert_eq!(
        asked.text(),
        ASK.replace("70", &asked.value["id"].to_string())
            .replace("\"py-1\"", &minted),
        "only the ids differ"
    );
    raw.line(
        &json!({"jsonrpc": "2.0", "id": asked.value["id"],
            "result": {"outcome": {"outcome": "selected", "optionId": "s"}}})
        .to_string(),
    );
    let answer = raw.answer(&json!(prompt)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    a.until("the editor's choice", |l| {
        l == r#"{"jsonrpc":"2.0","id":70,"result":{"outcome":{"outcome":"selected","optionId":"s"}}}"#
    });
    // One that names no session is still refused: nobody could tell whose it is.
    let prompt = raw.send_prompt(
        &s,
        "send {\"jsonrpc\":\"2.0\",\"id\":71,\"method\":\"session/request_permission\",\"params\":[\"py-1\"]}\n\
         wait \"id\":71",
    );
    raw.answer(&json!(prompt));
    let refused = a.until("acpd's refusal", |l| l.contains("\"id\":71"));
    assert!(refused.contains("-32602"), "{refused}");
    close(raw);
}

/// A policy that answers by itself picks among the kinds it knows and never refuses a request
/// for a kind it does not: `allow` takes `allow_once`, `reject` has no rejecting kind it knows
/// here and answers `cancelled`.
#[test]
fn a_policy_answers_a_request_with_kinds_it_does_not_know() {
    for (policy, options, expected) in [
        (
            "allow",
            r#"[{"optionId":"s","name":"S","kind":"allow_session"},{"optionId":"o","name":"O","kind":"allow_once"}]"#,
            r#"{"outcome":{"outcome":"selected","optionId":"o"}}"#,
        ),
        (
            "reject",
            r#"[{"optionId":"s","name":"S","kind":"reject_session"},{"optionId":"o","name":"O","kind":"allow_once"}]"#,
            r#"{"outcome":{"outcome":"cancelled"}}"#,
        ),
    ] {
        let a = agent(plain_init(), &format!("permission = \"{policy}\""));
        let (mut raw, s) = a.connect(json!({}));
        let ask = format!(
            r#"{{"jsonrpc":"2.0","id":72,"method":"session/request_permission","params":{{"sessionId":"py-1","toolCall":{{"toolCallId":"t"}},"options":{options}}}}}"#
        );
        let prompt = raw.send_prompt(&s, &format!("send {ask}\nwait \"id\":72"));
        raw.answer(&json!(prompt));
        let answer = a.until("acpd's answer", |l| l.contains("\"id\":72"));
        assert_eq!(
            answer,
            format!(r#"{{"jsonrpc":"2.0","id":72,"result":{expected}}}"#),
            "{policy}"
        );
        assert!(
            raw.seen
                .iter()
                .all(|l| l.method() != "session/request_permission"),
            "{policy}: the editor was asked"
        );
        close(raw);
    }
}

// ---- methods the agent answers for itself ----

/// After a load or a resume (whose answers need not repeat what `session/new` said), the
/// editor's `set_mode`, `set_model` and `set_config_option` reach the agent, which answers.
#[test]
fn set_mode_model_and_config_reach_the_agent_after_a_load_or_a_resume() {
    let init = json!({"protocolVersion": 1, "authMethods": [], "agentCapabilities":
        {"loadSession": true, "sessionCapabilities": {"resume": {}}}});
    let a = agent(init, "");
    let (raw, s) = a.connect(json!({}));
    close(raw);
    for reopen in ["session/load", "session/resume"] {
        let mut raw = Raw::stdio(&a.env);
        raw.initialize(json!({}));
        let opened = raw.call(
            reopen,
            json!({"sessionId": s, "cwd": a.env.path(), "mcpServers": []}),
        );
        assert_eq!(opened["result"]["echo"], reopen, "{opened}");
        for (method, params) in [
            ("session/set_mode", json!({"sessionId": s, "modeId": "m"})),
            ("session/set_model", json!({"sessionId": s, "modelId": "x"})),
            (
                "session/set_config_option",
                json!({"sessionId": s, "configId": "c", "value": "v"}),
            ),
        ] {
            let answer = raw.call(method, params);
            assert_eq!(answer["result"]["echo"], method, "{reopen}: {answer}");
        }
        close(raw);
    }
    let got = a.read();
    for method in [
        "session/set_mode",
        "session/set_model",
        "session/set_config_option",
    ] {
        let seen = got
            .iter()
            .filter(|l| l.contains(&format!("\"method\":\"{method}\"")) && l.contains("\"py-1\""))
            .count();
        assert_eq!(seen, 2, "{method}: {got:?}");
    }
}

// ---- client capabilities ----

/// The editor's `clientCapabilities` reach the agent as the editor wrote them: ones acpd's
/// schema does not know, sub-keys it does not know, and nothing of acpd's added.
#[test]
fn client_capabilities_reach_the_agent_as_written() {
    let a = agent(plain_init(), "");
    let caps = r#"{"fs":{"readTextFile":true},"futureCap":{"a":1e2},"session":{"foo":{}},"_meta":{"x":"\u00e9"}}"#;
    let mut raw = Raw::stdio(&a.env);
    raw.line(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{caps}}}}}"#
    ));
    let init = raw.answer(&json!(1));
    assert!(init.value["result"].is_object(), "{}", init.text());
    let new = raw.ok(
        "session/new",
        json!({"cwd": a.env.path(), "mcpServers": []}),
    );
    assert!(new["sessionId"].is_string(), "{new}");
    let got = a.read();
    let written = format!(r#""clientCapabilities":{caps},"#);
    assert!(
        got.iter()
            .any(|l| l.contains("\"initialize\"") && l.contains(&written)),
        "{got:?}"
    );
    close(raw);
}

// ---- array params ----

/// A child's notification or request with array params reaches the editor unchanged (there is
/// no session in it to rewrite); an update must name its session, so one with an array never
/// does, and an array naming a session inside (which could not be rewritten) never leaves.
#[test]
fn array_params_from_the_child_reach_the_editor_unchanged() {
    let a = agent(plain_init(), "");
    let (mut raw, s) = a.connect(json!({}));
    let start = raw.seen.len();
    let prompt = raw.send_prompt(
        &s,
        "send {\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":[\"py-1\"]}\n\
         send {\"jsonrpc\":\"2.0\",\"method\":\"_zed/arr\",\"params\":[{\"sessionId\":\"py-1\"}]}\n\
         send {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"_zed/arr\",\"params\":[{\"toolSessionId\":\"x\"}]}\n\
         send {\"jsonrpc\":\"2.0\",\"method\":\"_zed/arr\",\"params\":[23, 1e2]}\n\
         send {\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"_zed/arr\",\"params\":[1,2]}\n\
         wait \"id\":6",
    );
    let note = until_method(&mut raw, "_zed/arr");
    assert_eq!(
        note.text(),
        r#"{"jsonrpc":"2.0","method":"_zed/arr","params":[23, 1e2]}"#
    );
    let asked = until_method(&mut raw, "_zed/arr");
    assert_eq!(
        asked.text(),
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"_zed/arr","params":[1,2]}}"#,
            asked.value["id"]
        )
    );
    raw.line(&json!({"jsonrpc": "2.0", "id": asked.value["id"], "result": {"ok": 1}}).to_string());
    let answer = raw.answer(&json!(prompt)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    a.until("the editor's answer", |l| {
        l == r#"{"jsonrpc":"2.0","id":6,"result":{"ok":1}}"#
    });
    let refused = a.until("acpd's refusal", |l| l.contains(r#""id":5"#));
    assert!(refused.contains("-32602"), "{refused}");
    assert!(
        raw.seen[start..]
            .iter()
            .all(|l| !(l.method() == "session/update" && l.value["params"].is_array())),
        "{:?}",
        raw.seen_text()
    );
    close(raw);
}
