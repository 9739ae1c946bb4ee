//! Bridge sessions: one parent session proxied to one child session. Only session ids and
//! JSON-RPC request ids are remapped; updates travel raw, so kinds nobody here knows arrive
//! intact. One pump task per session owns the child connection: it forwards both ways, answers
//! the parent's calls in order with the child's output (an answer is sent only after every
//! update the child sent before it), and ends the session when the child dies.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::{ClientCapabilities, RequestPermissionRequest};
use acpd_protocol::envelope::{self, INTERNAL_ERROR, Id, RpcError};
use acpd_protocol::session_id::{splice_session_id, with_session_id};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use super::{Conn, SessionRef, lock, raw, typed_error};
use crate::child::{ChildHandle, Decision, SessionParams, decide_permission, permission_cancelled};
use crate::config::{PermissionPolicy, ProviderConfig};
use crate::registry::{BridgeRequest, Slot};
use crate::supervise;
use crate::wire::{CallError, Incoming, Peer};

enum Cmd {
    Forward {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Cancel,
    Shut(oneshot::Sender<()>),
}

/// The router's handle on a bridge session.
#[derive(Clone)]
pub struct BridgeHandle {
    cmds: mpsc::UnboundedSender<Cmd>,
}

impl BridgeHandle {
    pub fn forward(&self, id: Id, method: String, params: Option<Box<RawValue>>) {
        let _ = self.cmds.send(Cmd::Forward { id, method, params });
    }

    pub fn cancel(&self) {
        let _ = self.cmds.send(Cmd::Cancel);
    }

