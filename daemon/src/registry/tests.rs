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

use super::budget::Spend;
use super::run_lifecycle::{Run, RunInit};
use super::{DepthContext, Registry, RegistryError, lock};
use crate::child::tests::{Fake, at, prompt, provider, start};
use crate::config::{Config, ProviderConfig};

const OWNER: u64 = 7;
const RUN: &str = "r1";

/// A registry whose providers include `p`, and one published run of it.
async fn published(p: ProviderConfig) -> (Registry, Fake) {
    published_under(p, None).await
}

/// As [`published`], the run's budget being its provider's, under `above`'s when given.
async fn published_under(p: ProviderConfig, above: Option<Arc<Spend>>) -> (Registry, Fake) {
    let (child, fake) = start(p.clone(), false).await;
    let p = Arc::new(p);
    let spend = Spend::new(p.budget, above);
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
        confinement: None,
        parent: None,
        workspace: None,
        principal: None,
        spend,
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

/// A `session/update` saying `used` tokens are in context.
fn usage(fake: &Fake, used: u64) -> String {
    json!({ "jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": fake.session,
        "update": { "sessionUpdate": "usage_update", "used": used, "size": 200_000 },
    }})
    .to_string()
}

fn budget(tokens: Option<u64>, wall: Option<u64>) -> crate::config::Budget {
    crate::config::Budget {
        tokens,
        wall: wall.map(Duration::from_secs),
    }
}

#[track_caller]
fn says(result: &SubagentResult, what: &str) {
    let diagnostic = result.diagnostic.as_deref().unwrap_or_default();
    assert!(
        diagnostic.contains(what),
        "{diagnostic:?} should say {what:?}"
    );
}

#[tokio::test]
async fn a_run_past_its_token_budget_is_cancelled_first_then_torn_down_and_ends_budget() {
    let (registry, mut fake) = published(provider(|p| {
        p.idle_timeout = None;
        p.budget = budget(Some(1000), None);
    }))
    .await;
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[usage(&fake, 400), fake.chunk("working")]).await;
    fake.send(&[usage(&fake, 1001)]).await;
    fake.notification("session/cancel").await;
    // The agent obeys; the run is over all the same.
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "cancelled" }))])
        .await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    failed_with(&result, Category::Budget);
    says(&result, "token budget is spent");
    assert!(
        result.output_text().contains("working"),
        "the partial output is kept: {result:?}"
    );
    let run = registry.runs().pop().unwrap();
    assert_eq!(run.spend.tokens(), 1001, "the largest used of the turn");
    child_gone(&registry, &mut fake, "child spent by its last turn").await;
}

#[tokio::test]
async fn the_prompt_results_usage_counts_and_turns_add_up() {
    let (registry, mut fake) = published(provider(|p| {
        p.budget = budget(Some(1000), None);
    }))
    .await;
    // Turn 1: a usage_update of 300, then the result's own count of 600 for the turn
    // (written as a float, as a JavaScript agent may: it counts the same).
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[
        usage(&fake, 300),
        Fake::answer(
            &id,
            json!({ "stopReason": "end_turn", "usage": { "totalTokens": 600.0, "inputTokens": 500, "outputTokens": 100 } }),
        ),
    ])
    .await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(registry.runs()[0].spend.tokens(), 600);
    // Turn 2 spends 500 more (499.2, rounded up): the run's 1100 is past 1000, on the
    // result's count alone.
    registry.send(OWNER, RUN, prompt()).await.unwrap();
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[Fake::answer(
        &id,
        json!({ "stopReason": "end_turn", "usage": { "totalTokens": 499.2 } }),
    )])
    .await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    failed_with(&result, Category::Budget);
    assert_eq!(registry.runs()[0].spend.tokens(), 1100);
    child_gone(&registry, &mut fake, "child spent by its last turn").await;
}

#[tokio::test]
async fn a_malformed_usage_is_no_usage_never_a_fault() {
    let (registry, mut fake) = published(provider(|p| {
        p.budget = budget(Some(10), None);
    }))
    .await;
    let (id, _) = fake.request("session/prompt").await;
    let bad = usage(&fake, 1).replace("1,", "-5,");
    fake.send(&[
        bad,
        Fake::answer(
            &id,
            json!({ "stopReason": "end_turn", "usage": { "totalTokens": "lots" } }),
        ),
    ])
    .await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(registry.runs()[0].spend.tokens(), 0);
}

