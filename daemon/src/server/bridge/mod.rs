//! Bridge sessions: one parent session proxied to one child session by the child's driver in
//! relay mode (see `child/relay.rs`). This module opens the session the way the editor asked
//! — `session/new`, `session/fork`, or `session/load`/`session/resume` of an acpd id, which
//! attaches a detached live child at once or starts the provider and loads the child's
//! session — files it under its acpd id, and lets it go when the driver ends. It never
//! touches the child's wire.

mod reopen;

use std::path::PathBuf;
use std::sync::Arc;

use acpd_protocol::content::{Fitted, PromptCaps, fit_prompt};
use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::session_id::with_session_id;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::bridge_workspace::{WorkspaceMeta, with_workspace};
use super::live_sessions::{RELEASE_WAIT, SessionWorkspace, Taken, held_elsewhere};
use super::{Conn, Seat, SessionRef, bridge_error, lock, raw, session_not_found};
use crate::child::{Child, First, Open, ParentServes, RelayTarget};
use crate::registry::{BridgeRequest, WorkspaceAsk, advertises};
use crate::store::{Claim, SessionRow};

use reopen::existing;
pub(super) use reopen::load;

/// The router's handle on a bridge session.
#[derive(Clone)]
pub(super) struct BridgeHandle {
    child: Child,
}

impl BridgeHandle {
    /// Forwards a parent's call on session `session` (the id the parent named); on refusal
    /// the caller answers the parent.
    pub(super) fn forward(
        &self,
        session: &str,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        after_ok: Option<crate::child::AfterOk>,
    ) -> Result<(), Box<(Id, RpcError)>> {
        self.child
            .call(id, method, params, after_ok)
            .map_err(|refused| {
                let (id, why) = *refused;
                Box::new((id, why.to_rpc_error(session)))
            })
    }

    /// Forwards a parent's `session/prompt` like [`BridgeHandle::forward`]; one holding
    /// content the agent did not advertise is converted where ACP allows, or refused.
    pub(super) fn prompt(
        &self,
        session: &str,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        after_ok: Option<crate::child::AfterOk>,
    ) -> Result<(), Box<(Id, RpcError)>> {
        let params = match params {
            Some(p) => {
                let caps = PromptCaps::from_agent_capabilities(&self.child.agent().capabilities);
                match fit_prompt(&p, caps) {
                    Ok(Fitted::Unchanged) => Some(p),
                    Ok(Fitted::Converted(p)) => Some(p),
                    Err(why) => {
                        let why = format!("agent \"{}\": {why}", self.child.provider().name);
                        return Err(Box::new((id, RpcError::invalid_params(why))));
                    }
                }
            }
            None => None,
        };
        self.forward(session, id, method, params, after_ok)
    }

    /// Forwards a parent's `session/cancel` with its params, in order with its other messages.
    pub(super) fn cancel(&self, params: Box<RawValue>) {
        self.child.cancel(params);
    }

    /// Forwards a parent's notification (dropped when the agent is behind).
    pub(super) fn notify(&self, method: String, params: Box<RawValue>) {
        self.child.notify(method, params);
    }

    /// Ends the session and waits until its child is reaped.
    pub(super) async fn shut(&self) {
        self.child.shut().await;
    }

    pub(super) fn child(&self) -> &Child {
        &self.child
    }
}

/// How a session acpd knows is opened again: `session/load` (the agent replays its history) or
/// `session/resume` (it re-binds without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reopen {
    Load,
    Resume,
}

