//! The handshake: authentication around `initialize` and `session/new`, and codex-acp's AIR
//! session-failure extension.

use super::*;

#[tokio::test]
async fn the_configured_auth_method_is_sent_after_initialize_and_before_session_new() {
    let p = provider(|p| p.auth_method = Some("key".into()));
    let init = json!({ "protocolVersion": 1, "authMethods": [{ "id": "other" }, { "id": "key" }] });
    let (child, _fake, seen) = start_with(p, false, init).await;
    let child = child.unwrap();
    assert_eq!(seen.authenticated, ["key"]);
    assert!(seen.session_new);
    child.shut().await;
}

#[tokio::test]
async fn an_auth_method_the_agent_does_not_advertise_fails_the_start_naming_what_it_does() {
    let p = provider(|p| p.auth_method = Some("nope".into()));
    let init = json!({ "protocolVersion": 1, "authMethods": [{ "id": "key" }] });
    let (child, _fake, seen) = start_with(p, false, init).await;
    let Err(e) = child else {
        panic!("the start must fail")
    };
    assert!(
        seen.authenticated.is_empty() && !seen.session_new,
        "{seen:?}"
    );
    assert_eq!(e.failure().category.as_str(), "auth");
    assert_eq!(e.advertised_auth_methods(), ["key"]);
    assert_eq!(e.unadvertised_auth_method(), Some("nope"));
    assert!(e.to_string().contains("it offers: key"), "{e}");
}

#[tokio::test]
async fn without_auth_method_nothing_is_authenticated() {
    let init = json!({ "protocolVersion": 1, "authMethods": [{ "id": "key" }] });
    let (child, _fake, seen) = start_with(provider(|_| {}), false, init).await;
    assert!(seen.authenticated.is_empty() && seen.session_new);
    child.unwrap().shut().await;
}

#[tokio::test]
async fn auth_required_at_session_new_names_the_advertised_methods() {
    supervise::init();
    let p = provider(|_| {});
    let spawned = supervise::spawn(SpawnSpec {
        argv: p.command.clone(),
        cwd: "/".into(),
        env: vec![],
    })
    .await
    .unwrap();
    let (driver_out, agent_out) = tokio::io::duplex(64 * 1024);
    let (agent_in, driver_in) = tokio::io::duplex(64 * 1024);
    let spec = ChildSpec::new(Arc::new(p), "test".into(), "/".into(), 1, 2);
    let mut fake = Fake {
        reader: LineReader::new(agent_in, spec.limits),
        writer: agent_out,
        session: "child-session".into(),
    };
    let agent = tokio::spawn(async move {
        let (id, _) = fake.request("initialize").await;
        let init = json!({ "protocolVersion": 1, "authMethods": [{ "id": "a" }, { "id": "b" }] });
        fake.send(&[Fake::answer(&id, init)]).await;
        let (id, _) = fake.request("session/new").await;
        let refusal = json!({ "jsonrpc": "2.0", "id": id,
            "error": { "code": -32000, "message": "Authentication required" } });
        fake.send(&[refusal.to_string()]).await;
        fake
    });
    let started =
        crate::child::launch::start_over(spec, spawned, Box::new(driver_out), driver_in).await;
    let _fake = agent.await.unwrap();
    let Err(e) = started else {
        panic!("the start must fail")
    };
    let f = e.failure();
    assert_eq!(
        (f.stage.as_str(), f.category.as_str(), f.code),
        ("session-new", "auth", Some(-32000))
    );
    assert_eq!(e.advertised_auth_methods(), ["a", "b"]);
}

/// The initialize result of an agent that speaks AIR's `sessionFailure` (as codex-acp answers
/// a client that declared it).
fn air_init() -> serde_json::Value {
    json!({ "protocolVersion": 1, "_meta": { "steering": { "supported": true },
        "jetbrains": { "air": { "version": 1, "capabilities": ["sessionFailure", "diffPatch"] } } } })
}

/// A failed turn as codex-acp reports it to an AIR client: `end_turn` with the record.
fn air_failed(id: &Id, category: &str, severity: &str) -> String {
    Fake::answer(
        id,
        json!({ "stopReason": "end_turn", "_meta": { "quota": {}, "jetbrains": { "air": {
            "version": 1, "sessionFailure": { "id": "turn-7:error", "revision": 1,
            "category": category, "severity": severity, "title": "You've hit your usage limit.",
            "actions": [] } } } } }),
    )
}

async fn one_turn(
    child: &Child,
    fake: &mut Fake,
    answer: impl FnOnce(&Id) -> String,
) -> TurnReport {
    let turn = tokio::spawn({
        let child = child.clone();
        async move { child.prompt(prompt(), control()).await }
    });
    let (id, _) = fake.request("session/prompt").await;
    fake.send(&[fake.chunk("partial"), answer(&id)]).await;
    turn.await.unwrap()
}

#[tokio::test]
async fn a_run_child_is_opted_in_to_air_session_failure_at_initialize() {
    let (child, _fake, seen) = start_with(provider(|_| {}), false, air_init()).await;
    assert_eq!(
        seen.initialize["clientCapabilities"]["_meta"]["jetbrains"]["air"],
        json!({ "version": 1, "capabilities": ["sessionFailure"] }),
        "{}",
        seen.initialize
    );
    child.unwrap().shut().await;
}

#[tokio::test]
async fn an_air_session_failure_on_end_turn_is_a_reported_failure() {
    let (child, mut fake, _) = start_with(provider(|_| {}), false, air_init()).await;
    let child = child.unwrap();
    let report = one_turn(&child, &mut fake, |id| air_failed(id, "limit", "error")).await;
    assert_eq!(
        report.end,
        TurnEnd::Stopped {
            reason: ChildStopReason::EndTurn,
            reported_failure: Some("limit".into())
        }
    );
    assert_eq!(text(&report), "partial");
    assert!(!report.child_spent, "the agent can take another turn");
    // A warning does not end a turn as a failure.
    let report = one_turn(&child, &mut fake, |id| {
        air_failed(id, "connection", "warning")
    })
    .await;
    assert!(
        matches!(
            report.end,
            TurnEnd::Stopped {
                reported_failure: None,
                ..
            }
        ),
        "{report:?}"
    );
    child.shut().await;
}

#[tokio::test]
async fn an_air_record_from_an_agent_that_did_not_negotiate_it_is_not_read() {
    let (child, mut fake) = start(provider(|_| {}), false).await;
    let report = one_turn(&child, &mut fake, |id| air_failed(id, "limit", "error")).await;
    assert!(
        matches!(
            report.end,
            TurnEnd::Stopped {
                reported_failure: None,
                ..
            }
        ),
        "{report:?}"
    );
    child.shut().await;
}