#[tokio::test]
async fn the_wall_budget_counts_across_turns_and_ends_a_turn_that_idles() {
    let (registry, mut fake) = published(provider(|p| {
        p.idle_timeout = None;
        p.keep_alive = Duration::from_secs(600);
        p.budget = budget(None, Some(60));
    }))
    .await;
    let t0 = Instant::now();
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "end_turn" }))])
        .await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    tokio::time::sleep(Duration::from_secs(40)).await;
    registry.send(OWNER, RUN, prompt()).await.unwrap();
    fake.request("session/prompt").await;
    // The agent says nothing more; no idle or run limit is set: only the wall budget ends it.
    fake.notification("session/cancel").await;
    at(
        t0,
        Duration::from_secs(60),
        "cancelled 60s after the run started",
    );
    let result = registry.wait(OWNER, RUN).await.unwrap();
    failed_with(&result, Category::Budget);
    says(&result, "wall-time budget is spent");
    child_gone(&registry, &mut fake, "child spent by its last turn").await;
}

#[tokio::test]
async fn a_settled_runs_child_ends_when_its_wall_budget_passes() {
    let (registry, mut fake) = published(provider(|p| {
        p.keep_alive = Duration::from_secs(600);
        p.budget = budget(None, Some(60));
    }))
    .await;
    let t0 = Instant::now();
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[Fake::answer(&id, json!({ "stopReason": "end_turn" }))])
        .await;
    registry.wait(OWNER, RUN).await.unwrap();
    assert!(fake.reader.next().await.is_none(), "torn down");
    at(
        t0,
        Duration::from_secs(60),
        "at the wall budget, not keep_alive",
    );
    child_gone(&registry, &mut fake, "its budget is spent").await;
}

#[tokio::test]
async fn a_nested_runs_spending_ends_the_run_above_it_and_every_run_under_that() {
    let root = Spend::new(budget(Some(1000), None), None);
    let (registry, mut fake) =
        published_under(provider(|p| p.idle_timeout = None), Some(root.clone())).await;
    // A second run under the same root, and one under it (their agents are not needed here:
    // what they report is charged to their meters).
    let sibling = Spend::new(budget(None, None), Some(root.clone()));
    let grandchild = Spend::new(budget(Some(5000), None), Some(sibling.clone()));
    fake.request("session/prompt").await;
    grandchild.charge(700);
    assert!(!root.is_spent(), "700 of 1000");
    grandchild.charge(400);
    fake.notification("session/cancel").await;
    let result = registry.wait(OWNER, RUN).await.unwrap();
    failed_with(&result, Category::Budget);
    says(&result, "a run above this one spent its budget");
    assert_eq!(
        (root.tokens(), sibling.tokens(), grandchild.tokens()),
        (1100, 1100, 1100)
    );
    assert!(
        sibling.is_spent() && grandchild.is_spent(),
        "the whole subtree"
    );
    assert_eq!(
        registry.runs()[0].spend.tokens(),
        0,
        "it spent nothing itself"
    );
}

#[test]
fn a_request_may_lower_the_providers_budget_never_raise_it() {
    use acpd_protocol::subagent::Budget as Asked;
    let p = provider(|p| p.budget = budget(Some(1000), Some(600)));
    let asked = |tokens: Option<u64>, wall: Option<&str>| Asked {
        tokens,
        wall: wall.map(str::to_string),
    };
    let resolve = |a: Option<Asked>| super::budget::resolve(&p, a.as_ref());
    assert_eq!(resolve(None).unwrap(), p.budget);
    assert_eq!(
        resolve(Some(asked(Some(10), Some("1m")))).unwrap(),
        budget(Some(10), Some(60))
    );
    assert_eq!(
        resolve(Some(asked(None, Some("90")))).unwrap(),
        budget(Some(1000), Some(90)),
        "bare digits are seconds, the missing limit is the provider's"
    );
    for (a, says) in [
        (
            asked(Some(1001), None),
            "above provider \"fake\"'s budget of 1000 tokens",
        ),
        (
            asked(None, Some("11m")),
            "above provider \"fake\"'s budget of 10m",
        ),
        (asked(Some(0), None), "at least 1"),
        (asked(None, Some("0s")), "longer than 0s"),
        (asked(None, Some("soon")), "budget.wall"),
        (asked(None, Some("31days")), "ceiling"),
    ] {
        match resolve(Some(a)) {
            Err(e @ RegistryError::InvalidRequest { .. }) => {
                assert!(e.to_string().contains(says), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
    let open = provider(|_| {});
    let asked = asked(Some(1_000_000), Some("30days"));
    assert_eq!(
        super::budget::resolve(&open, Some(&asked)).unwrap(),
        budget(Some(1_000_000), Some(30 * 24 * 3600)),
        "without a provider budget, the request's"
    );
}
