//! Forwarding what a connection's runs report: the `_acpd/subagent/started|ended`
//! notifications, and — when the parent advertised `clientCapabilities.subagents` and the run
//! was started under one of its sessions — the Subagent Session: a `subagent_update`
//! announcement before any of the run's traffic, its updates under its minted session id,
//! `requires_action` while a permission request waits on the parent, and `idle` with the stop
//! reason at the end of each turn.

use std::sync::Arc;

use acpd_protocol::acp::RequestPermissionResponse;
use acpd_protocol::envelope::INTERNAL_ERROR;
use acpd_protocol::session_id::with_session_id;
use acpd_protocol::subagent::{Category, StopReason, SubagentResult};
use serde_json::json;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use super::{Conn, SessionRef, lock, raw};
use acpd_protocol::permission::{Decision, decide};

use crate::child::PermissionAsk;
use crate::registry::RunEvent;

/// What the connection remembers about one of its runs.
pub(super) struct RunMeta {
    pub parent_session: Option<String>,
    /// Shown to the parent as a Subagent Session.
    pub subagent: bool,
    /// Shown instead under the session of the bridge session or run whose child started the
    /// run (nested delegation: this connection is that child's `acpd mcp`).
    pub nested_under: Option<NestedUnder>,
    /// The minted session id, known from the run's first `started`.
    pub session_id: Option<String>,
    pub title: String,
    /// A turn is running (so an answered permission request returns it to `running`).
    pub running: bool,
    /// The run's claim on the connection's `max_sessions_per_connection`.
    pub _seat: super::Seat,
}

pub(super) async fn pump(conn: Arc<Conn>, mut events: mpsc::Receiver<RunEvent>) {
    let (answered_tx, mut answered) = mpsc::channel::<String>(crate::wire::QUEUE_DEPTH);
    loop {
        tokio::select! {
            event = events.recv() => match event {
                // A parent that stopped reading must not hold the runs' events (and with them
                // a dispose waiting for a turn to settle) past the connection's end.
                Some(event) => tokio::select! {
                    biased;
                    _ = conn.closing.cancelled() => break,
                    () = on_event(&conn, event, &answered_tx) => {}
                },
                None => break,
            },
            Some(run_id) = answered.recv() => {
                let target = subagent_target(&conn, &run_id).filter(|_| {
                    lock(&conn.runs).get(&run_id).is_some_and(|m| m.running)
                });
                if let Some((parent, child, _)) = target {
                    state(&conn, &parent, &child, json!({ "state": "running" })).await;
                }
            }
            _ = conn.closing.cancelled() => break,
        }
    }
}

/// Where a nested run is shown: under a bridge session (by acpd id), or under a run (by run
/// id, with the session id its owner knows it by).
#[derive(Clone)]
pub(super) enum NestedUnder {
    Session(String),
    Run { run_id: String, session_id: String },
}

/// `(parent session, child session, title)` when the run is shown as a Subagent Session: on
/// this connection, or (nested) to the editor of the bridge session its starter runs in.
fn subagent_target(conn: &Conn, run_id: &str) -> Option<(Parent, String, String)> {
    let runs = lock(&conn.runs);
    let meta = runs.get(run_id)?;
    let parent = match (&meta.nested_under, meta.subagent) {
        (Some(NestedUnder::Session(bridge)), _) => Parent::Nested(bridge.clone()),
        (Some(NestedUnder::Run { run_id, session_id }), _) => Parent::NestedRun {
            run_id: run_id.clone(),
            session_id: session_id.clone(),
        },
        (None, true) => Parent::Own(meta.parent_session.clone()?),
        (None, false) => return None,
    };
    Some((parent, meta.session_id.clone()?, meta.title.clone()))
}

/// Where a Subagent Session is shown: under a session of this connection, or under a bridge
/// session of another (through that session's relay, to whichever editor holds it).
#[derive(Clone)]
enum Parent {
    Own(String),
    Nested(String),
    /// Under a run's Subagent Session on its owner's connection.
    NestedRun {
        run_id: String,
        session_id: String,
    },
}