impl Reopen {
    /// The ACP method, as the editor sent it and the agent is asked it.
    fn method(self) -> &'static str {
        match self {
            Reopen::Load => "session/load",
            Reopen::Resume => "session/resume",
        }
    }

    /// What the agent must advertise to take it.
    fn needs(self) -> &'static str {
        match self {
            Reopen::Load => "/loadSession",
            Reopen::Resume => "/sessionCapabilities/resume",
        }
    }

    /// How the session span says it was opened.
    fn opened(self) -> &'static str {
        match self {
            Reopen::Load => "load",
            Reopen::Resume => "resume",
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSession {
    cwd: PathBuf,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Value>,
}

/// `session/new`: starts the child and answers with a session id acpd minted.
pub(super) async fn open(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    // An object only: serde's derived structs would read an array by position.
    let req: NewSession = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    if !req.cwd.is_absolute() {
        let e = RpcError::invalid_params("cwd must be an absolute path");
        return conn.reply_err(&id, &e).await;
    }
    let provider = req
        .meta
        .as_ref()
        .and_then(|m| m.pointer("/acpd/provider"))
        .and_then(|p| p.as_str())
        .map(str::to_string);
    let workspace = match WorkspaceMeta::of(params.as_deref()) {
        Ok(w) => w,
        Err(e) => return conn.reply_err(&id, &e).await,
    };
    let params = forwarded_params(params.as_deref());
    let opened = Opening {
        provider: provider.as_deref(),
        cwd: req.cwd,
        method: "session/new",
        params,
        needs: None,
        workspace,
    };
    create(conn, id, opened).await;
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExistingSession {
    session_id: String,
    #[serde(default)]
    cwd: Option<PathBuf>,
}

/// `session/fork` of an acpd id: the provider forks its session into a new one, which gets a
/// new acpd id and a child of its own.
pub(super) async fn fork(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let Some((req, row)) = existing(&conn, &id, params.as_deref()).await else {
        return;
    };
    // Forking a session another acpd runs would read it mid-turn.
    let me = &conn.ctx.sessions.holder;
    if let Some(h) = row.lease.as_ref().filter(|h| *h != me && h.alive()) {
        return conn
            .reply_err(&id, &held_elsewhere(&req.session_id, h))
            .await;
    }
    let cwd = req.cwd.unwrap_or_else(|| row.cwd.clone());
    let Some(params) = params
        .as_deref()
        .and_then(|p| with_session_id(p, &row.child_session_id))
    else {
        return conn
            .reply_err(
                &id,
                &RpcError::invalid_params("session/fork needs a sessionId"),
            )
            .await;
    };
    let opened = Opening {
        provider: Some(&row.provider),
        cwd,
        method: "session/fork",
        params: forwarded_params(Some(&params)),
        needs: Some("/sessionCapabilities/fork"),
        workspace: WorkspaceMeta::default(),
    };
    create(conn, id, opened).await;
}

/// A child of `provider` (the default when `None`) opened for this connection: its
/// capabilities passed on, its earlier `authenticate` replayed; the error as the editor sees it.
async fn open_child(
    conn: &Conn,
    provider: Option<&str>,
    cwd: &std::path::Path,
    open: Open,
    needs: Option<&'static str>,
    workspace: WorkspaceAsk<'_>,
) -> Result<crate::registry::Launched, RpcError> {
    let default = conn.default_provider();
    let name = provider.unwrap_or(&default);
    let provider = Some(name);
    let auth = conn.auth_for(name);
    conn.ctx
        .registry
        .open_bridge(BridgeRequest {
            provider,
            cwd,
            open,
            needs,
            client_capabilities: conn.child_capabilities(),
            auth: auth.as_deref(),
            cancel: &conn.closing,
            workspace,
        })
        .await
        .map_err(|e| bridge_error(&e))
}

/// A session a child creates (`session/new`, `session/fork`).
struct Opening<'a> {
    provider: Option<&'a str>,
    cwd: PathBuf,
    method: &'static str,
    params: serde_json::Value,
    needs: Option<&'static str>,
    workspace: WorkspaceMeta,
}

async fn create(conn: Arc<Conn>, id: Id, o: Opening<'_>) {
    let Some(seat) = conn.take_seat() else {
        return conn.reply_err(&id, &conn.seat_limit()).await;
    };
    let minted = format!("acpd-{}", uuid::Uuid::new_v4());
    let mut params = o.params;
    let opened = match o.method {
        "session/fork" => "fork",
        _ => "new",
    };
    let spans = crate::otel::exporting().map(|otel| {
        let meta = params.get("_meta").and_then(|m| m.as_object());
        let (session, start) = session_spans(otel, &minted, opened, meta);
        if let Some(obj) = params.as_object_mut()
            && let Some(meta) = obj
                .entry("_meta")
                .or_insert_with(|| json!({}))
                .as_object_mut()
        {
            start.inject(meta);
        }
        (session, start)
    });
    let open = Open::Create {
        method: o.method,
        params,
    };
    // A worktree is named after the session, minted above.
    let ask = o.workspace.ask(&minted, false);
    let launched = open_child(&conn, o.provider, &o.cwd, open, o.needs, ask).await;
    end_start(spans, &launched);
    let launched = match launched {
        Ok(l) => l,
        Err(e) => return conn.reply_err(&id, &e).await,
    };
    let child = launched.child;
    let workspace = launched.workspace;
    let row = SessionRow {
        acpd_id: minted.clone(),
        provider: launched.provider.name.clone(),
        child_session_id: child.session_id().to_string(),
        cwd: o.cwd,
        title: None,
        updated_at: crate::store::now(),
        owner: conn.caller(),
        lease: Some(conn.ctx.sessions.holder.clone()),
    };
    // Only a session the agent can bring back is worth remembering (and listing).
    let agent = child.agent();
    let lasting =
        advertises(agent, "/loadSession") || advertises(agent, "/sessionCapabilities/resume");
    if lasting && let Err(e) = conn.ctx.sessions.store.insert(row).await {
        tracing::warn!(session = %minted, "the session map cannot keep this session: {e}");
    }
    let mut reply = with_session_id(child.session_reply(), &minted)
        .unwrap_or_else(|| raw(&json!({ "sessionId": minted })));
    if let Some(w) = &workspace {
        reply = with_workspace(&reply, &SessionWorkspace::of_worktree(w));
    }
    conn.ctx.sessions.file(
        &minted,
        child.clone(),
        launched.slot,
        conn.ctx.principal.clone(),
        conn.ctx.registry.clone(),
        workspace,
    );
    attach(conn, minted, child, First::Answer(id, reply), seat).await;
}

/// A bridge session's span, continuing the trace context in `meta` (the `_meta` of the
/// editor's request that opened it) or a new trace; `opened` says how: `new`, `fork`, `load`,
/// `resume`, `re-attach`.
fn session_span(
    otel: &crate::otel::Otel,
    sid: &str,
    opened: &'static str,
    meta: Option<&serde_json::Map<String, serde_json::Value>>,
) -> crate::otel::Span {
    let attributes = vec![
        opentelemetry::KeyValue::new("acpd.session.id", sid.to_string()),
        opentelemetry::KeyValue::new("acpd.session.opened", opened),
    ];
    otel.span("acpd.session", meta, attributes)
}

/// A session span and its child's start's.
fn session_spans(
    otel: &crate::otel::Otel,
    sid: &str,
    opened: &'static str,
    meta: Option<&serde_json::Map<String, serde_json::Value>>,
) -> (crate::otel::Span, crate::otel::Span) {
    let session = session_span(otel, sid, opened, meta);
    let start = session
        .child("acpd.start", Vec::new())
        .unwrap_or_else(|| session.clone());
    (session, start)
}

/// Ends the start span with the start's outcome; the session span goes to the child (ended
/// by its teardown), or ends failed with the start.
fn end_start(
    spans: Option<(crate::otel::Span, crate::otel::Span)>,
    launched: &Result<crate::registry::Launched, RpcError>,
) {
    let Some((session, start)) = spans else {
        return;
    };
    match launched {
        Ok(l) => {
            for span in [&session, &start] {
                span.set("acpd.provider", l.provider.name.clone());
            }
            l.child.hold_span(session);
        }
        Err(e) => {
            session.fail(e.message.clone());
            start.fail(e.message.clone());
            session.end();
        }
    }
    start.end();
}

/// The `_meta` of the editor's params, read only when spans are exported.
fn editor_meta(params: Option<&RawValue>) -> Option<serde_json::Map<String, serde_json::Value>> {
    crate::otel::exporting()?;
    let value: serde_json::Value = serde_json::from_str(params?.get()).ok()?;
    match value {
        serde_json::Value::Object(mut o) => match o.remove("_meta")? {
            serde_json::Value::Object(m) => Some(m),
            _ => None,
        },
        _ => None,
    }
}

/// The editor's params as the agent gets them: acpd's own `_meta.acpd` taken out.
fn forwarded_params(params: Option<&RawValue>) -> serde_json::Value {
    let mut value: serde_json::Value = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_else(|| json!({}));
    if let Some(meta) = value.get_mut("_meta").and_then(|m| m.as_object_mut()) {
        meta.remove("acpd");
        if meta.is_empty() {
            value.as_object_mut().map(|o| o.remove("_meta"));
        }
    }
    if value.get("mcpServers").is_none() {
        value["mcpServers"] = json!([]);
    }
    value
}

/// Takes `sid` out of this connection's table while it is still `child`'s session; false when
/// the id names another session now (a load filed it again after a close), which is left alone.
fn forget(conn: &Conn, sid: &str, child: &Child) -> bool {
    let mut sessions = lock(&conn.sessions);
    match sessions.get(sid) {
        Some(SessionRef::Bridge(b)) if b.child.is(child) => {
            sessions.remove(sid);
            true
        }
        Some(_) => false,
        None => true,
    }
}

/// Files a live session on this connection and starts relaying it here.
async fn attach(conn: Arc<Conn>, sid: String, child: Child, first: First, seat: Seat) {
    {
        // Under the sessions lock, which shutdown takes after cancelling `closing`: the
        // session is either released by shutdown or never filed.
        let mut sessions = lock(&conn.sessions);
        if conn.closing.is_cancelled() {
            drop(sessions);
            let shutting = conn.ctx.shutdown.is_cancelled();
            conn.ctx.sessions.release(&sid, &child, shutting).await;
            return;
        }
        let handle = BridgeHandle {
            child: child.clone(),
        };
        sessions.insert(sid.clone(), SessionRef::Bridge(handle));
    }
    let client = conn.client();
    let confinement = child.confinement();
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: sid.clone(),
        serves: ParentServes {
            read_text_file: client.has("/fs/readTextFile"),
            write_text_file: client.has("/fs/writeTextFile"),
            terminal: client.has("/terminal") && confinement.is_none(),
            elicitation: client.has("/elicitation"),
            subagents: client.subagents,
        },
        confinement,
        first,
        detach: conn.ctx.sessions.detach,
        on_closed: Some(Box::new({
            let (conn, sid, child) = (Arc::downgrade(&conn), sid.clone(), child.clone());
            move || {
                if let Some(conn) = conn.upgrade() {
                    forget(&conn, &sid, &child);
                }
            }
        })),
    });
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        tokio::select! {
            _ = child.ended() => {
                // Closing the session closes its subagents too, once the child is gone —
                // unless a load filed the id on this connection again meanwhile.
                if forget(&conn2, &sid, &child) {
                    conn2.cascade(&sid, true);
                }
            }
            () = conn2.closing.cancelled() => {}
        }
        drop(seat);
    });
}
