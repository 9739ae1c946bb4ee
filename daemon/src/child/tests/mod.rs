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
        budget: None,
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

mod auth_and_air;
mod queue;
mod relay;
mod session_end;
mod turn_clocks;