impl Parent {
    fn session(&self) -> &str {
        match self {
            Parent::Own(s) | Parent::Nested(s) => s,
            Parent::NestedRun { session_id, .. } => session_id,
        }
    }
}

async fn on_event(conn: &Arc<Conn>, event: RunEvent, answered: &mpsc::Sender<String>) {
    match event {
        RunEvent::Started(s) => {
            if s.turn == 1 {
                lock(&conn.sessions).insert(
                    s.session_id.clone(),
                    SessionRef::Run {
                        run_id: s.run_id.clone(),
                    },
                );
            }
            if let Some(meta) = lock(&conn.runs).get_mut(&s.run_id) {
                meta.session_id = Some(s.session_id.clone());
                meta.running = true;
            }
            if let Some((parent, child, title)) = subagent_target(conn, &s.run_id) {
                if s.turn == 1 {
                    let description = conn
                        .ctx
                        .registry
                        .config()
                        .provider(&s.provider)
                        .map(|p| p.description.clone())
                        .filter(|d| !d.is_empty())
                        .unwrap_or_else(|| format!("delegated to {}", s.provider));
                    let update = json!({
                        "sessionUpdate": "subagent_update",
                        "sessionId": child,
                        "title": title,
                        "description": description,
                        "capabilities": { "cancel": {} },
                        "state": { "state": "running" },
                    });
                    notify_update(conn, &parent, parent.session(), &raw(&update)).await;
                } else {
                    state(conn, &parent, &child, json!({ "state": "running" })).await;
                }
            }
            let _ = conn.peer.notify("_acpd/subagent/started", &s).await;
        }
        RunEvent::Update { run_id, update } => {
            if let Some((route, child, _)) = subagent_target(conn, &run_id) {
                notify_update(conn, &route, &child, &update).await;
            }
        }
        RunEvent::Ask { run_id, ask } => {
            let target = subagent_target(conn, &run_id);
            let session = match &target {
                Some((parent, child, _)) => {
                    state(conn, parent, child, json!({ "state": "requires_action" })).await;
                    Some(child.clone())
                }
                None => lock(&conn.runs)
                    .get(&run_id)
                    .and_then(|m| m.session_id.clone()),
            };
            ask_parent(conn, run_id, *ask, session, answered.clone());
        }
        RunEvent::Nested { run_id, params } => {
            // Shown only where this run is itself shown, nested or not: a chain of nested
            // runs reaches the editor at the top.
            if let Some((route, _, _)) = subagent_target(conn, &run_id) {
                deliver(conn, &route, params).await;
            }
        }
        RunEvent::Ended(e) => {
            if let Some(meta) = lock(&conn.runs).get_mut(&e.run_id) {
                meta.running = false;
            }
            if let Some((parent, child, _)) = subagent_target(conn, &e.run_id) {
                state(conn, &parent, &child, idle_state(&e.result)).await;
            }
            let _ = conn.peer.notify("_acpd/subagent/ended", &*e).await;
        }
    }
}

/// The connection of a child's `acpd mcp` ended (the child cancelled its tool call, or died)
/// while a nested run's turn was running: its editor is told how the nested session went
/// idle, since the run's own `ended` event may never be pumped now. `settled` holds how the
/// disposed runs' last turns ended (a budget spent above them ends them `budget`, whoever
/// noticed first); a run that never settled is `cancelled`.
pub(super) fn settle_nested(
    conn: &Conn,
    settled: &std::collections::HashMap<String, Arc<SubagentResult>>,
) {
    let cancelled = json!({ "state": "idle", "stopReason": "cancelled" });
    for (run_id, meta) in lock(&conn.runs).iter().filter(|(_, m)| m.running) {
        let (Some(under), Some(child)) = (&meta.nested_under, &meta.session_id) else {
            continue;
        };
        let idle = settled
            .get(run_id)
            .map_or_else(|| cancelled.clone(), |result| idle_state(result));
        let update =
            json!({ "sessionUpdate": "subagent_update", "sessionId": child, "state": idle });
        match under {
            NestedUnder::Session(bridge) => {
                let params = json!({ "sessionId": bridge, "update": update });
                conn.ctx.sessions.announce(bridge, raw(&params));
            }
            NestedUnder::Run { run_id, session_id } => {
                let params = json!({ "sessionId": session_id, "update": update });
                conn.ctx.registry.announce_to_run(run_id, raw(&params));
            }
        }
    }
}

