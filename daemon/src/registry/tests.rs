//! The registry's run timers on paused time: a run published the way [`Registry::start`]
//! publishes one (a slot claimed, filed in the table, turn 1 begun), its child's agent played
//! over duplex pipes by the driver tests' `Fake` while a real `sleep` stands for its tree.
//! Each limit — `idle_timeout`, `run_timeout`, `cancel_grace`, `keep_alive` — is observed at
//! its exact deadline through what an owner sees: `wait`'s result, `send`'s refusal, and the
//! agent's input closing when its child is torn down.

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::subagent::{Category, StopReason, SubagentResult};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::run_lifecycle::{Run, RunInit};
use super::{DepthContext, Registry, RegistryError, lock};
use crate::child::tests::{Fake, at, prompt, provider, start};
use crate::config::{Config, ProviderConfig};

const OWNER: u64 = 7;
const RUN: &str = "r1";

/// A registry whose providers include `p`, and one published run of it.
async fn published(p: ProviderConfig) -> (Registry, Fake) {
    let (child, fake) = start(p.clone(), false).await;
    let p = Arc::new(p);
    let mut config = Config::builtin(vec!["true".into()]);
    config.providers.insert(p.name.clone(), p.clone());
    let registry = Registry::new(config, DepthContext::default());
    let slot = registry
        .claim(&registry.config(), &p, &CancellationToken::new())
        .await
        .unwrap();
    let run = Run::new(RunInit {
        run_id: RUN.into(),
        owner: OWNER,
        provider: p,
        label: None,
        session_id: "sub-1".into(),
        depth: 1,
        max_depth: 2,
        run_timeout: None,
        max_output: 1 << 20,
        events: None,
        forward_updates: false,
        forward_permissions: false,
        sink: None,
        schema: None,
        tool_filter: None,
        parent: None,
        workspace: None,
        uid: None,
    });
    lock(&registry.inner.table)
        .runs
        .insert(RUN.into(), run.clone());
    run.begin_turn(child, slot, prompt());
    (registry, fake)
}

#[track_caller]
fn failed_with(result: &SubagentResult, category: Category) {
    assert_eq!(result.stop_reason, StopReason::Error, "{result:?}");
    assert_eq!(
        result.failure.as_ref().map(|f| &f.category),
        Some(&category),
        "{result:?}"
    );
}

/// The run's child is gone: the agent's input closed, a follow-up is refused saying why, and
/// once disposed the run holds no slot.
async fn child_gone(registry: &Registry, fake: &mut Fake, why: &str) {
    assert!(
        fake.reader.next().await.is_none(),
        "the agent sees its input close"
    );
    match registry.send(OWNER, RUN, prompt()).await {
        Err(RegistryError::RunEnded { reason, .. }) => assert_eq!(reason, why),
        other => panic!("a follow-up on a gone child: {other:?}"),
    }
    registry.dispose(OWNER, RUN).await.unwrap();
    assert_eq!(registry.live_children(), 0, "the slot is released");
}

#[tokio::test]
async fn a_run_whose_child_goes_silent_is_hung_after_idle_timeout() {
    let (registry, mut fake) = published(provider(|_| {})).await;
    let t0 = Instant::now();
    fake.request("session/prompt").await;
    // Nothing more from the agent, not even to the cancel.
    fake.notification("session/cancel").await;
    at(t0, Duration::from_secs(10), "cancelled at idle_timeout");
    let result = registry.wait(OWNER, RUN).await.unwrap();
    at(t0, Duration::from_secs(12), "given up after cancel_grace");
    failed_with(&result, Category::Hung);
    assert!(result.diagnostic.is_some(), "a failed turn explains itself");
    child_gone(&registry, &mut fake, "child spent by its last turn").await;
}

#[tokio::test]
async fn a_run_past_run_timeout_is_a_timeout_even_if_the_child_then_obeys() {
    let (registry, mut fake) = published(provider(|p| {
        p.idle_timeout = None;
        p.run_timeout = Some(Duration::from_secs(30));
    }))
    .await;
    let t0 = Instant::now();
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[fake.chunk("working")]).await;
    fake.notification("session/cancel").await;
    at(t0, Duration::from_secs(30), "cancelled at run_timeout");
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "cancelled" }))])
        .await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    failed_with(&result, Category::Timeout);
    assert!(
        serde_json::to_string(&result.output)
            .unwrap()
            .contains("working"),
        "the partial output is kept: {result:?}"
    );
    child_gone(&registry, &mut fake, "child spent by its last turn").await;
}

#[tokio::test]
async fn a_cancel_the_child_ignores_is_aborted_after_cancel_grace() {
    let (registry, mut fake) = published(provider(|p| p.idle_timeout = None)).await;
    fake.request("session/prompt").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    registry.cancel(OWNER, RUN).unwrap();
    fake.notification("session/cancel").await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    at(t0, Duration::from_secs(2), "given up after cancel_grace");
    assert_eq!(result.stop_reason, StopReason::Aborted, "{result:?}");
    assert!(result.failure.is_none(), "the owner's cancel: {result:?}");
    child_gone(&registry, &mut fake, "child spent by its last turn").await;
}

#[tokio::test]
async fn a_settled_run_keeps_its_child_for_keep_alive_from_its_last_turn() {
    let (registry, mut fake) = published(provider(|p| {
        p.keep_alive = Duration::from_secs(60);
    }))
    .await;
    for turn in 1..=2 {
        let (id, _) = fake.request("session/prompt").await;
        fake.send(&[
            fake.chunk("done"),
            Fake::answer(&id, json!({ "stopReason": "end_turn" })),
        ])
        .await;
        let result = registry.wait(OWNER, RUN).await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
        assert_eq!(result.turn, turn);
        if turn == 1 {
            // Just inside keep_alive: the child is still there for a follow-up.
            tokio::time::sleep(Duration::from_secs(59)).await;
            assert_eq!(registry.send(OWNER, RUN, prompt()).await.unwrap(), 2);
        }
    }
    let settled = Instant::now();
    assert!(fake.reader.next().await.is_none(), "torn down");
    at(
        settled,
        Duration::from_secs(60),
        "keep_alive counts from the last turn",
    );
    child_gone(
        &registry,
        &mut fake,
        "keep_alive expired or the child exited",
    )
    .await;
}
