//! The network face against clients that do not behave: tokens that are not theirs to use
//! (another's sessions, revoked, expired, an observer's), requests over their rate, a client
//! that stops reading, one whose connection is cut mid-turn. Each is refused or ended with the
//! rule's name and an honest client still gets through. Floods: `network_floods.rs`.

use crate::common;

use std::time::{Duration, Instant};

use common::raw::rss_kib;
use common::remote::{Face, Ws};
use common::*;
use serde_json::json;

/// `acpd_network_refused_total{reason}` from the daemon's metrics.
pub(crate) fn refused(face: &Face, reason: &str) -> f64 {
    let out = face.daemon.cli(&["status", "--metrics"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = format!("acpd_network_refused_total{{reason=\"{reason}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .unwrap_or_else(|| panic!("no {line}"))
        .trim()
        .parse()
        .unwrap()
}

/// An honest client still runs a turn.
pub(crate) fn still_served(face: &Face, token: &str) {
    let mut ws = face.ws(token);
    ws.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let new = ws.call(
        "session/new",
        json!({"cwd": face.daemon.env.path(), "mcpServers": []}),
    );
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let answer = ws.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "still here"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
}

pub(crate) fn pid(face: &Face) -> u32 {
    face.daemon.pid().as_raw() as u32
}

#[test]
fn a_token_over_its_requests_per_second_is_answered_429_naming_the_limit() {
    let face = Face::start("requests_per_second = 5");
    let token = face.token("script", &[]);
    let http = common::remote::Http::new(&face.url, &face.cert, Some(&token));
    let replies: Vec<_> = (0..20)
        .map(|_| {
            http.post(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "nothing"}),
                None,
                None,
            )
        })
        .collect();
    let limited: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert!(limited.len() >= 10, "{replies:?}");
    assert!(
        limited[0].body.contains("requests_per_second"),
        "{}",
        limited[0].body
    );
    assert_eq!(limited[0].header("retry-after"), Some("1"));
    assert!(refused(&face, "requests_per_second") >= 10.0);
}

#[test]
fn a_websocket_client_that_stops_reading_is_closed_and_costs_a_bounded_buffer() {
    let face = Face::start("write_timeout = \"2s\"");
    let token = face.token("phone", &[]);
    let mut ws = face.ws(&token);
    ws.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let new = ws.call(
        "session/new",
        json!({"cwd": face.daemon.env.path(), "mcpServers": []}),
    );
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let before = rss_kib(pid(&face));
    // 200 MB of output the client never reads.
    ws.send(
        &json!({"jsonrpc": "2.0", "id": 9, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": ":chunks 200000 1000"}]}}),
    );
    let ended = eventually(Duration::from_secs(30), || {
        refused(&face, "client_not_reading") >= 1.0
    });
    assert!(
        ended,
        "the connection was not closed; log: {}",
        face.daemon.log()
    );
    let grown = rss_kib(pid(&face)).saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "acpd grew {grown} KiB for a client that does not read"
    );
    // What the client reads now ends, never hangs.
    let started = Instant::now();
    while ws.recv().is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stream never ended"
        );
    }
    still_served(&face, &token);
}

/// The face with the echo agent keeping its sessions (`--sessions`), so they load again.
fn keeping_sessions() -> Face {
    let env = Env::raw("");
    let sessions = env.path().join("echo-sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let config = format!(
        "default_provider = \"kept\"\n[providers.kept]\ncommand = [\"{BIN}\", \"agent\", \
         \"echo\", \"--sessions\", \"{}\"]\n",
        sessions.display()
    );
    Face::with_config(env, &config)
}

