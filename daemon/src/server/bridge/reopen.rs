//! Reopening a session the editor names: `session/load` and `session/resume` of one acpd
//! holds (re-attached, detached or open elsewhere) or of one the session map remembers (a new
//! child, the agent asked to load it, its worktree made again from the branch).

use super::*;

/// `session/load` and `session/resume` of an acpd id.
pub(in crate::server) async fn load(
    conn: Arc<Conn>,
    id: Id,
    reopen: Reopen,
    params: Option<Box<RawValue>>,
) {
    let method = reopen.method();
    let Some(sid) = params
        .as_deref()
        .and_then(acpd_protocol::session_id::session_id)
    else {
        let e = RpcError::invalid_params(format!("{method} needs a sessionId"));
        return conn.reply_err(&id, &e).await;
    };
    let open_here = match lock(&conn.sessions).get(&sid) {
        Some(SessionRef::Bridge(b)) => Some(b.clone()),
        _ => None,
    };
    if let Some(b) = open_here {
        return again(&conn, b, id, &sid, reopen, params.as_deref()).await;
    }
    let sessions = conn.ctx.sessions.clone();
    let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
    let _reserved = loop {
        let released = sessions.released.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        let foreign = match sessions.take_for_load(&sid, conn.ctx.principal.as_ref()) {
            Err(e) => return conn.reply_err(&id, &e).await,
            Ok(Taken::Detached(child)) => {
                let meta = editor_meta(params.as_deref());
                return reattach(conn, id, sid, child, meta).await;
            }
            Ok(Taken::Reserved(r)) => break r,
            Ok(Taken::Attached) => false,
            Ok(Taken::Foreign) => true,
        };
        if tokio::time::timeout_at(deadline, released).await.is_err() {
            if foreign {
                // Still another user's: this caller learns nothing of it.
                return conn.reply_err(&id, &session_not_found(&sid)).await;
            }
            let e = RpcError::invalid_request(format!(
                "session {sid} is open on another connection; close it there first"
            ));
            return conn.reply_err(&id, &e).await;
        }
    };
    let Some((req, row)) = existing(&conn, &id, params.as_deref()).await else {
        return;
    };
    let workspace = match WorkspaceMeta::of(params.as_deref()) {
        Ok(w) => w,
        Err(e) => return conn.reply_err(&id, &e).await,
    };
    let Some(seat) = conn.take_seat() else {
        return conn.reply_err(&id, &conn.seat_limit()).await;
    };
    // Live in one acpd at a time: taken here, or refused naming the acpd that has it.
    let store = &conn.ctx.sessions.store;
    let me = &conn.ctx.sessions.holder;
    match store.claim(&row.acpd_id, conn.caller(), me).await {
        Ok(Claim::Held) => {}
        Ok(Claim::Elsewhere(h)) => return conn.reply_err(&id, &held_elsewhere(&sid, &h)).await,
        Ok(Claim::Unknown) => return conn.reply_err(&id, &session_not_found(&sid)).await,
        Err(e) => {
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    }
    let needs = reopen.needs();
    let cwd = req.cwd.unwrap_or_else(|| row.cwd.clone());
    let open = Open::Existing {
        child_session_id: row.child_session_id.clone(),
    };
    let ask = workspace.ask(&row.acpd_id, true);
    let meta = editor_meta(params.as_deref());
    let spans = crate::otel::exporting()
        .map(|otel| session_spans(otel, &row.acpd_id, reopen.opened(), meta.as_ref()));
    // The agent's load (sent once the session is attached) names the session span.
    let session_span = spans.as_ref().map(|(session, _)| session.clone());
    let opened = open_child(&conn, Some(&row.provider), &cwd, open, Some(needs), ask).await;
    end_start(spans, &opened);
    let launched = match opened {
        Ok(l) => l,
        Err(e) => {
            if let Err(e) = store.release(&row.acpd_id, me).await {
                tracing::warn!(session = %sid, "cannot release the session's lease: {e}");
            }
            return conn.reply_err(&id, &e).await;
        }
    };
    let child = launched.child;
    let mut params = forwarded_params(params.as_deref());
    if let Some(w) = &launched.workspace {
        params["cwd"] = json!(w.cwd.to_string_lossy());
    }
    if let Some(span) = session_span
        && let Some(obj) = params.as_object_mut()
        && let Some(meta) = obj
            .entry("_meta")
            .or_insert_with(|| json!({}))
            .as_object_mut()
    {
        span.inject(meta);
    }
    conn.ctx.sessions.file(
        &row.acpd_id,
        child.clone(),
        launched.slot,
        conn.ctx.principal.clone(),
        conn.ctx.registry.clone(),
        launched.workspace,
    );
    let depth = launched.depth;
    conn.ctx
        .registry
        .offer_in(&mut params, &launched.provider, depth);
    let params = Some(raw(&params));
    let first = First::Open {
        id,
        method: method.to_string(),
        params,
    };
    attach(conn, row.acpd_id, child, first, seat).await;
}

/// `session/load` or `session/resume` of a session open on this very connection: asked of
/// its own child, as the agent would be asked directly (claude-agent-acp and codex-acp both
/// take it: a load replays the history — the replay reaches the editor under the acpd id, then
/// the answer — and a resume re-binds). The session stays open whatever the agent answers.
async fn again(
    conn: &Arc<Conn>,
    b: BridgeHandle,
    id: Id,
    sid: &str,
    reopen: Reopen,
    params: Option<&RawValue>,
) {
    let child = b.child();
    let needs = reopen.needs();
    if !advertises(child.agent(), needs) {
        let e = crate::registry::RegistryError::UnsupportedCapability {
            provider: child.provider().name.clone(),
            capability: needs.trim_start_matches('/'),
        };
        return conn.reply_err(&id, &bridge_error(&e)).await;
    }
    if let Some(cwd) = params
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
        .and_then(|v| v.get("cwd").cloned())
        && !cwd
            .as_str()
            .is_some_and(|c| std::path::Path::new(c).is_absolute())
    {
        let e = RpcError::invalid_params("cwd must be an absolute path");
        return conn.reply_err(&id, &e).await;
    }
    // What the first open sent the agent: the editor's params without `_meta.acpd`, with
    // acpd's MCP server when it is offered.
    let mut forwarded = forwarded_params(params);
    if let Some(w) = conn.ctx.sessions.workspace(sid) {
        forwarded["cwd"] = json!(w.cwd.to_string_lossy());
    }
    let registry = &conn.ctx.registry;
    registry.offer_in(&mut forwarded, child.provider(), registry.bridge_depth());
    let method = reopen.method().to_string();
    if let Err(refused) = b.forward(sid, id, method, Some(raw(&forwarded)), None) {
        let (id, e) = *refused;
        conn.reply_err(&id, &e).await;
    }
}

/// A detached live session attached to this connection: no reload, its pending permission
/// requests asked again. With spans exported, the attachment gets a session span of its own
/// (continuing `meta`, the load's trace context), and the previous attachment's ends.
async fn reattach(
    conn: Arc<Conn>,
    id: Id,
    sid: String,
    child: Child,
    meta: Option<serde_json::Map<String, serde_json::Value>>,
) {
    let Some(seat) = conn.take_seat() else {
        conn.ctx.sessions.release(&sid, &child, false).await;
        return conn.reply_err(&id, &conn.seat_limit()).await;
    };
    if let Some(otel) = crate::otel::exporting() {
        let span = session_span(otel, &sid, "re-attach", meta.as_ref());
        span.set("acpd.provider", child.provider().name.clone());
        if let Some(previous) = child.hold_span(span) {
            previous.end();
        }
    }
    // What the agent answered at `session/new` (modes, models, config options), without the
    // session id a load does not answer with.
    let mut reply: serde_json::Value =
        serde_json::from_str(child.session_reply().get()).unwrap_or_else(|_| json!({}));
    if let Some(obj) = reply.as_object_mut() {
        obj.remove("sessionId");
    }
    let mut reply = raw(&reply);
    if let Some(w) = conn.ctx.sessions.workspace(&sid) {
        reply = with_workspace(&reply, &w);
    }
    attach(conn, sid, child, First::Answer(id, reply), seat).await;
}

/// The acpd id a request names and its row in the session map; answers the parent when
/// there is none.
pub(super) async fn existing(
    conn: &Arc<Conn>,
    id: &Id,
    params: Option<&RawValue>,
) -> Option<(ExistingSession, SessionRow)> {
    let req: ExistingSession = match acpd_protocol::methods::parse_params(params) {
        Ok(r) => r,
        Err(e) => {
            conn.reply_err(id, &RpcError::invalid_params(e)).await;
            return None;
        }
    };
    if let Some(cwd) = &req.cwd
        && !cwd.is_absolute()
    {
        conn.reply_err(
            id,
            &RpcError::invalid_params("cwd must be an absolute path"),
        )
        .await;
        return None;
    }
    match conn
        .ctx
        .sessions
        .store
        .get_owned(&req.session_id, conn.caller())
        .await
    {
        Ok(Some(row)) => Some((req, row)),
        Ok(None) => {
            conn.reply_err(id, &session_not_found(&req.session_id))
                .await;
            None
        }
        Err(e) => {
            conn.reply_err(id, &RpcError::internal(e.to_string())).await;
            None
        }
    }
}
