//! A turn's clocks on paused time: idle, run and write timeouts, cancel grace, permission
//! waits, tool calls, and what never reaches a turn's output.

use super::*;

#[tokio::test]
async fn an_idle_child_is_cancelled_after_idle_timeout_then_reported_hung() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let t0 = Instant::now();
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    fake.request("session/prompt").await;
    fake.notification("session/cancel").await;
    at(t0, Duration::from_secs(10), "cancelled at idle_timeout");
    let report = turn.await.unwrap();
    at(t0, Duration::from_secs(12), "given up after cancel_grace");
    assert!(matches!(report.end, TurnEnd::Idle), "{report:?}");
    assert!(report.child_spent);
    child.shut().await;
}

#[tokio::test]
async fn run_timeout_ends_a_chatty_turn_and_wins_over_the_childs_answer() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let t0 = Instant::now();
    let mut ctl = control();
    ctl.run_timeout = Some(Duration::from_secs(30));
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), ctl).await }
    });
    let (id, _) = fake.request("session/prompt").await;
    // An update every 5 s keeps the idle clock from firing; only run_timeout can end it.
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => fake.send(&[fake.chunk("tick ")]).await,
            m = fake.next() => {
                assert!(matches!(m, Message::Notification { ref method, .. } if method == "session/cancel"), "{m:?}");
                break;
            }
        }
    }
    at(t0, Duration::from_secs(30), "");
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "cancelled" }))])
        .await;
    let report = turn.await.unwrap();
    assert!(matches!(report.end, TurnEnd::RunTimeout), "{report:?}");
    assert_eq!(text(&report), "tick ".repeat(5), "partial output kept");
    child.shut().await;
}

#[tokio::test]
async fn a_cancel_confirmed_within_the_grace_is_the_childs_stop_reason() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let ctl = control();
    let cancel = ctl.cancel.clone();
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), ctl).await }
    });
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[fake.chunk("partial")]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    fake.notification("session/cancel").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "cancelled" }))])
        .await;
    let report = turn.await.unwrap();
    assert!(
        matches!(
            report.end,
            TurnEnd::Stopped {
                reason: ChildStopReason::Cancelled,
                ..
            }
        ),
        "{report:?}"
    );
    assert!(report.cancel_requested && !report.child_spent);
    assert_eq!(text(&report), "partial");
    child.shut().await;
}

#[tokio::test]
async fn a_cancel_the_child_ignores_is_abandoned_after_the_grace() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let ctl = control();
    let cancel = ctl.cancel.clone();
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), ctl).await }
    });
    fake.request("session/prompt").await;
    let t0 = Instant::now();
    cancel.cancel();
    fake.notification("session/cancel").await;
    let report = turn.await.unwrap();
    at(t0, Duration::from_secs(2), "");
    assert!(matches!(report.end, TurnEnd::Abandoned), "{report:?}");
    assert!(report.child_spent);
    child.shut().await;
}

#[tokio::test]
async fn the_idle_clock_waits_for_a_permission_answer_and_restarts_after_it() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let (tx, mut rx) = mpsc::channel(4);
    let mut ctl = control();
    ctl.events = Some(tx);
    ctl.asks = true;
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), ctl).await }
    });
    fake.request("session/prompt").await;
    let ask = json!({ "jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission", "params": {
        "sessionId": fake.session, "toolCall": { "toolCallId": "t1" },
        "options": [{ "optionId": "yes", "name": "Yes", "kind": "allow_once" }],
    }});
    fake.send(&[ask.to_string()]).await;
    let Some(ChildEvent::Ask(ask)) = rx.recv().await else {
        panic!("the owner is asked")
    };
    // A person takes 25 s, well past idle_timeout: not the child hanging.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let answered = Instant::now();
    let chosen =
        acpd_protocol::permission::decide(&ask.request, acpd_protocol::permission::Decision::Allow);
    ask.reply.send(chosen).unwrap();
    match fake.next().await {
        Message::Response { id, outcome } => {
            assert_eq!(id, Some(Id::Str("perm-1".into())));
            assert!(outcome.unwrap().get().contains("yes"));
        }
        other => panic!("{other:?}"),
    }
    fake.notification("session/cancel").await;
    at(
        answered,
        Duration::from_secs(10),
        "idle counts from the answer",
    );
    let report = turn.await.unwrap();
    assert!(matches!(report.end, TurnEnd::Idle), "{report:?}");
    child.shut().await;
}