#[test]
fn a_connection_cut_mid_turn_detaches_its_session_which_loads_again() {
    let face = keeping_sessions();
    let token = face.token("laptop", &[]);
    let mut ws = face.ws(&token);
    ws.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let cwd = face.daemon.env.path().to_path_buf();
    let new = ws.call("session/new", json!({"cwd": cwd, "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    ws.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "before the cut"}]}),
    );
    ws.send(
        &json!({"jsonrpc": "2.0", "id": 50, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": ":sleep 60000"}]}}),
    );
    // The cable is pulled: no close frame, no FIN from the client's side of the protocol.
    ws.socket
        .get_mut()
        .sock
        .shutdown(std::net::Shutdown::Both)
        .unwrap();
    drop(ws);
    assert!(
        eventually(Duration::from_secs(20), || face.daemon.status()["sessions"]
            ["detached"]
            == 1),
        "the session was not detached: {}",
        face.daemon.status()
    );
    let mut again = face.ws(&token);
    again.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let load = again.call(
        "session/load",
        json!({"sessionId": sid, "cwd": cwd, "mcpServers": []}),
    );
    assert!(load.get("result").is_some(), "{load}");
    // The turn the cut left running goes on (a detached session keeps working); the editor
    // that came back ends it, then prompts again.
    again
        .send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}));
    let answer = again.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "after the cut"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
}

/// What answers `method` with `params` gets, its id left out (compared across tokens).
fn answer_of(ws: &mut Ws, method: &str, params: serde_json::Value) -> serde_json::Value {
    let mut answer = ws.call(method, params);
    answer.as_object_mut().unwrap().remove("id");
    answer
}

/// The "100 connections each holding an unfinished 16 MiB message", on the network
/// face: 50 WebSockets and 50 POST bodies each send 16 MiB minus a byte of one message and fall
/// silent. acpd's peak memory stays within the budget for unfinished messages plus a margin,
/// an honest client is served while they are held, and each is ended at its message's deadline.
#[test]
fn a_second_token_finds_nothing_of_the_firsts_sessions() {
    let face = keeping_sessions();
    let cwd = face.daemon.env.path().to_path_buf();
    let (a, b) = (face.token("alice", &[]), face.token("bob", &[]));
    let mut alice = face.ws(&a);
    alice.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let new = alice.call("session/new", json!({"cwd": cwd, "mcpServers": []}));
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    alice.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "alice's"}]}),
    );
    let ghost = "acpd-00000000-0000-4000-8000-000000000000";
    let mut bob = face.ws(&b);
    bob.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let listed = bob.call("session/list", json!({}));
    assert!(!listed.to_string().contains(&sid), "{listed}");
    for (method, extra) in [
        ("session/load", json!({"cwd": cwd, "mcpServers": []})),
        ("session/resume", json!({"cwd": cwd, "mcpServers": []})),
        (
            "session/prompt",
            json!({"prompt": [{"type": "text", "text": "bob's"}]}),
        ),
        ("session/close", json!({})),
        ("session/delete", json!({})),
    ] {
        let with = |id: &str| {
            let mut p = extra.clone();
            p["sessionId"] = json!(id);
            p
        };
        let theirs = answer_of(&mut bob, method, with(&sid));
        let unknown = answer_of(&mut bob, method, with(ghost));
        assert_eq!(
            theirs.to_string().replace(&sid, "ID"),
            unknown.to_string().replace(ghost, "ID"),
            "{method}: another token's session is not answered as an unknown one"
        );
    }
    // Alice's session is untouched.
    let answer = alice.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "still mine"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // A connection id is no key either: Bob's token cannot use Alice's HTTP connection.
    let http_a = common::remote::Http::new(&face.url, &face.cert, Some(&a));
    let init = http_a.post(
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
        None,
        None,
    );
    let conn = init.header("acp-connection-id").unwrap().to_owned();
    let http_b = common::remote::Http::new(&face.url, &face.cert, Some(&b));
    let r = http_b.post(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}),
        Some(&conn),
        None,
    );
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(http_b.sse(&conn, None).unwrap_err().status, 404);
    assert_eq!(http_b.delete(&conn).status, 404);
}

#[test]
fn a_revoked_or_expired_token_loses_its_live_connections_at_once() {
    let face = Face::start("");
    let revoked = face.token("stolen", &[]);
    let brief = face.token("brief", &["--expires", "3s"]);
    let mut gone = face.ws(&revoked);
    gone.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let mut ends = face.ws(&brief);
    ends.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let out = face
        .daemon
        .env
        .acpd()
        .args(["token", "revoke", "stolen", "--socket"])
        .arg(&face.daemon.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = Instant::now();
    let closed = gone
        .recv()
        .expect_err("the revoked token's connection stayed open");
    assert!(closed.starts_with("1008"), "{closed}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let closed = ends
        .recv()
        .expect_err("the expired token's connection stayed open");
    assert!(closed.starts_with("1008"), "{closed}");
    for token in [&revoked, &brief] {
        let refused = Ws::connect(
            &face.url,
            &face.cert,
            &[("Authorization", &format!("Bearer {token}"))],
        )
        .err()
        .expect("a dead token was accepted");
        assert_eq!(refused.status, 401);
    }
    assert!(refused(&face, "token_revoked") >= 1.0);
    assert!(refused(&face, "token_expired") >= 1.0);
}

#[test]
fn an_observer_token_reads_but_never_opens_changes_or_prompts() {
    let face = Face::start("");
    let observer = face.token("watcher", &["--role", "observer"]);
    let mut ws = face.ws(&observer);
    let init = ws.call(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    assert!(init.get("result").is_some(), "{init}");
    let listed = ws.call("session/list", json!({}));
    assert!(listed.get("result").is_some(), "{listed}");
    let cwd = face.daemon.env.path().to_path_buf();
    for (method, params) in [
        ("session/new", json!({"cwd": cwd, "mcpServers": []})),
        (
            "session/load",
            json!({"sessionId": "acpd-00000000-0000-4000-8000-000000000000", "cwd": cwd, "mcpServers": []}),
        ),
        ("_acpd/subagent/start", json!({"prompt": "hi"})),
        ("_echo/anything", json!({})),
    ] {
        let answer = ws.call(method, params);
        assert_eq!(answer["error"]["code"], -33015, "{method}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("observer"),
            "{answer}"
        );
    }
    assert_eq!(face.daemon.status()["sessions"]["attached"], 0);
}

#[test]
fn an_http_connection_whose_event_stream_is_cut_detaches_its_session() {
    let face = Face::start("detach_timeout = \"60s\"\nhttp_keepalive = \"1s\"");
    let token = face.token("laptop", &[]);
    let http = common::remote::Http::new(&face.url, &face.cert, Some(&token));
    let init = http.post(
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
        None,
        None,
    );
    let conn = init.header("acp-connection-id").unwrap().to_owned();
    let main = http.sse(&conn, None).unwrap();
    let new = json!({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                     "params": {"cwd": face.daemon.env.path(), "mcpServers": []}});
    assert_eq!(http.post(&new, Some(&conn), None).status, 202);
    let mut seen = Vec::new();
    common::remote::wait_for(&main, &mut seen, |m| m["id"] == 1);
    assert_eq!(face.daemon.status()["sessions"]["attached"], 1);
    // The client vanishes: its event stream's TCP connection ends, nothing else comes.
    drop(main);
    drop(http);
    assert!(
        eventually(Duration::from_secs(30), || face.daemon.status()["sessions"]
            ["detached"]
            == 1),
        "the session was not detached: {}",
        face.daemon.status()
    );
    assert!(refused(&face, "http_idle_timeout") >= 1.0);
}