/// Relays a run's permission request to the parent without holding up other events.
fn ask_parent(
    conn: &Arc<Conn>,
    run_id: String,
    ask: PermissionAsk,
    session: Option<String>,
    answered: mpsc::Sender<String>,
) {
    // The editor of the bridge session at the top of the chain, which was shown every level.
    let nested_under = match subagent_target(conn, &run_id) {
        Some((Parent::Nested(bridge), _, _)) => Some(bridge),
        Some((Parent::NestedRun { run_id, .. }, _, _)) => conn
            .ctx
            .registry
            .top_session(&crate::registry::Parent::Run(run_id)),
        _ => None,
    };
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        let fallback = decide(&ask.request, Decision::Reject);
        let params = raw(&ask.request);
        let params = session
            .as_deref()
            .and_then(|s| with_session_id(&params, s))
            .unwrap_or(params);
        // A run nested under a bridge session asks that session's editor, who sees it as a
        // nested Subagent Session; else whoever started it.
        let editor = match &nested_under {
            Some(bridge) => conn2.ctx.sessions.editor_of(bridge).await,
            None => None,
        };
        let peer = editor.as_ref().unwrap_or(&conn2.peer);
        let answer = match peer
            .call_raw("session/request_permission", Some(&params))
            .await
        {
            Ok(call) => match call.result().await {
                Ok(raw) => {
                    serde_json::from_str::<RequestPermissionResponse>(raw.get()).unwrap_or(fallback)
                }
                Err(_) => fallback,
            },
            Err(_) => fallback,
        };
        let _ = ask.reply.send(answer);
        let _ = answered.send(run_id).await;
    });
}

/// A `session/update` on `session`, sent the way `route` reaches its editor.
async fn notify_update(conn: &Conn, route: &Parent, session: &str, update: &RawValue) {
    let params = format!(
        "{{\"sessionId\":{},\"update\":{}}}",
        serde_json::to_string(session).unwrap_or_default(),
        update.get()
    );
    if let Ok(params) = RawValue::from_string(params) {
        deliver(conn, route, params).await;
    }
}

/// Sends `session/update` params the way `route` reaches its editor.
async fn deliver(conn: &Conn, route: &Parent, params: Box<RawValue>) {
    match route {
        Parent::Own(_) => {
            let _ = conn.peer.notify_raw("session/update", Some(&params)).await;
        }
        Parent::Nested(bridge) => conn.ctx.sessions.announce(bridge, params),
        Parent::NestedRun { run_id, .. } => conn.ctx.registry.announce_to_run(run_id, params),
    }
}

async fn state(conn: &Conn, parent: &Parent, child: &str, state: serde_json::Value) {
    let update = json!({ "sessionUpdate": "subagent_update", "sessionId": child, "state": state });
    notify_update(conn, parent, parent.session(), &raw(&update)).await;
}

/// The `idle` state for a settled turn, in ACP's stop-reason vocabulary.
fn idle_state(result: &SubagentResult) -> serde_json::Value {
    let category = result.failure.as_ref().map(|f| &f.category);
    let stop = match (result.stop_reason, category) {
        (StopReason::Completed, _) => "end_turn",
        (StopReason::MaxTokens, _) => "max_tokens",
        (StopReason::Refusal, _) => "refusal",
        (StopReason::Aborted, _) => "cancelled",
        (StopReason::Error, Some(Category::RemoteLimit)) => "max_turn_requests",
        (StopReason::Error, _) => {
            let code = result
                .failure
                .as_ref()
                .and_then(|f| f.code)
                .unwrap_or(INTERNAL_ERROR);
            let message = result
                .diagnostic
                .clone()
                .unwrap_or_else(|| "subagent failed".into());
            return json!({
                "state": "idle",
                "stopReason": "error",
                "error": { "code": code, "message": message },
            });
        }
    };
    json!({ "state": "idle", "stopReason": stop })
}
