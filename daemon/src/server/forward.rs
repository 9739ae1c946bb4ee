//! What passes to a session's agent: a parent's request naming one of its sessions (a prompt,
//! a setting, a close, an extension), answered by the agent through the session's relay; its
//! notifications (`session/cancel`, `$/cancel_request`, extensions); and what acpd notes in the
//! session map on the way (a prompt's activity, a title the agent took).

use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use serde_json::value::RawValue;

use super::bridge::BridgeHandle;
use super::capabilities::{self, Login};
use super::{Conn, SessionRef, lock, raw, session_not_found};
use crate::registry::{Lineage, Parent, advertises};

/// What acpd makes of a request it passes on, besides passing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Forwarded {
    /// `session/prompt`: fitted to what the agent takes; activity in the session map.
    Prompt,
    /// `session/set_title`: the title kept in the session map once the agent took it.
    SetTitle,
    /// Any other `session/*` method: it must name a session.
    Session,
    /// An extension, or an ACP method acpd has no part in: to a new child if it names no
    /// session.
    Other,
}

/// Routes a request that names a session to that session (see [`Forwarded`]).
pub(super) async fn request(
    conn: &Arc<Conn>,
    id: Id,
    method: String,
    kind: Forwarded,
    session: Option<String>,
    params: Option<Box<RawValue>>,
) {
    let target = session.as_ref().and_then(|s| conn.session(s));
    let session_method = kind != Forwarded::Other;
    match (target, session) {
        (Some(SessionRef::Bridge(b)), session) => {
            let sid = session.clone().unwrap_or_default();
            let activity = activity(conn, kind, session, params.as_deref(), &b);
            // A new title is the agent's to refuse: written once it answered with a
            // result. A prompt it was given is activity whatever it answers.
            let (now, after_ok) = match activity {
                Some((sid, Some(title))) => (None, Some(title_once_taken(conn, sid, title))),
                other => (other, None),
            };
            let sent = match kind {
                Forwarded::Prompt => b.prompt(&sid, id, method, params, after_ok),
                _ => b.forward(&sid, id, method, params, after_ok),
            };
            match sent {
                Ok(()) => {
                    if let Some(activity) = now {
                        note_activity(conn, activity);
                    }
                }
                Err(refused) => {
                    let (id, e) = *refused;
                    conn.reply_err(&id, &e).await;
                }
            }
        }
        (Some(SessionRef::Run { .. }), _) => {
            let e = RpcError::invalid_request(format!(
                "{method}: a subagent session can only be cancelled by its parent"
            ));
            conn.reply_err(&id, &e).await;
        }
        (None, Some(sid)) if session_method => {
            conn.reply_err(&id, &session_not_found(&sid)).await;
        }
        (None, None) if session_method => {
            let e = RpcError::invalid_params(format!("{method} needs a sessionId"));
            conn.reply_err(&id, &e).await;
        }
        // Naming no session, a method acpd has no part in (an extension, an ACP method newer
        // than acpd) is asked of a new child of the provider, as `authenticate` is: the
        // editor gets the agent's own answer, its -32601 included, as it would directly. Not
        // from inside a child's tree, which may not start bridge children.
        (None, None) if matches!(conn.lineage(), Lineage::Outside) => {
            let asked = capabilities::ask_new_child(conn.clone(), id, method, Login::Keep, params);
            conn.tracker.spawn(asked);
        }
        _ => {
            conn.reply_err(&id, &RpcError::method_not_found(&method))
                .await
        }
    }
}

/// What a prompt or a new title on bridge session `b` will change in the session map once
/// acpd has passed it on: `updatedAt` (and the title). Only for a session this connection
/// holds under its own id (not a subagent session under it), and a title only for an agent
/// that takes titles: what is refused changes nothing.
fn activity(
    conn: &Conn,
    kind: Forwarded,
    session: Option<String>,
    params: Option<&RawValue>,
    b: &BridgeHandle,
) -> Option<(String, Option<String>)> {
    let sid = session?;
    if !matches!(lock(&conn.sessions).get(&sid), Some(SessionRef::Bridge(_))) {
        return None;
    }
    match kind {
        Forwarded::Prompt => Some((sid, None)),
        Forwarded::SetTitle if advertises(b.child().agent(), "/sessionCapabilities/title") => {
            let title = params
                .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
                .and_then(|v| v.get("title")?.as_str().map(str::to_string))?;
            Some((sid, Some(title)))
        }
        _ => None,
    }
}

