//! How a prompt still open ends when its session ends with no answer of the agent's: the
//! turn ends `cancelled` (issue 30), once, whatever the agent says later.

use super::*;

/// A relay toward a parent connection over duplex pipes, the parent knowing the session as
/// `minted`; the parent's end.
fn parent(child: &Child, detach: Option<Duration>) -> LineReader<DuplexStream> {
    let (parent_side, acpd_side) = tokio::io::duplex(1 << 20);
    let (acpd_read, acpd_write) = tokio::io::split(acpd_side);
    let conn = wire::connect(acpd_read, acpd_write, 1 << 20);
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: "minted".into(),
        serves: ParentServes::default(),
        confinement: None,
        first: crate::child::First::Nothing,
        detach,
        on_closed: None,
    });
    LineReader::new(parent_side, WireLimits::default())
}

/// The editor's prompt 5, forwarded to the agent; the id the agent knows it by.
async fn prompt(child: &Child, fake: &mut Fake) -> Id {
    let params = serde_json::value::RawValue::from_string(
        json!({ "sessionId": "minted", "prompt": [] }).to_string(),
    )
    .unwrap();
    child
        .call(Id::Num(5), "session/prompt".into(), Some(params), None)
        .unwrap();
    fake.request("session/prompt").await.0
}

/// The next message the parent reads within an hour of paused time (`None`: nothing came,
/// or its pipe closed).
async fn next(p: &mut LineReader<DuplexStream>) -> Option<Message> {
    match tokio::time::timeout(Duration::from_secs(3600), p.next()).await {
        Ok(Some(Ok(m))) => Some(m),
        Ok(Some(Err(e))) => panic!("the parent's pipe: {e:?}"),
        Ok(None) | Err(_) => None,
    }
}

/// The result the parent got for its prompt 5.
async fn answer_to_prompt(p: &mut LineReader<DuplexStream>) -> serde_json::Value {
    loop {
        match next(p).await {
            Some(Message::Response {
                id: Some(Id::Num(5)),
                outcome,
            }) => {
                let result = outcome.expect("a result, not an error");
                return serde_json::from_str(result.get()).unwrap();
            }
            Some(_) => {}
            None => panic!("the prompt was never answered"),
        }
    }
}

/// The agent's output closes mid-turn (it exited): the prompt ends `cancelled`, and
/// `_meta.acpd.sessionEnded` names the exit (the answer was −32603 before).
#[tokio::test]
async fn a_prompt_whose_agent_exits_ends_cancelled_naming_the_exit() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let mut p = parent(&child, None);
    prompt(&child, &mut fake).await;
    drop(fake);
    let result = answer_to_prompt(&mut p).await;
    assert_eq!(result["stopReason"], "cancelled", "{result}");
    let ended = &result["_meta"]["acpd"]["sessionEnded"];
    assert_eq!(ended["data"]["category"], "process-exit", "{result}");
    assert!(
        ended["message"]
            .as_str()
            .is_some_and(|m| m.contains("agent \"fake\" exited")),
        "{result}"
    );
    child.shut().await;
}

/// The editor's connection ends with its prompt open (a detach): the prompt ends `cancelled`
/// for it; the agent's answer, later, reaches the editor no second time, and the detach then
/// expires with nothing more said.
#[tokio::test]
async fn a_prompt_open_at_a_detach_ends_cancelled_once() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let mut p = parent(&child, Some(Duration::from_secs(30)));
    let id = prompt(&child, &mut fake).await;
    child.detach();
    let result = answer_to_prompt(&mut p).await;
    assert_eq!(result, json!({ "stopReason": "cancelled" }));
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "end_turn" }))])
        .await;
    let end = tokio::time::timeout(Duration::from_secs(3600), child.ended())
        .await
        .expect("the detach expires");
    assert!(
        matches!(end, Some(crate::child::RelayEnd::Expired)),
        "{end:?}"
    );
    assert!(
        next(&mut p).await.is_none(),
        "the editor heard more after its cancelled prompt"
    );
    child.shut().await;
}

/// acpd stops the session (a daemon stop): the prompt ends `cancelled`, without `_meta`.
#[tokio::test]
async fn a_prompt_open_when_acpd_stops_ends_cancelled() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let mut p = parent(&child, None);
    prompt(&child, &mut fake).await;
    let stopping = child.clone();
    let shut = tokio::spawn(async move { stopping.shut().await });
    let result = answer_to_prompt(&mut p).await;
    assert_eq!(result, json!({ "stopReason": "cancelled" }));
    drop(fake);
    shut.await.unwrap();
}

/// The editor's prompt still queued toward the agent when its connection ends (a detach): it
/// ends `cancelled` for it, as a forwarded one does.
#[tokio::test]
async fn a_prompt_still_queued_at_a_detach_ends_cancelled() {
    let (child, fake) = start(provider(|_| {}), true).await;
    let mut p = parent(&child, Some(Duration::from_secs(30)));
    let params = serde_json::value::RawValue::from_string(
        json!({ "sessionId": "minted", "prompt": [] }).to_string(),
    )
    .unwrap();
    child
        .call(Id::Num(5), "session/prompt".into(), Some(params), None)
        .unwrap();
    child.detach();
    let result = answer_to_prompt(&mut p).await;
    assert_eq!(result, json!({ "stopReason": "cancelled" }));
    drop(fake);
    child.shut().await;
}
