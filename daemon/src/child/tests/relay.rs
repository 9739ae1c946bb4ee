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
        confinement: None,
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
    // The editor is told why the line was refused, as the log says it, and what to do.
    let Some(crate::child::RelayEnd::Protocol(why)) = child.ended().await else {
        panic!("the session ends as a protocol failure")
    };
    assert!(!why.is_empty());
    assert!(
        error.message.contains(&format!("({why})")),
        "{}",
        error.message
    );
    assert!(
        error.message.contains("start a new one"),
        "{}",
        error.message
    );
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
        confinement: None,
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
        confinement: None,
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
pub(super) fn relay_to(child: &Child, detach: Option<Duration>) -> LineReader<DuplexStream> {
    relay_as(child, "minted", detach)
}

/// [`relay_to`] a parent that knows the session as `session_id`.
fn relay_as(child: &Child, session_id: &str, detach: Option<Duration>) -> LineReader<DuplexStream> {
    let (parent_side, acpd_side) = tokio::io::duplex(1 << 20);
    let (acpd_read, acpd_write) = tokio::io::split(acpd_side);
    let conn = wire::connect(acpd_read, acpd_write, 1 << 20);
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: session_id.into(),
        serves: ParentServes::default(),
        confinement: None,
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

/// Chunks of one shape before a detach and after the next attach: the second editor's chunks
/// name the session as it knows it, not as the first did (the kept shape held the first's id).
#[tokio::test]
async fn chunks_after_an_attach_name_the_session_as_the_new_editor_knows_it() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let session = fake.session.clone();
    let chunk = |text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
        )
    };
    let mut first = relay_as(&child, "first-id", Some(Duration::from_secs(30)));
    fake.send(&[chunk("one"), chunk("two")]).await;
    for _ in 0..2 {
        let next = tokio::time::timeout(Duration::from_secs(10), first.next()).await;
        let Ok(Some(Ok(Message::Notification { params, .. }))) = next else {
            panic!("an update for the first editor: {next:?}")
        };
        let params: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
        assert_eq!(params["sessionId"], "first-id");
    }
    child.detach();
    let mut second = relay_as(&child, "second-id", Some(Duration::from_secs(30)));
    // Attached once the second editor's call reaches the agent (updates read while detached
    // are dropped).
    let prompt = raw(json!({ "sessionId": "second-id", "prompt": [] }));
    child
        .call(Id::Num(5), "session/prompt".into(), Some(prompt), None)
        .unwrap();
    let reached = tokio::time::timeout(Duration::from_secs(10), fake.request("session/prompt"));
    assert!(
        reached.await.is_ok(),
        "the second editor's prompt never reached the agent"
    );
    fake.send(&[chunk("three"), chunk("four")]).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        let next = tokio::time::timeout(Duration::from_secs(10), second.next()).await;
        match next.expect("the chunks reach the second editor") {
            Some(Ok(Message::Notification { method, params })) if method == "session/update" => {
                let params: serde_json::Value =
                    serde_json::from_str(params.unwrap().get()).unwrap();
                let text = params["update"]["content"]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                got.push((params["sessionId"].as_str().unwrap().to_owned(), text));
            }
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    let second_id = |t: &str| ("second-id".to_owned(), t.to_owned());
    assert_eq!(got, [second_id("three"), second_id("four")]);
    child.shut().await;
}

pub(super) fn raw(v: serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(v.to_string()).unwrap()
}

pub(super) fn prompt_params(text: &str) -> Option<Box<serde_json::value::RawValue>> {
    Some(raw(
        json!({ "sessionId": "minted", "prompt": [{ "type": "text", "text": text }] }),
    ))
}

/// The editor stops a turn and at once sends a new prompt and an extension notification,
/// with nothing awaited in between: the agent gets the cancel first, so it ends the old turn.
#[tokio::test]
async fn a_parents_cancel_reaches_the_child_between_what_came_before_and_after_it() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let _parent = relay_to(&child, None);
    child
        .call(
            Id::Num(2),
            "session/prompt".into(),
            prompt_params("first"),
            None,
        )
        .unwrap();
    fake.request("session/prompt").await;
    child.cancel(raw(
        json!({ "sessionId": "minted", "_meta": { "reason": "user" } }),
    ));
    child
        .call(
            Id::Num(3),
            "session/prompt".into(),
            prompt_params("second"),
            None,
        )
        .unwrap();
    child.notify("_zed/hint".into(), raw(json!({ "sessionId": "minted" })));
    match fake.next().await {
        Message::Notification { method, params } if method == "session/cancel" => {
            let p: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
            assert_eq!(
                p,
                json!({ "sessionId": "child-session", "_meta": { "reason": "user" } }),
                "the parent's own fields, under the child's session id"
            );
        }
        other => panic!("the cancel comes first, got {other:?}"),
    }
    let (_, p) = fake.request("session/prompt").await;
    assert_eq!(p["prompt"][0]["text"], "second");
    fake.notification("_zed/hint").await;
    child.shut().await;
}

