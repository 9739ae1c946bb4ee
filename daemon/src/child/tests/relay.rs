//! Relay mode: what passes between the parent and the child, and detached sessions.

use super::*;

#[tokio::test]
async fn relay_forwards_only_the_childs_own_acp_traffic_in_order() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let (parent_side, acpd_side) = tokio::io::duplex(1 << 20);
    let (acpd_read, acpd_write): (ReadHalf<DuplexStream>, WriteHalf<DuplexStream>) =
        tokio::io::split(acpd_side);
    let conn = wire::connect(acpd_read, acpd_write, 1 << 20);
    let mut parent = LineReader::new(parent_side, WireLimits::default());
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: "minted".into(),
        serves: ParentServes::default(),
        first: crate::child::First::Nothing,
        detach: None,
        on_closed: None,
    });
    let params = serde_json::value::RawValue::from_string(
        json!({ "sessionId": "minted", "prompt": [] }).to_string(),
    )
    .unwrap();
    child
        .call(Id::Num(77), "session/prompt".into(), Some(params), None)
        .unwrap();
    let (id, p) = fake.request("session/prompt").await;
    assert_eq!(p["sessionId"], "child-session", "the child sees its own id");
    let forged =
        json!({ "jsonrpc": "2.0", "method": "_acpd/subagent/ended", "params": { "runId": "x" } });
    let lines = [
        forged.to_string(),
        fake.update("someone-else", "FOREIGN"),
        fake.chunk("hello"),
        Fake::answer(&id, json!({ "stopReason": "end_turn" })),
    ];
    fake.send(&lines).await;
    let Some(Ok(Message::Notification { method, params })) = parent.next().await else {
        panic!("the update comes first")
    };
    assert_eq!(method, "session/update");
    let params: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
    assert_eq!(params["sessionId"], "minted");
    assert_eq!(params["update"]["content"]["text"], "hello");
    let Some(Ok(Message::Response { id, outcome })) = parent.next().await else {
        panic!("then the answer, with the parent's id")
    };
    assert_eq!(id, Some(Id::Num(77)));
    assert!(outcome.unwrap().get().contains("end_turn"));
    // A bad line ends the session; an open call gets an error that says why.
    let params = serde_json::value::RawValue::from_string(
        json!({ "sessionId": "minted", "prompt": [] }).to_string(),
    )
    .unwrap();
    child
        .call(Id::Num(78), "session/prompt".into(), Some(params), None)
        .unwrap();
    fake.request("session/prompt").await;
    fake.send(&["{not json".to_string()]).await;
    let Some(Ok(Message::Response { id, outcome })) = parent.next().await else {
        panic!("the open prompt is answered")
    };
    assert_eq!(id, Some(Id::Num(78)));
    let error = outcome.unwrap_err();
    assert_eq!(error.data_value().unwrap()["category"], "protocol");
    assert!(matches!(
        child.ended().await,
        Some(crate::child::RelayEnd::Protocol)
    ));
    child.shut().await;
}

#[tokio::test]
async fn relay_refuses_a_child_request_that_names_another_session() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let (parent_side, acpd_side) = tokio::io::duplex(1 << 20);
    let (acpd_read, acpd_write) = tokio::io::split(acpd_side);
    let conn = wire::connect(acpd_read, acpd_write, 1 << 20);
    let mut parent = LineReader::new(parent_side, WireLimits::default());
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: "minted".into(),
        serves: ParentServes {
            write_text_file: true,
            ..ParentServes::default()
        },
        first: crate::child::First::Nothing,
        detach: None,
        on_closed: None,
    });
    let dup = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"fs/write_text_file","params":{{"sessionId":"{}","path":"/x","content":"y","sessionId":"acpd-other"}}}}"#,
        fake.session
    );
    let own = json!({ "jsonrpc": "2.0", "id": 6, "method": "fs/write_text_file",
        "params": { "sessionId": fake.session, "path": "/x", "content": "y" } });
    fake.send(&[dup, own.to_string()]).await;
    match fake.next().await {
        Message::Response { id, outcome } => {
            assert_eq!(id, Some(Id::Num(5)));
            assert_eq!(outcome.unwrap_err().code, -32602);
        }
        other => panic!("{other:?}"),
    }
    // Only the well-formed one reaches the parent, under the parent's session id.
    let Some(Ok(Message::Request { method, params, .. })) = parent.next().await else {
        panic!("the parent is asked")
    };
    assert_eq!(method, "fs/write_text_file");
    let params: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
    assert_eq!(params["sessionId"], "minted");
    child.shut().await;
}

