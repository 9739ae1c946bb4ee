//! Ending a session by id, without a live child of the editor's own: `session/close` of a
//! session that is not open on this connection, and `session/delete`.

use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::live_sessions::held_elsewhere;
use super::{Conn, SessionRef, bridge_error, lock, raw, session_not_found};
use crate::registry::advertises;
use crate::store::Claim;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionOnly {
    session_id: String,
}

/// `session/close` of a session not open on this connection: a detached one ends; one acpd
/// knows but has no child for is already closed.
pub(super) async fn close_elsewhere(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: SessionOnly = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let sid = req.session_id;
    if conn
        .ctx
        .sessions
        .end_detached(&sid, conn.ctx.principal.as_ref())
        .await
    {
        let _ = conn.peer.respond_ok(&id, &json!({})).await;
        return;
    }
    match conn.ctx.sessions.store.get_owned(&sid, conn.caller()).await {
        Ok(Some(_)) => {
            let _ = conn.peer.respond_ok(&id, &json!({})).await;
        }
        Ok(None) => conn.reply_err(&id, &session_not_found(&sid)).await,
        Err(e) => {
            conn.reply_err(&id, &RpcError::internal(e.to_string()))
                .await
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteParams {
    session_id: String,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Value>,
}

/// `session/delete`: the agent deletes its session (when it can), acpd forgets the id. Only
/// the owner's, only when no other acpd holds it live, and nothing ends before the agent is
/// known to delete sessions at all: a refused delete changes nothing. An id this caller has
/// no session under is answered by [`delete_unknown`].
pub(super) async fn delete(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: DeleteParams = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let sid = req.session_id;
    let store = &conn.ctx.sessions.store;
    let holder = &conn.ctx.sessions.holder;
    let row = match store.get_owned(&sid, conn.caller()).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            let provider = req
                .meta
                .as_ref()
                .and_then(|m| m.pointer("/acpd/provider"))
                .and_then(|p| p.as_str());
            return delete_unknown(&conn, id, &sid, provider).await;
        }
        Err(e) => {
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    };
    if let Some(h) = row.lease.as_ref().filter(|h| *h != holder && h.alive()) {
        return conn.reply_err(&id, &held_elsewhere(&sid, h)).await;
    }
    let auth = conn.auth_for(&row.provider);
    let ready = conn
        .ctx
        .registry
        .ready(
            Some(&row.provider),
            None,
            crate::child::ClientCaps::default(),
            auth.as_deref(),
            &conn.closing,
        )
        .await;
    let mut ready = match ready {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &bridge_error(&e)).await,
    };
    if !advertises(ready.child.agent(), "/sessionCapabilities/delete") {
        ready.close().await;
        return conn
            .reply_err(&id, &RpcError::method_not_found("session/delete"))
            .await;
    }
    // Taken for the delete, until the agent answered it: no other acpd loads it meanwhile,
    // and the session ended below does not give the lease up on its way out.
    let deleting = match conn
        .ctx
        .sessions
        .begin_delete(&sid, conn.ctx.principal.as_ref())
    {
        Ok(d) => d,
        Err(e) => {
            ready.close().await;
            return conn.reply_err(&id, &e).await;
        }
    };
    match store.claim(&sid, conn.caller(), holder).await {
        Ok(Claim::Held) => {}
        Ok(Claim::Elsewhere(h)) => {
            ready.close().await;
            return conn.reply_err(&id, &held_elsewhere(&sid, &h)).await;
        }
        Ok(Claim::Unknown) => {
            ready.close().await;
            return conn.reply_err(&id, &session_not_found(&sid)).await;
        }
        Err(e) => {
            ready.close().await;
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    }
    // A session open here or detached ends first.
    let open_here = lock(&conn.sessions).remove(&sid);
    if let Some(SessionRef::Bridge(b)) = open_here {
        b.shut().await;
    }
    conn.ctx
        .sessions
        .end_detached(&sid, conn.ctx.principal.as_ref())
        .await;
    let params = raw(&json!({ "sessionId": row.child_session_id }));
    let answer = ready.call("session/delete", &params, &conn.closing).await;
    ready.close().await;
    match answer {
        Ok(result) => {
            if let Err(e) = store.remove(&sid).await {
                tracing::warn!(session = %sid, "cannot forget a deleted session: {e}");
            }
            drop(deleting);
            let _ = conn.peer.respond(&id, Ok(&result)).await;
        }
        Err(e) => {
            if let Err(e) = store.release(&sid, holder).await {
                tracing::warn!(session = %sid, "cannot release the session's lease: {e}");
            }
            drop(deleting);
            conn.reply_err(&id, &bridge_error(&e)).await
        }
    }
}

/// `session/delete` of an id this caller has no session under (one acpd never saw, or
/// another user's): answered as the agent of `provider` (the default when `None`) answers a
/// delete of a session it does not have — the real agents treat delete as idempotent and
/// answer `{}`, others -32002 — by asking it to delete a fresh random id. The editor's id is
/// never passed on: it could be the agent's own id of another user's session (the agent runs
/// as acpd's user for everyone), which a delete through acpd must not reach. Nothing changes
/// in acpd's map; the answer names the editor's id, so another user's session and an unknown
/// id are answered alike.
async fn delete_unknown(conn: &Arc<Conn>, id: Id, sid: &str, provider: Option<&str>) {
    let provider = provider.map(str::to_string);
    let auth = conn.auth_for(
        provider
            .as_deref()
            .unwrap_or(&conn.ctx.registry.config().default_provider),
    );
    let ready = conn
        .ctx
        .registry
        .ready(
            provider.as_deref(),
            None,
            crate::child::ClientCaps::default(),
            auth.as_deref(),
            &conn.closing,
        )
        .await;
    let mut ready = match ready {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &bridge_error(&e)).await,
    };
    if !advertises(ready.child.agent(), "/sessionCapabilities/delete") {
        ready.close().await;
        return conn
            .reply_err(&id, &RpcError::method_not_found("session/delete"))
            .await;
    }
    let stand_in = format!("acpd-unknown-{}", uuid::Uuid::new_v4());
    let params = raw(&json!({ "sessionId": stand_in }));
    let answer = ready.call("session/delete", &params, &conn.closing).await;
    ready.close().await;
    match answer {
        Ok(result) => {
            let _ = conn.peer.respond(&id, Ok(&result)).await;
        }
        Err(e) => {
            let mut e = bridge_error(&e);
            e.message = e.message.replace(&stand_in, sid);
            if let Some(data) = e.data.take() {
                // The editor's id as it stands inside a JSON string.
                let escaped = serde_json::to_string(sid).unwrap_or_default();
                let inner = escaped
                    .get(1..escaped.len().saturating_sub(1))
                    .unwrap_or("");
                let text = data.to_string().replace(&stand_in, inner);
                e.data = Some(serde_json::from_str(&text).unwrap_or(data));
            }
            conn.reply_err(&id, &e).await
        }
    }
}
