//! The queue from a bridge session's editor to its agent: bounded in bytes, never blocking the
//! relay, a cancel never lost behind it.

use super::relay::{prompt_params, raw, relay_to};
use super::*;

/// The agent stops reading while the editor sends it 512 KiB messages with nothing awaited: the
/// queue toward it holds `QUEUE_BYTES` of them, not 256; the editor's request past that is
/// refused with the limit error naming its session (the notifications are dropped); a cancel
/// sent then reaches the agent after what was queued; and once the agent has read, the
/// editor's calls pass again.
#[tokio::test]
async fn the_queue_toward_the_agent_is_bounded_in_bytes_and_a_cancel_still_goes() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let _parent = relay_to(&child, None);
    let blob = "b".repeat(512 * 1024);
    for i in 0..20 {
        let params = raw(json!({ "sessionId": "minted", "i": i, "blob": blob }));
        child.notify("_zed/big".into(), params);
    }
    let params = raw(json!({ "sessionId": "minted", "blob": blob }));
    let Err(refused) = child.call(Id::Num(5), "_zed/big".into(), Some(params), None) else {
        panic!("a request past the byte budget is refused")
    };
    let (id, why) = *refused;
    assert_eq!(
        (id, why),
        (Id::Num(5), crate::child::CallRefused::QueueFull)
    );
    let e = why.to_rpc_error("minted");
    assert_eq!(e.code, -33013, "{e:?}");
    let data = e.data_value().unwrap();
    assert_eq!(
        (&data["limit"], &data["sessionId"]),
        (&json!("session_queue"), &json!("minted")),
        "{data}"
    );
    child.cancel(raw(json!({ "sessionId": "minted" })));
    let mut bigs = 0;
    loop {
        match fake.next().await {
            Message::Notification { method, params } if method == "_zed/big" => {
                let p: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
                assert_eq!(p["i"], bigs, "in order");
                bigs += 1;
            }
            Message::Notification { method, .. } if method == "session/cancel" => break,
            other => panic!("{other:?}"),
        }
    }
    let most = crate::child::queue::QUEUE_BYTES / blob.len();
    assert!((1..=most).contains(&bigs), "{bigs} of 20 queued");
    child
        .call(
            Id::Num(6),
            "session/prompt".into(),
            prompt_params("next"),
            None,
        )
        .unwrap();
    let (_, p) = fake.request("session/prompt").await;
    assert_eq!(p["prompt"][0]["text"], "next");
    child.shut().await;
}

/// The agent is slow to read its stdin and streams its turn meanwhile, while a large message
/// of the editor's waits for room in the agent's outbox: the relay goes on reading the agent
/// (a write it waited on would leave the agent blocked on its stdout and acpd on its stdin),
/// and the editor's messages reach the agent in order once it reads.
#[tokio::test]
async fn the_agent_is_read_while_a_large_message_waits_for_its_outbox() {
    let (child, mut fake) = start(provider(|_| {}), true).await;
    let mut parent = relay_to(&child, None);
    for (i, size) in [900 * 1024, 512 * 1024].into_iter().enumerate() {
        let params = raw(json!({ "sessionId": "minted", "i": i, "blob": "b".repeat(size) }));
        child.notify("_zed/big".into(), params);
    }
    let chunks: Vec<String> = (0..64)
        .map(|i| fake.chunk(&format!("{i:04}{}", "c".repeat(4096))))
        .collect();
    tokio::time::timeout(Duration::from_secs(10), fake.send(&chunks))
        .await
        .expect("acpd stopped reading the agent while the editor's message waited");
    for i in 0..64 {
        let Some(Ok(Message::Notification { params, .. })) = parent.next().await else {
            panic!("the editor gets the agent's updates")
        };
        assert!(
            params.unwrap().get().contains(&format!("{i:04}")),
            "update {i}"
        );
    }
    for i in 0..2 {
        match fake.next().await {
            Message::Notification { method, params } if method == "_zed/big" => {
                let p: serde_json::Value = serde_json::from_str(params.unwrap().get()).unwrap();
                assert_eq!(p["i"], i, "in order");
            }
            other => panic!("{other:?}"),
        }
    }
    child.shut().await;
}