#[tokio::test]
async fn a_bad_line_just_before_the_answer_fails_the_turn() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    let (id, _) = fake.request("session/prompt").await;
    let lines = [
        fake.chunk("almost"),
        "this is not json".to_string(),
        Fake::answer(&id, json!({ "stopReason": "end_turn" })),
    ];
    fake.send(&lines).await;
    let report = turn.await.unwrap();
    assert!(matches!(report.end, TurnEnd::Protocol), "{report:?}");
    assert!(report.child_spent);
    assert_eq!(text(&report), "almost", "partial output kept");
    child.shut().await;
}

#[tokio::test]
async fn updates_between_turns_and_foreign_updates_never_reach_the_output() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    let (id, _) = fake.request("session/prompt").await;
    let dup = format!(
        r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{0}","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"DUP"}}}},"sessionId":"other"}}}}"#,
        fake.session
    );
    let none = r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"NONE"}}}}"#;
    let lines = [
        fake.update("someone-else", "FOREIGN"),
        dup,
        none.to_string(),
        fake.chunk("one"),
        Fake::answer(&id, json!({ "stopReason": "end_turn" })),
        fake.chunk("LATE"),
    ];
    fake.send(&lines).await;
    let first = turn.await.unwrap();
    assert_eq!(text(&first), "one");
    assert!(!first.child_spent);
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    let (id, _) = fake.request("session/prompt").await;
    let lines = [
        fake.chunk("two"),
        Fake::answer(&id, json!({ "stopReason": "end_turn" })),
    ];
    fake.send(&lines).await;
    let second = turn.await.unwrap();
    assert_eq!(
        text(&second),
        "two",
        "the late update of turn 1 is not in turn 2"
    );
    child.shut().await;
}

#[tokio::test]
async fn a_child_that_stops_reading_is_hung_after_write_timeout() {
    let (child, mut fake) = start(provider(|p| p.idle_timeout = None), false).await;
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    fake.request("session/prompt").await;
    let t0 = Instant::now();
    // The agent stops reading its input and floods requests acpd must answer (-32601 each):
    // the answers pile up until the outbox gives up after write_timeout.
    for i in 0..20_000 {
        let req = json!({ "jsonrpc": "2.0", "id": i, "method": "fs/read_text_file", "params": { "path": "/x" } });
        let line = [req.to_string()];
        let send = fake.send(&line);
        if tokio::time::timeout(Duration::from_millis(1), send)
            .await
            .is_err()
        {
            break;
        }
    }
    let report = turn.await.unwrap();
    assert!(matches!(report.end, TurnEnd::Idle), "{report:?}");
    assert!(
        t0.elapsed() >= Duration::from_secs(30),
        "{:?}",
        t0.elapsed()
    );
    child.shut().await;
}

fn tool_update(fake: &Fake, kind: &str, id: &str, status: Option<&str>) -> String {
    let mut update = json!({ "sessionUpdate": kind, "toolCallId": id, "title": "cargo test" });
    if let Some(status) = status {
        update["status"] = json!(status);
    }
    json!({ "jsonrpc": "2.0", "method": "session/update",
        "params": { "sessionId": fake.session, "update": update } })
    .to_string()
}

#[tokio::test]
async fn a_long_tool_call_is_not_hung_and_the_idle_clock_restarts_when_it_ends() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    fake.request("session/prompt").await;
    // Two tool calls: one reported pending (no status), one in progress; a quiet minute.
    fake.send(&[
        tool_update(&fake, "tool_call", "t1", None),
        tool_update(&fake, "tool_call", "t2", Some("in_progress")),
    ])
    .await;
    let quiet = tokio::time::timeout(Duration::from_secs(60), fake.next()).await;
    assert!(quiet.is_err(), "no cancel while tool calls run: {quiet:?}");
    // An update without a status changes nothing; t1 ends; t2 still holds the clock.
    fake.send(&[
        tool_update(&fake, "tool_call_update", "t2", None),
        tool_update(&fake, "tool_call_update", "t1", Some("completed")),
    ])
    .await;
    let quiet = tokio::time::timeout(Duration::from_secs(60), fake.next()).await;
    assert!(quiet.is_err(), "t2 still runs: {quiet:?}");
    fake.send(&[tool_update(&fake, "tool_call_update", "t2", Some("failed"))])
        .await;
    let ended = Instant::now();
    fake.notification("session/cancel").await;
    at(
        ended,
        Duration::from_secs(10),
        "idle counts from the last tool call's end",
    );
    let report = turn.await.unwrap();
    assert!(matches!(report.end, TurnEnd::Idle), "{report:?}");
    child.shut().await;
}
