//! Bridge sessions: one parent session proxied to one child session by the child's driver in
//! relay mode (see `child/relay.rs`). This module opens the session (through the registry's
//! gate), files it under the id acpd minted, and closes it when the driver ends; it never
//! touches the child's wire.

use std::path::PathBuf;
use std::sync::Arc;

use acpd_protocol::acp::ClientCapabilities;
use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::session_id::with_session_id;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::{Conn, SessionRef, lock, raw, typed_error};
use crate::child::{Child, ParentServes, RelayTarget, SessionParams};
use crate::registry::BridgeRequest;

/// The router's handle on a bridge session.
#[derive(Clone)]
pub struct BridgeHandle {
    child: Child,
}

impl BridgeHandle {
    /// Forwards a parent's call; on refusal the caller answers the parent.
    pub fn forward(
        &self,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Result<(), Box<(Id, RpcError)>> {
        self.child.call(id, method, params)
    }

    pub fn cancel(&self) {
        self.child.cancel();
    }

    /// Forwards a parent's `_` extension notification (dropped when the agent is behind).
    pub fn notify(&self, method: String, params: Box<RawValue>) {
        self.child.notify(method, params);
    }

    /// Ends the session and waits until its child is reaped.
    pub async fn shut(&self) {
        self.child.shut().await;
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
    // An object only: serde's derived structs would read an array by position.
    let req: NewSession = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    if !req.cwd.is_absolute() {
        let e = RpcError::invalid_params("cwd must be an absolute path");
        return conn.reply_err(&id, &e).await;
    }
    let Some(seat) = conn.take_seat() else {
        return conn.reply_err(&id, &conn.seat_limit()).await;
    };
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
    let child = launched.child;
    let reply = with_session_id(child.session_reply(), &minted)
        .unwrap_or_else(|| raw(&json!({ "sessionId": minted })));
    {
        // Under the sessions lock, which shutdown takes after cancelling `closing`: the
        // session is either drained by shutdown or never filed.
        let mut sessions = lock(&conn.sessions);
        if conn.closing.is_cancelled() {
            drop(sessions);
            child.shut().await;
            return;
        }
        let handle = BridgeHandle {
            child: child.clone(),
        };
        sessions.insert(minted.clone(), SessionRef::Bridge(handle));
    }
    child.relay(RelayTarget {
        parent: conn.peer.clone(),
        session_id: minted.clone(),
        serves: ParentServes {
            read_text_file: client.has("/fs/readTextFile"),
            write_text_file: client.has("/fs/writeTextFile"),
            terminal: client.has("/terminal"),
        },
        answer: Some((id, reply)),
    });
    let slot = launched.slot;
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        let end = child.ended().await;
        tracing::info!(provider = %child.provider().name, session = %minted, ?end, "bridge session ended");
        lock(&conn2.sessions).remove(&minted);
        child.shut().await;
        drop(slot);
        drop(seat);
        // Closing the session closes its subagents too, once the child is gone.
        conn2.cascade(&minted, true);
    });
}