    /// Ends the session and waits until its child is reaped.
    pub async fn shut(&self) {
        let (tx, rx) = oneshot::channel();
        if self.cmds.send(Cmd::Shut(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSession {
    cwd: PathBuf,
    #[serde(default)]
    mcp_servers: Option<Box<RawValue>>,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Value>,
}

/// `session/new`: starts the child and answers with a session id acpd minted.
pub async fn open(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: NewSession = match params.as_deref().map(|p| serde_json::from_str(p.get())) {
        Some(Ok(r)) => r,
        Some(Err(e)) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
        None => {
            return conn
                .reply_err(&id, &RpcError::invalid_params("missing params"))
                .await;
        }
    };
    if !req.cwd.is_absolute() {
        return conn
            .reply_err(
                &id,
                &RpcError::invalid_params("cwd must be an absolute path"),
            )
            .await;
    }
    let provider = req
        .meta
        .as_ref()
        .and_then(|m| m.pointer("/acpd/provider"))
        .and_then(|p| p.as_str())
        .map(str::to_string);
    let client = conn.client();
    let mut capabilities: ClientCapabilities =
        serde_json::from_value(client.capabilities.clone()).unwrap_or_default();
    // A bridged child's own subagents would need their ids remapped too; not offered yet.
    capabilities.subagents = None;
    let launched = conn
        .ctx
        .registry
        .open_bridge(BridgeRequest {
            provider: provider.as_deref(),
            cwd: &req.cwd,
            session: SessionParams {
                mcp_servers: req.mcp_servers,
                system_prompt: None,
            },
            client_capabilities: capabilities,
            cancel: &conn.closing,
        })
        .await;
    let launched = match launched {
        Ok(l) => l,
        Err(e) => return conn.reply_err(&id, &typed_error(&e)).await,
    };
    let minted = format!("acpd-{}", uuid::Uuid::new_v4());
    let provider = launched.provider.clone();
    let parts = launched.child.into_bridge();
    let reply = with_session_id(&parts.session_reply, &minted)
        .unwrap_or_else(|| raw(&json!({ "sessionId": minted })));
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = BridgeHandle { cmds: tx };
    {
        // Under the sessions lock, which shutdown takes after cancelling `closing`: the
        // session is either drained by shutdown or never filed.
        let mut sessions = lock(&conn.sessions);
        if conn.closing.is_cancelled() {
            drop(sessions);
            parts.handle.teardown().await;
            return;
        }
        sessions.insert(minted.clone(), SessionRef::Bridge(handle));
    }
    let update_fast_path = UpdateSplice::new(&parts.session_id, &minted);
    let pump = Pump {
        conn: conn.clone(),
        minted,
        update_fast_path,
        provider,
        child: parts.peer,
        child_sid: parts.session_id,
        handle: parts.handle,
        reply: serde_json::from_str(parts.session_reply.get()).unwrap_or_default(),
        agent_caps: parts.agent.capabilities,
        _slot: launched.slot,
        asks: HashSet::new(),
        open_calls: HashSet::new(),
    };
    let _ = conn.peer.respond(&id, Ok(&reply)).await;
    conn.tracker.spawn(pump.run(parts.incoming, rx));
}

type Pending = FuturesUnordered<BoxFuture<'static, (Tag, Result<Box<RawValue>, CallError>)>>;

enum Tag {
    /// The parent's call, answered with the child's reply.
    Parent { id: Id, method: String },
    /// The child's request forwarded to the parent, answered with the parent's reply.
    Child { id: Id, ask: bool },
}

struct Pump {
    conn: Arc<Conn>,
    minted: String,
    update_fast_path: UpdateSplice,
    provider: Arc<ProviderConfig>,
    child: Peer,
    child_sid: String,
    handle: ChildHandle,
    /// The child's `session/new` result: which optional methods it supports.
    reply: serde_json::Value,
    agent_caps: serde_json::Value,
    /// Holds the session's claim on the limits until the pump ends.
    _slot: Slot,
    /// Child permission requests waiting for the parent (answered `cancelled` on cancel).
    asks: HashSet<Id>,
    /// Parent calls not answered yet; each gets an answer whatever happens.
    open_calls: HashSet<Id>,
}

/// Why a session ended.
enum End {
    ChildGone(Option<std::process::ExitStatus>),
    Protocol,
    Shut(Option<oneshot::Sender<()>>),
}

/// After the child exits, how long replies already in the pipe may take to arrive.
const LAST_WORDS: Duration = Duration::from_millis(200);

impl Pump {
    async fn run(
        mut self,
        mut incoming: mpsc::Receiver<Incoming>,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
    ) {
        let mut pending: Pending = FuturesUnordered::new();
        let tree = self.handle.tree().clone();
        let mut incoming_open = true;
        let end = loop {
            tokio::select! {
                cmd = cmds.recv() => match cmd {
                    None => break End::Shut(None),
                    Some(Cmd::Shut(done)) => break End::Shut(Some(done)),
                    Some(Cmd::Cancel) => self.cancel().await,
                    Some(Cmd::Forward { id, method, params }) => {
                        self.forward(id, method, params, &mut pending).await;
                    }
                },
                msg = incoming.recv(), if incoming_open => match msg {
                    None => incoming_open = false,
                    Some(Incoming::Fault(f)) => {
                        tracing::warn!(provider = %self.provider.name, session = %self.minted, "child sent a bad line: {f}");
                        break End::Protocol;
                    }
                    Some(msg) => self.on_child_message(msg, &mut pending).await,
                },
                Some((tag, result)) = pending.next(), if !pending.is_empty() => {
                    if let Some(end) = self.settle(tag, result, &mut incoming, &mut pending).await {
                        break end;
                    }
                }
                status = tree.exited() => {
                    let deadline = tokio::time::Instant::now() + LAST_WORDS;
                    let mut end = End::ChildGone(Some(status));
                    while let Ok(Some((tag, result))) = tokio::time::timeout_at(deadline, pending.next()).await {
                        if let Some(e) = self.settle(tag, result, &mut incoming, &mut pending).await {
                            end = e;
                            break;
                        }
                    }
                    break end;
                }
            }
        };
        lock(&self.conn.sessions).remove(&self.minted);
        drop(pending);
        let (error, done) = match end {
            End::ChildGone(status) => (self.died(status), None),
            End::Protocol => (
                RpcError::new(
                    INTERNAL_ERROR,
                    format!(
                        "agent \"{}\" sent a line that is not JSON-RPC; the session is closed",
                        self.provider.name
                    ),
                ),
                None,
            ),
            End::Shut(done) => (RpcError::internal("the session was closed"), done),
        };
        for id in std::mem::take(&mut self.open_calls) {
            let _ = self.conn.peer.respond_err(Some(&id), &error).await;
        }
        // Requests the router queued while the session was ending get the same answer.
        cmds.close();
        let mut shut = Vec::from_iter(done);
        while let Ok(cmd) = cmds.try_recv() {
            match cmd {
                Cmd::Forward { id, .. } => {
                    let _ = self.conn.peer.respond_err(Some(&id), &error).await;
                }
                Cmd::Shut(done) => shut.push(done),
                Cmd::Cancel => {}
            }
        }
        self.handle.teardown().await;
        for done in shut {
            let _ = done.send(());
        }
    }

    fn died(&self, status: Option<std::process::ExitStatus>) -> RpcError {
        let (code, signal) =
            status.map_or((None, None), |s| (s.code(), supervise::signal_name(&s)));
        let how = match (code, &signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "its output closed".to_string(),
        };
        RpcError::new(
            INTERNAL_ERROR,
            format!(
                "agent \"{}\" exited ({how}); the session is closed",
                self.provider.name
            ),
        )
        .with_data(json!({ "provider": self.provider.name, "exitCode": code, "signal": signal }))
    }

    async fn cancel(&mut self) {
        let cancel = json!({ "sessionId": self.child_sid });
        let _ = self.child.notify("session/cancel", &cancel).await;
        for id in std::mem::take(&mut self.asks) {
            let _ = self.child.respond_ok(&id, &permission_cancelled()).await;
        }
    }

    fn supports(&self, method: &str) -> bool {
        let present = |v: Option<&serde_json::Value>| v.is_some_and(|v| !v.is_null());
        match method {
            "session/prompt" => true,
            "session/close" => present(self.agent_caps.pointer("/sessionCapabilities/close")),
            "session/set_mode" => present(self.reply.get("modes")),
            "session/set_config_option" => present(self.reply.get("configOptions")),
            m => m.starts_with('_'),
        }
    }

    async fn forward(
        &mut self,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        pending: &mut Pending,
    ) {
        if !self.supports(&method) {
            let e = RpcError::method_not_found(&method);
            let _ = self.conn.peer.respond_err(Some(&id), &e).await;
            return;
        }
        let params = params
            .as_deref()
            .and_then(|p| with_session_id(p, &self.child_sid));
        self.open_calls.insert(id.clone());
        let call = self.child.call_raw(&method, params.as_deref()).await;
        pending.push(Box::pin(async move {
            let result = match call {
                Ok(call) => call.result().await,
                Err(e) => Err(e),
            };
            (Tag::Parent { id, method }, result)
        }));
    }

    /// A reply came back. Returns how the session ends, if it does.
    async fn settle(
        &mut self,
        tag: Tag,
        result: Result<Box<RawValue>, CallError>,
        incoming: &mut mpsc::Receiver<Incoming>,
        pending: &mut Pending,
    ) -> Option<End> {
        match tag {
            Tag::Parent { id, method } => {
                // Everything the child sent before this reply goes out first.
                while let Ok(msg) = incoming.try_recv() {
                    match msg {
                        Incoming::Fault(_) => return Some(End::Protocol),
                        msg => self.on_child_message(msg, pending).await,
                    }
                }
                self.open_calls.remove(&id);
                match result {
                    Ok(raw) => {
                        let _ = self.conn.peer.respond(&id, Ok(&raw)).await;
                        // Closing the session closes its subagents too, once the child agreed.
                        let closed = method == "session/close";
                        if closed {
                            self.conn.cascade(&self.minted, true);
                        }
                        closed.then_some(End::Shut(None))
                    }
                    Err(CallError::Rpc(e)) => {
                        let _ = self.conn.peer.respond_err(Some(&id), &e).await;
                        None
                    }
                    Err(CallError::Closed) => {
                        let status = tokio::time::timeout(
                            Duration::from_secs(1),
                            self.handle.tree().exited(),
                        )
                        .await
                        .ok();
                        let _ = self
                            .conn
                            .peer
                            .respond_err(Some(&id), &self.died(status))
                            .await;
                        Some(End::ChildGone(status))
                    }
                }
            }
            Tag::Child { id, ask } => {
                // A permission request already answered `cancelled` stays answered.
                if ask && !self.asks.remove(&id) {
                    return None;
                }
                let _ = match result {
                    Ok(raw) => self.child.respond(&id, Ok(&raw)).await,
                    Err(CallError::Rpc(e)) => self.child.respond_err(Some(&id), &e).await,
                    Err(CallError::Closed) => {
                        let e = RpcError::internal("the parent is gone");
                        self.child.respond_err(Some(&id), &e).await
                    }
                };
                None
            }
        }
    }

    async fn on_child_message(&mut self, msg: Incoming, pending: &mut Pending) {
        match msg {
            Incoming::Notification { method, params } => match params {
                Some(p) if method == "session/update" && self.update_fast_path.applies(p.get()) => {
                    let line = self.update_fast_path.line(p.get());
                    let _ = self.conn.peer.send_line(line).await;
                }
                Some(p) => {
                    let text = splice_session_id(p.get(), &self.minted);
                    let text = text.as_deref().unwrap_or(p.get());
                    let _ = self.conn.peer.notify_text(&method, text).await;
                }
                None => {
                    let _ = self.conn.peer.notify_raw(&method, None).await;
                }
            },
            Incoming::Request { id, method, params } => {
                self.child_request(id, method, params, pending).await;
            }
            Incoming::Fault(_) => {}
        }
    }

    async fn child_request(
        &mut self,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        pending: &mut Pending,
    ) {
        let client = self.conn.client();
        let allowed = match method.as_str() {
            "session/request_permission" => match self.provider.permission {
                PermissionPolicy::Forward => true,
                policy => {
                    let decision = if policy == PermissionPolicy::Allow {
                        Decision::Allow
                    } else {
                        Decision::Reject
                    };
                    let answer = params
                        .as_deref()
                        .and_then(|p| {
                            serde_json::from_str::<RequestPermissionRequest>(p.get()).ok()
                        })
                        .map(|r| decide_permission(&r, decision))
                        .unwrap_or_else(permission_cancelled);
                    let _ = self.child.respond_ok(&id, &answer).await;
                    return;
                }
            },
            "fs/read_text_file" => client.has("/fs/readTextFile"),
            "fs/write_text_file" => client.has("/fs/writeTextFile"),
            m if m.starts_with("terminal/") => client.has("/terminal"),
            m => m.starts_with('_'),
        };
        if !allowed {
            let e = RpcError::method_not_found(&method);
            let _ = self.child.respond_err(Some(&id), &e).await;
            return;
        }
        let params = params
            .as_deref()
            .map(|p| with_session_id(p, &self.minted).unwrap_or_else(|| p.to_owned()));
        let ask = method == "session/request_permission";
        if ask {
            self.asks.insert(id.clone());
        }
        let call = self.conn.peer.call_raw(&method, params.as_deref()).await;
        pending.push(Box::pin(async move {
            let result = match call {
                Ok(call) => call.result().await,
                Err(e) => Err(e),
            };
            (Tag::Child { id, ask }, result)
        }));
    }
}

/// The hot path: a child's `session/update` params almost always start with its own session
/// id, so the forwarded line is a fixed prefix (with the minted id) plus the rest of the params,
/// copied once, with no JSON work beyond the envelope parse that already validated it.
struct UpdateSplice {
    child_prefix: String,
    line_prefix: Vec<u8>,
}

impl UpdateSplice {
    fn new(child_sid: &str, minted: &str) -> Self {
        let child_prefix = format!("{{\"sessionId\":{}", envelope::json_string(child_sid));
        let line_prefix = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{{\"sessionId\":{}",
            envelope::json_string(minted)
        )
        .into_bytes();
        UpdateSplice {
            child_prefix,
            line_prefix,
        }
    }

    fn applies(&self, params: &str) -> bool {
        params.starts_with(&self.child_prefix)
            && matches!(
                params.as_bytes().get(self.child_prefix.len()),
                Some(b',' | b'}')
            )
    }

    fn line(&self, params: &str) -> Vec<u8> {
        let rest = &params.as_bytes()[self.child_prefix.len()..];
        let mut line = Vec::with_capacity(self.line_prefix.len() + rest.len() + 2);
        line.extend_from_slice(&self.line_prefix);
        line.extend_from_slice(rest);
        line.push(b'}');
        line
    }
}
