//! The network face end to end: a real `acpd serve --listen https://127.0.0.1:0` with a
//! certificate the test makes, reached over WebSocket and Streamable HTTP (POST + SSE) with a
//! token made by `acpd token create` — and refused, with the rule's name, when a request
//! carries no token, a wrong one, or one where tokens must never travel.

use crate::common;

use common::remote::{Face, Http, Ws, wait_for};
use serde_json::{Value, json};

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
           "params": {"protocolVersion": 1, "clientCapabilities": {}}})
}

/// The text of the agent_message_chunk updates among `seen`.
fn said(seen: &[Value]) -> String {
    seen.iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect()
}

#[test]
fn a_websocket_client_runs_a_session_through_the_face() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let mut ws = face.ws(&token);
    let init = ws.call("initialize", initialize()["params"].clone());
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let new = ws.call(
        "session/new",
        json!({"cwd": face.daemon.env.path(), "mcpServers": []}),
    );
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let answer = ws.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "over the network"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(said(&ws.seen), "over the network");
}

#[test]
fn a_streamable_http_client_runs_a_session_through_the_face() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let http = Http::new(&face.url, &face.cert, Some(&token));
    let init = http.post(&initialize(), None, None);
    assert_eq!(init.status, 200, "{init:?}");
    assert_eq!(init.json()["result"]["protocolVersion"], 1);
    let conn = init
        .header("acp-connection-id")
        .expect("Acp-Connection-Id")
        .to_owned();
    let main = http.sse(&conn, None).unwrap();
    let mut seen = Vec::new();
    let new = json!({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                     "params": {"cwd": face.daemon.env.path(), "mcpServers": []}});
    assert_eq!(http.post(&new, Some(&conn), None).status, 202);
    let created = wait_for(&main, &mut seen, |m| m["id"] == 1);
    let sid = created["result"]["sessionId"].as_str().unwrap().to_owned();
    let stream = http.sse(&conn, Some(&sid)).unwrap();
    let prompt = json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "over http"}]}});
    // A session's message without its header is refused, as the transport RFD has it.
    assert_eq!(http.post(&prompt, Some(&conn), None).status, 400);
    let r = http.post(&prompt, Some(&conn), Some(&sid));
    assert_eq!(r.status, 202, "{r:?}");
    let mut updates = Vec::new();
    let answer = wait_for(&stream, &mut updates, |m| m["id"] == 2);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(said(&updates), "over http");
    // A second reader of the same stream is refused; DELETE ends the connection.
    assert_eq!(http.sse(&conn, Some(&sid)).unwrap_err().status, 409);
    assert_eq!(http.delete(&conn).status, 202);
    assert_eq!(http.post(&prompt, Some(&conn), Some(&sid)).status, 404);
}

#[test]
fn requests_without_a_valid_token_get_nothing_and_name_the_rule() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let none = Http::new(&face.url, &face.cert, None);
    let r = none.post(&initialize(), None, None);
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"acpd\""));
    let wrong = Http::new(&face.url, &face.cert, Some("acpd_not-a-token-acpd-made"));
    let r = wrong.post(&initialize(), None, None);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(
        r.header("www-authenticate")
            .unwrap()
            .contains("invalid_token")
    );
    // A token in the URL is refused even with a good header, and never echoed or logged.
    let mut leaky = Http::new(&face.url, &face.cert, Some(&token));
    leaky.url = format!("{}?access_token={token}", leaky.url);
    let r = leaky.post(&initialize(), None, None);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(!r.body.contains(&token));
    for (k, v) in [
        ("Cookie", format!("session={token}")),
        ("Sec-WebSocket-Protocol", token.clone()),
    ] {
        let refused = Ws::connect(
            &face.url,
            &face.cert,
            &[("Authorization", &format!("Bearer {token}")), (k, &v)],
        )
        .err()
        .unwrap_or_else(|| panic!("{k} with a token was accepted"));
        assert_eq!(refused.status, 400, "{k}: {refused:?}");
    }
    let refused = Ws::connect(&face.url, &face.cert, &[])
        .err()
        .expect("no token, no socket");
    assert_eq!(refused.status, 401);
    assert!(
        !face.daemon.log().contains(&token),
        "the token reached the log"
    );
    let metrics = face.daemon.cli(&["status", "--metrics"]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    for reason in [
        "unauthenticated",
        "token_unknown",
        "credentials_in_url",
        "credentials_in_cookie",
    ] {
        let line = format!("acpd_network_refused_total{{reason=\"{reason}\"}}");
        let n: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line}: {text}"))
            .trim()
            .parse()
            .unwrap();
        assert!(n >= 1.0, "{line} {n}");
    }
}
