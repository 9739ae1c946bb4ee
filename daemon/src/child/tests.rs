//! The driver in-process, with paused time: a scripted agent on duplex pipes speaks for the
//! child while a real `sleep` process stands for its tree. Time only moves when every task
//! waits, so each deadline is observed exactly, with no sleeping on the wall clock.

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::{ContentBlock, TextContent};
use acpd_protocol::envelope::{Id, Message};
use acpd_protocol::outcome::{ChildStopReason, TurnEnd};
use serde_json::json;
use tokio::io::{AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Child, ChildEvent, ChildSpec, ParentServes, RelayTarget, TurnControl, TurnReport};
use crate::config::ProviderConfig;
use crate::supervise::{self, SpawnSpec};
use crate::wire::{self, LineReader, WireLimits};

/// The agent's end of the child's wire (shared with the registry's paused-time tests).
pub(crate) struct Fake {
    pub(crate) reader: LineReader<DuplexStream>,
    pub(crate) writer: DuplexStream,
    pub(crate) session: String,
}

impl Fake {
    pub(crate) async fn next(&mut self) -> Message {
        match self.reader.next().await {
            Some(Ok(m)) => m,
            other => panic!("the agent expected a message, got {other:?}"),
        }
    }

    pub(crate) async fn request(&mut self, want: &str) -> (Id, serde_json::Value) {
        match self.next().await {
            Message::Request { id, method, params } if method == want => {
                let params = params.map(|p| serde_json::from_str(p.get()).unwrap());
                (id, params.unwrap_or_default())
            }
            other => panic!("the agent expected {want}, got {other:?}"),
        }
    }

    pub(crate) async fn notification(&mut self, want: &str) {
        match self.next().await {
            Message::Notification { method, .. } if method == want => {}
            other => panic!("the agent expected {want}, got {other:?}"),
        }
    }

    pub(crate) async fn send(&mut self, lines: &[String]) {
        let mut text = lines.join("\n");
        text.push('\n');
        self.writer.write_all(text.as_bytes()).await.unwrap();
    }

    pub(crate) fn answer(id: &Id, result: serde_json::Value) -> String {
        json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string()
    }

    pub(crate) fn chunk(&self, text: &str) -> String {
        self.update(&self.session.clone(), text)
    }

    fn update(&self, session: &str, text: &str) -> String {
        json!({ "jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": session,
            "update": { "sessionUpdate": "agent_message_chunk", "content": { "type": "text", "text": text } },
        }})
        .to_string()
    }
}

pub(crate) fn provider(tweak: impl FnOnce(&mut ProviderConfig)) -> ProviderConfig {
    let mut p = ProviderConfig::with_defaults("fake", vec!["sleep".into(), "3600".into()]);
    p.idle_timeout = Some(Duration::from_secs(10));
    p.cancel_grace = Duration::from_secs(2);
    p.eof_grace = Duration::from_millis(10);
    p.term_grace = Duration::from_millis(10);
    tweak(&mut p);
    p
}

/// A started child whose agent is `Fake`; time is paused once the stand-in process runs.
pub(crate) async fn start(p: ProviderConfig, relay: bool) -> (Child, Fake) {
    let (child, fake, _) = start_with(p, relay, json!({ "protocolVersion": 1 })).await;
    (child.unwrap(), fake)
}

/// What the fake agent saw during the handshake.
#[derive(Debug, Default)]
pub(crate) struct Handshook {
    initialize: serde_json::Value,
    /// The `methodId` of each `authenticate`, in order.
    authenticated: Vec<String>,
    session_new: bool,
}

/// As [`start`], the agent answering `initialize` with `init`, `authenticate` with `{}`, and
/// `session/new`; the start's own result (it may fail) and what the agent saw.
async fn start_with(
    p: ProviderConfig,
    relay: bool,
    init: serde_json::Value,
) -> (Result<Child, super::StartFailure>, Fake, Handshook) {
    let (spec, spawned, driver_out, driver_in, agent) = wire_up(p, relay, init).await;
    let child = super::launch::start_over(spec, spawned, Box::new(driver_out), driver_in).await;
    let (fake, seen) = agent.await.unwrap();
    (child, fake, seen)
}

