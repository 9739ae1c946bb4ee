//! Principals over a real connection: `serve` driven through a pipe pair, as the network face
//! drives it, with the session map of a token that opened a session. Every other principal
//! (another token, acpd's own user over the socket) gets exactly the answers it gets for an
//! id nobody has, and changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::store::tokens::Role;
use crate::store::{SessionRow, Store};

/// A provider whose agent never starts: a load that gets as far as starting it fails there.
const NO_AGENT: &str = "/nonexistent/acpd-principal-test-agent";

fn base(store: &Store) -> ServerContext {
    let config = crate::config::Config::builtin(vec![NO_AGENT.into()]);
    ServerContext {
        registry: Registry::new(config, crate::registry::DepthContext::default()),
        caller_cwd: None,
        daemon: Arc::default(),
        shutdown: CancellationToken::new(),
        sessions: Sessions::new(store.clone(), Some(Duration::from_secs(60))),
        principal: None,
        origin: None,
    }
}

fn token(id: i64, name: &str) -> Principal {
    Principal::Token {
        id,
        name: name.into(),
        role: Role::Controller,
    }
}

/// A connection of `who`, initialized.
async fn connect(ctx: &ServerContext, who: &Principal) -> wire::Connection {
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let (read, write) = tokio::io::split(theirs);
    let ctx = ServerContext {
        principal: Some(who.clone()),
        ..ctx.clone()
    };
    tokio::spawn(serve(read, write, ctx));
    let (read, write) = tokio::io::split(ours);
    let conn = wire::connect(read, write, acpd_protocol::codec::DEFAULT_MAX_LINE);
    let init = json!({"protocolVersion": 1, "clientCapabilities": {},
        "_meta": {"acpd": {"query": true}}});
    conn.peer.request("initialize", &init).await.unwrap();
    conn
}

/// The answer to `method`, with `sid` written as `ID` wherever it stands: what tells one id's
/// answer from another's.
async fn ask(conn: &wire::Connection, method: &str, sid: &str) -> Value {
    let params = json!({"sessionId": sid, "cwd": "/w", "mcpServers": []});
    let answer = tokio::time::timeout(Duration::from_secs(30), conn.peer.request(method, &params))
        .await
        .expect("answered");
    let answer = match answer {
        Ok(result) => json!({"result": serde_json::from_str::<Value>(result.get()).unwrap()}),
        Err(wire::CallError::Rpc(e)) => json!({"code": e.code, "message": e.message,
            "data": e.data_value()}),
        Err(wire::CallError::Closed) => panic!("{method}: the connection closed"),
    };
    serde_json::from_str(&answer.to_string().replace(sid, "ID")).unwrap()
}

async fn listed(conn: &wire::Connection) -> Vec<String> {
    let answer = conn.peer.request("session/list", &json!({})).await.unwrap();
    let answer: Value = serde_json::from_str(answer.get()).unwrap();
    answer["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_tokens_sessions_are_unknown_ids_to_every_other_principal() {
    let store = Store::in_memory();
    let ctx = base(&store);
    let owner = token(1, "laptop");
    let row = SessionRow {
        acpd_id: "acpd-of-laptop".into(),
        provider: "echo".into(),
        child_session_id: "c1".into(),
        cwd: "/w".into(),
        title: Some("laptop's".into()),
        updated_at: crate::store::now(),
        owner: owner.row_owner(),
        lease: None,
    };
    store.insert(row.clone()).await.unwrap();
    let own_uid = Principal::Uid(nix::unistd::Uid::effective().as_raw());
    for other in [token(2, "phone"), own_uid] {
        let conn = connect(&ctx, &other).await;
        assert!(listed(&conn).await.is_empty(), "{other:?} lists it");
        for method in [
            "session/load",
            "session/resume",
            "session/close",
            "session/delete",
        ] {
            let theirs = ask(&conn, method, "acpd-of-laptop").await;
            let nobodys = ask(&conn, method, "acpd-of-nobody").await;
            assert_eq!(theirs, nobodys, "{other:?}: {method}");
        }
        conn.peer.close();
    }
    assert_eq!(
        store.get("acpd-of-laptop").await.unwrap(),
        Some(row),
        "a refused request changed the row"
    );
    // Its owner sees it, and is answered otherwise: the test tells the two apart.
    let conn = connect(&ctx, &owner).await;
    assert_eq!(listed(&conn).await, ["acpd-of-laptop"]);
    for method in ["session/load", "session/close"] {
        let mine = ask(&conn, method, "acpd-of-laptop").await;
        let nobodys = ask(&conn, method, "acpd-of-nobody").await;
        assert_ne!(mine, nobodys, "{method}");
    }
    conn.peer.close();
}

/// Reading the tokens again is the operator's: acpd's own user over the socket, never a token
/// nor another user; a refused ask changes nothing (a token created since stays unknown).
#[tokio::test]
async fn only_acpds_own_user_reloads_the_tokens() {
    let store = Store::in_memory();
    let book = crate::store::tokens::TokenBook::new(store.clone());
    let ctx = ServerContext {
        daemon: Arc::new(DaemonInfo {
            tokens: Some(book.clone()),
            ..DaemonInfo::default()
        }),
        ..base(&store)
    };
    let (_, made) = store
        .create_token("laptop", Role::Controller, None)
        .await
        .unwrap();
    let own = nix::unistd::Uid::effective().as_raw();
    for who in [token(1, "laptop"), Principal::Uid(own.wrapping_add(1))] {
        let conn = connect(&ctx, &who).await;
        let answer = ask(&conn, name::TOKENS_RELOAD, "unused-session-id").await;
        assert_eq!(answer["data"]["code"], "NOT_PERMITTED", "{who:?}: {answer}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains("only acpd's own user"),
            "{answer}"
        );
        conn.peer.close();
    }
    assert!(book.verify(&made).is_err());
    let conn = connect(&ctx, &Principal::Uid(own)).await;
    let answer = ask(&conn, name::TOKENS_RELOAD, "unused-session-id").await;
    assert_eq!(answer, json!({"result": {}}));
    assert_eq!(&*book.verify(&made).unwrap().name, "laptop");
    conn.peer.close();
}