/// Fills the child's pipe and outbox with 30 large `_zed/fill` notifications, until the
/// relay waits for room, then its command queue with `_zed/queued` ones (the last are dropped).
async fn fill_queue(child: &Child) {
    let pad = "x".repeat(100 * 1024);
    for i in 0..30 {
        let params = raw(json!({ "sessionId": "minted", "i": i, "pad": pad }));
        child.notify("_zed/fill".into(), params);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // More than the queue holds, with nothing awaited.
    for i in 0..400 {
        child.notify(
            "_zed/queued".into(),
            raw(json!({ "sessionId": "minted", "i": i })),
        );
    }
}

/// The child stops reading while the parent floods it, and the command queue fills. A cancel
/// sent then is not lost: it reaches the child after everything queued before it, and nothing
/// the parent sends after it gets there first (what finds the queue still full is refused).
#[tokio::test]
async fn a_cancel_that_finds_the_queue_full_is_sent_in_its_place() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let _parent = relay_to(&child, None);
    fill_queue(&child).await;
    child.cancel(raw(
        json!({ "sessionId": "minted", "_meta": { "late": true } }),
    ));
    child.cancel(raw(json!({ "sessionId": "minted" })));
    let refused = child.call(
        Id::Num(9),
        "session/prompt".into(),
        prompt_params("x"),
        None,
    );
    assert!(
        refused.is_err(),
        "the queue is full: what comes after the cancel waits"
    );
    child.notify("_zed/after".into(), raw(json!({ "sessionId": "minted" })));
    let (mut fills, mut queued) = (0, 0);
    loop {
        match fake.next().await {
            Message::Notification { method, params } => {
                let p: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
                match method.as_str() {
                    "_zed/fill" => {
                        assert_eq!((p["i"].as_i64(), queued), (Some(fills), 0), "in order");
                        fills += 1;
                    }
                    "_zed/queued" => {
                        assert_eq!(p["i"].as_i64(), Some(queued), "in order, none skipped");
                        queued += 1;
                    }
                    "session/cancel" => {
                        assert_eq!(p["_meta"]["late"], true, "the first cancel, as sent: {p}");
                        break;
                    }
                    other => panic!("{other} before the cancel"),
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fills, 30);
    assert!(
        (1..400).contains(&queued),
        "the queue filled: {queued} queued"
    );
    // Once the cancel has gone, the parent's calls pass again, after it.
    child
        .call(
            Id::Num(10),
            "session/prompt".into(),
            prompt_params("next"),
            None,
        )
        .unwrap();
    let (_, p) = fake.request("session/prompt").await;
    assert_eq!(p["prompt"][0]["text"], "next");
    child.shut().await;
}

/// The editor cancels into a full queue and hangs up: the session detaches, and the agent
/// still gets the cancel (the turn nobody will read stops).
#[tokio::test]
async fn a_late_cancel_reaches_the_child_of_a_session_that_detaches() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let _parent = relay_to(&child, Some(Duration::from_secs(30)));
    fill_queue(&child).await;
    child.cancel(raw(
        json!({ "sessionId": "minted", "_meta": { "late": true } }),
    ));
    child.detach();
    // Paused time moves on only once nothing else can happen: the cancel is sent by then.
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match fake.next().await {
                Message::Notification { method, params } if method == "session/cancel" => {
                    let p: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
                    assert_eq!(
                        p,
                        json!({ "sessionId": "child-session", "_meta": { "late": true } })
                    );
                    break;
                }
                Message::Notification { method, .. } if method.starts_with("_zed/") => {}
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    assert!(
        cancelled.is_ok(),
        "the detached session's agent never got the cancel"
    );
    child.shut().await;
}

/// Streamed chunks that differ only in their text go the hot path's shortcut (held to the
/// last chunk's shape): a text that breaks out of its string is not taken by it, and what the
/// full parse makes of such a line holds (a key added beside the text is passed as the data it
/// is; a line that is not JSON ends the session).
#[tokio::test]
async fn a_chunk_that_breaks_out_of_its_text_is_not_passed_as_the_last_one_was() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let mut parent = relay_to(&child, None);
    let session = fake.session.clone();
    let chunk = |text: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"{text}"}}}}}}}}"#
        )
    };
    let lines = [
        chunk("one"),
        chunk(r#"two \"sessionId\":\"someone-else\" \\"#),
        // Valid JSON, but the text's quote closes it: the content gains a key.
        chunk(r#"x","sessionId":"someone-else"#),
        chunk("three é"),
    ];
    fake.send(&lines).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        let Some(Ok(Message::Notification { params, .. })) = parent.next().await else {
            panic!("an update")
        };
        let params: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
        assert_eq!(params["sessionId"], "minted");
        let content = &params["update"]["content"];
        got.push((
            content["text"].as_str().unwrap().to_owned(),
            content.get("sessionId").cloned(),
        ));
    }
    let text = |t: &str| (t.to_owned(), None);
    assert_eq!(
        got,
        [
            text("one"),
            text(r#"two "sessionId":"someone-else" \"#),
            ("x".to_owned(), Some(json!("someone-else"))),
            text("three é"),
        ]
    );
    // A backslash that escapes the closing quote: not JSON, so the session ends.
    fake.send(&[chunk("four \\")]).await;
    assert!(matches!(
        child.ended().await,
        Some(crate::child::RelayEnd::Protocol(_))
    ));
    child.shut().await;
}