/// A warm spare: a child initialized with no session, whose agent is `Fake`. The handle
/// resolves when acpd closes the spare's wire (the agent saw EOF), with what it saw.
pub(crate) async fn spare(
    p: ProviderConfig,
) -> (
    super::Initialized,
    tokio::task::JoinHandle<(Fake, Handshook)>,
) {
    let (spec, spawned, driver_out, driver_in, agent) =
        wire_up(p, true, json!({ "protocolVersion": 1 })).await;
    let ready = super::launch::initialize_over(spec, spawned, Box::new(driver_out), driver_in)
        .await
        .unwrap();
    (ready, agent)
}

/// The stand-in process spawned, time paused, and the agent answering the handshake on its
/// own task until `session/new` or until acpd closes the wire; the spec and acpd's ends of
/// the pipes.
async fn wire_up(
    p: ProviderConfig,
    relay: bool,
    init: serde_json::Value,
) -> (
    ChildSpec,
    supervise::Spawned,
    DuplexStream,
    DuplexStream,
    tokio::task::JoinHandle<(Fake, Handshook)>,
) {
    supervise::init();
    let spawned = supervise::spawn(SpawnSpec {
        argv: p.command.clone(),
        cwd: "/".into(),
        env: vec![],
    })
    .await
    .unwrap();
    tokio::time::pause();
    let (driver_out, agent_out) = tokio::io::duplex(64 * 1024);
    let (agent_in, driver_in) = tokio::io::duplex(64 * 1024);
    let mut spec = ChildSpec::new(Arc::new(p), "test".into(), "/".into(), 1, 2);
    spec.relay = relay;
    spec.limits = WireLimits {
        max_line: 1 << 20,
        line_timeout: Duration::from_secs(30),
        write_timeout: Duration::from_secs(30),
    };
    let mut fake = Fake {
        reader: LineReader::new(agent_in, spec.limits),
        writer: agent_out,
        session: "child-session".into(),
    };
    let agent = tokio::spawn(async move {
        let mut seen = Handshook::default();
        // Until `session/new`, or until acpd gives up on the child and closes the wire.
        while let Some(Ok(Message::Request { id, method, params })) = fake.reader.next().await {
            let params: serde_json::Value = params
                .map(|p| serde_json::from_str(p.get()).unwrap())
                .unwrap_or_default();
            let reply = match method.as_str() {
                "initialize" => {
                    seen.initialize = params;
                    init.clone()
                }
                "authenticate" => {
                    seen.authenticated
                        .push(params["methodId"].as_str().unwrap_or("?").to_string());
                    json!({})
                }
                "session/new" => json!({ "sessionId": fake.session }),
                other => panic!("the agent did not expect {other}"),
            };
            fake.send(&[Fake::answer(&id, reply)]).await;
            if method == "session/new" {
                seen.session_new = true;
                break;
            }
        }
        (fake, seen)
    });
    (spec, spawned, driver_out, driver_in, agent)
}

pub(crate) fn control() -> TurnControl {
    TurnControl {
        cancel: CancellationToken::new(),
        run_timeout: None,
        max_output: 1 << 20,
        sink: None,
        events: None,
        updates: false,
        asks: false,
        tool_filter: None,
    }
}

fn text(report: &TurnReport) -> String {
    report
        .output
        .iter()
        .map(|b| match b {
            ContentBlock::Text(TextContent { text, .. }) => text.clone(),
            _ => String::new(),
        })
        .collect()
}

/// `since.elapsed()` is `d`, to the timer's 1 ms granularity (time is paused: no noise).
#[track_caller]
pub(crate) fn at(since: Instant, d: Duration, what: &str) {
    let e = since.elapsed();
    assert!(
        e >= d && e <= d + Duration::from_millis(5),
        "{what}: {e:?}, expected {d:?}"
    );
}

pub(crate) fn prompt() -> Vec<ContentBlock> {
    vec![ContentBlock::from("go".to_string())]
}

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
        first: super::First::Nothing,
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
    assert_eq!(error.data.unwrap()["category"], "protocol");
    assert!(matches!(
        child.ended().await,
        Some(super::RelayEnd::Protocol)
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
        first: super::First::Nothing,
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
        first: super::First::Nothing,
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
    let started = super::launch::start_over(spec, spawned, Box::new(driver_out), driver_in).await;
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
        first: super::First::Nothing,
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
    assert!(matches!(end, Some(super::RelayEnd::Expired)), "{end:?}");
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