/// Writes what [`activity`] found, off the router.
fn note_activity(conn: &Conn, (sid, title): (String, Option<String>)) {
    let store = conn.ctx.sessions.store.clone();
    let owner = conn.caller();
    conn.tracker.spawn(async move {
        if let Err(e) = store.touch(&sid, owner, title).await {
            tracing::debug!(session = %sid, "cannot note the session's activity: {e}");
        }
    });
}

/// Writes `title` (and `updatedAt`) of session `sid` when run: after the agent took it.
fn title_once_taken(conn: &Conn, sid: String, title: String) -> crate::child::AfterOk {
    let store = conn.ctx.sessions.store.clone();
    let owner = conn.caller();
    Box::new(move || {
        Box::pin(async move {
            if let Err(e) = store.touch(&sid, owner, Some(title)).await {
                tracing::debug!(session = %sid, "cannot note the session's title: {e}");
            }
        })
    })
}

/// `$/cancel_request`: which session's agent got the request is its relay's to know: each
/// looks for the id among the calls it forwarded, and the one that has it sends the cancel on.
pub(super) fn cancel_request(conn: &Conn, method: &str, params: Option<&RawValue>) {
    let Some(p) = params else {
        return;
    };
    let bridges: Vec<BridgeHandle> = lock(&conn.sessions)
        .values()
        .filter_map(|s| match s {
            SessionRef::Bridge(b) => Some(b.clone()),
            SessionRef::Run { .. } => None,
        })
        .collect();
    for b in bridges {
        b.notify(method.to_string(), p.to_owned());
    }
}

/// A notification naming session `sid`: passed to the session's agent; a run's child is acpd's
/// to drive.
pub(super) fn notify(conn: &Conn, method: &str, sid: &str, params: Option<&RawValue>) {
    if let (Some(SessionRef::Bridge(b)), Some(p)) = (conn.session(sid), params) {
        b.notify(method.to_string(), p.to_owned());
    }
}

/// `session/cancel` of session `sid`: its turn, and the runs started under it.
pub(super) fn cancel(conn: &Arc<Conn>, method: &str, sid: &str, params: Option<&RawValue>) {
    let own = lock(&conn.sessions).get(sid).cloned();
    let target = own.clone().or_else(|| conn.session(sid));
    match target {
        // A bridge child's subagent session: its bridge routes the cancel to the child.
        Some(SessionRef::Bridge(b)) if own.is_none() => {
            if let Some(p) = params {
                b.notify(method.to_string(), p.to_owned());
            }
        }
        Some(SessionRef::Bridge(b)) => {
            b.cancel(params.map_or_else(
                || raw(&serde_json::json!({ "sessionId": sid })),
                ToOwned::to_owned,
            ));
            conn.cascade(sid, false);
            let nested = Parent::Session(sid.to_string());
            conn.ctx.registry.cancel_nested(&nested);
        }
        Some(SessionRef::Run { run_id }) => {
            let _ = conn.ctx.registry.cancel(conn.owner, &run_id);
        }
        None => cancel_nested_session(conn, sid),
    }
}

/// `session/cancel` of a run nested under one of this connection's bridge sessions (as
/// announced to it): the run's turn is cancelled, and what it started.
fn cancel_nested_session(conn: &Conn, sid: &str) {
    let registry = &conn.ctx.registry;
    let Some(run) = registry.runs().into_iter().find(|r| r.session_id == sid) else {
        return;
    };
    // Under one of this connection's bridge sessions, however many runs down.
    let mine = run
        .parent
        .as_ref()
        .and_then(|p| registry.top_session(p))
        .is_some_and(|s| matches!(lock(&conn.sessions).get(&s), Some(SessionRef::Bridge(_))));
    if mine {
        registry.cancel_run(&run);
    }
}