#[tokio::test]
async fn relay_passes_a_parents_extension_notification_to_the_child() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let (_parent_side, acpd_side) = tokio::io::duplex(1 << 20);
    let (acpd_read, acpd_write) = tokio::io::split(acpd_side);
    let conn = wire::connect(acpd_read, acpd_write, 1 << 20);
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: "minted".into(),
        serves: ParentServes::default(),
        first: crate::child::First::Nothing,
        detach: None,
        on_closed: None,
    });
    let params = serde_json::value::RawValue::from_string(
        json!({ "sessionId": "minted", "x": 1 }).to_string(),
    )
    .unwrap();
    child.notify("_zed/hint".into(), params);
    match fake.next().await {
        Message::Notification { method, params } => {
            assert_eq!(method, "_zed/hint");
            let p: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
            assert_eq!(
                (p["sessionId"].as_str(), p["x"].as_i64()),
                (Some("child-session"), Some(1))
            );
        }
        other => panic!("{other:?}"),
    }
    child.shut().await;
}

/// A relay toward a parent connection over duplex pipes; the parent's end is returned so the
/// pipe stays open.
fn relay_to(child: &Child, detach: Option<Duration>) -> LineReader<DuplexStream> {
    let (parent_side, acpd_side) = tokio::io::duplex(1 << 20);
    let (acpd_read, acpd_write) = tokio::io::split(acpd_side);
    let conn = wire::connect(acpd_read, acpd_write, 1 << 20);
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: "minted".into(),
        serves: ParentServes::default(),
        first: crate::child::First::Nothing,
        detach,
        on_closed: None,
    });
    LineReader::new(parent_side, WireLimits::default())
}

#[tokio::test]
async fn a_detached_session_ends_after_detach_timeout() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let _parent = relay_to(&child, Some(Duration::from_secs(30)));
    let t0 = Instant::now();
    child.detach();
    let end = tokio::time::timeout(Duration::from_secs(3600), child.ended())
        .await
        .expect("the detached session ends");
    at(t0, Duration::from_secs(30), "expired at detach_timeout");
    assert!(
        matches!(end, Some(crate::child::RelayEnd::Expired)),
        "{end:?}"
    );
    child.shut().await;
    assert!(
        fake.reader.next().await.is_none(),
        "the agent sees its input close"
    );
}

#[tokio::test]
async fn a_session_attached_again_within_detach_timeout_lives_on() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let _first = relay_to(&child, Some(Duration::from_secs(30)));
    child.detach();
    tokio::time::sleep(Duration::from_secs(29)).await;
    let mut second = relay_to(&child, Some(Duration::from_secs(30)));
    // Well past the first detach's deadline: still attached, still relaying.
    let ended = tokio::time::timeout(Duration::from_secs(120), child.ended()).await;
    assert!(ended.is_err(), "ended while attached: {ended:?}");
    let params = serde_json::value::RawValue::from_string(
        json!({ "sessionId": "minted", "prompt": [] }).to_string(),
    )
    .unwrap();
    child
        .call(Id::Num(5), "session/prompt".into(), Some(params), None)
        .unwrap();
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "end_turn" }))])
        .await;
    let Some(Ok(Message::Response { id, .. })) = second.next().await else {
        panic!("the second connection gets the answer")
    };
    assert_eq!(id, Some(Id::Num(5)));
    child.shut().await;
}
