//! Sessions that last: the daemon-wide table of live bridge sessions (attached to a
//! connection or detached, waiting for one), the durable session map behind it, and the
//! session methods that need no live child of the editor's own: `session/list`,
//! `session/close` of a session that is not open here, `session/delete`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acpd_protocol::acp::ClientCapabilities;
use acpd_protocol::envelope::{Id, RpcError};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use tokio_util::task::TaskTracker;

use super::{Conn, SessionRef, bridge_error, lock, raw, session_not_found};
use crate::child::Child;
use crate::registry::{Slot, advertises};
use crate::store::{SessionRow, Store};

/// Pages of `session/list` asked of one agent, at most (a listing that never ends is cut).
const MAX_CHILD_PAGES: usize = 20;

/// The session map in the state directory, else one in memory (acpd runs, remembering
/// nothing past its exit).
pub fn open_store() -> Store {
    Store::open_default().unwrap_or_else(Store::in_memory)
}

/// Every live bridge session of this acpd process.
pub struct Sessions {
    pub store: Store,
    live: Mutex<HashMap<String, Live>>,
    /// Ids being opened right now (a load spawning its child), so a second load of the same
    /// id waits its turn instead of opening it twice.
    opening: Mutex<std::collections::HashSet<String>>,
    /// Woken when a connection releases its sessions (see [`RELEASE_WAIT`]).
    pub released: tokio::sync::Notify,
    /// How long a session outlives its connection (`acpd serve`'s `detach_timeout`); `None`
    /// ends it with the connection (stdio, or `detach_timeout = "0s"`).
    pub detach: Option<Duration>,
    tasks: TaskTracker,
}

struct Live {
    child: Child,
    /// The uid of the connection that opened it: only that user may attach it again.
    uid: Option<u32>,
    attached: bool,
}

/// What a load found (see [`Sessions::take_for_load`]).
pub enum Taken {
    Detached(Child),
    Reserved(Reservation),
    /// Open on another connection (which may be closing right now).
    Attached,
}

/// How long a load waits for the connection holding its session to finish closing: an editor
/// that reconnects at once can be faster than acpd reading its old connection's end.
pub const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// An id being opened: no other load may open it until this drops.
pub struct Reservation {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.sessions.opening).remove(&self.id);
    }
}

/// What `acpd status` shows of bridge sessions.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SessionCounts {
    pub attached: usize,
    pub detached: usize,
}

impl Sessions {
    pub fn new(store: Store, detach: Option<Duration>) -> Arc<Sessions> {
        Arc::new(Sessions {
            store,
            live: Mutex::new(HashMap::new()),
            opening: Mutex::default(),
            released: tokio::sync::Notify::new(),
            detach,
            tasks: TaskTracker::new(),
        })
    }

    /// Files a live session (attached) and watches it: when its driver ends it is forgotten,
    /// its tree reaped (the runs its child started with it) and its claim on the limits
    /// released.
    pub fn file(
        self: &Arc<Self>,
        id: &str,
        child: Child,
        slot: Slot,
        uid: Option<u32>,
        registry: crate::registry::Registry,
    ) {
        lock(&self.live).insert(
            id.to_string(),
            Live {
                child: child.clone(),
                uid,
                attached: true,
            },
        );
        let me = self.clone();
        let id = id.to_string();
        self.tasks.spawn(async move {
            let end = child.ended().await;
            tracing::info!(provider = %child.provider().name, session = %id, ?end, "bridge session ended");
            lock(&me.live).remove(&id);
            let nested = crate::registry::Parent::Session(id.clone());
            tokio::join!(child.shut(), registry.dispose_nested(&nested));
            drop(slot);
        });
    }

    /// The connection holding the session closed: it waits for another (`detach`), or ends.
    pub async fn release(&self, id: &str, child: &Child, shutting_down: bool) {
        if self.detach.is_some() && !shutting_down {
            // Signalled before anyone can take it, so the detach never lands on the next
            // connection.
            child.detach();
            if let Some(live) = lock(&self.live).get_mut(id) {
                live.attached = false;
            }
            self.released.notify_waiters();
        } else {
            child.shut().await;
        }
    }

    /// What a load of `id` by `uid` finds: a detached session it may attach (taken), nothing
    /// live (the id is then reserved until the returned guard drops or the session is filed),
    /// or an error when the session is open on another connection or being opened.
    pub fn take_for_load(self: &Arc<Self>, id: &str, uid: Option<u32>) -> Result<Taken, RpcError> {
        let mut live = lock(&self.live);
        if lock(&self.opening).contains(id) {
            return Err(RpcError::invalid_request(format!(
                "session {id} is being opened by another request; retry when it answers"
            )));
        }
        let Some(entry) = live.get_mut(id) else {
            lock(&self.opening).insert(id.to_string());
            return Ok(Taken::Reserved(Reservation {
                sessions: self.clone(),
                id: id.to_string(),
            }));
        };
        if entry.uid != uid {
            return Err(session_not_found(id));
        }
        if entry.attached {
            return Ok(Taken::Attached);
        }
        entry.attached = true;
        Ok(Taken::Detached(entry.child.clone()))
    }

    /// Ends a detached session of `uid`; false when there is none.
    pub async fn end_detached(&self, id: &str, uid: Option<u32>) -> bool {
        let child = {
            let live = lock(&self.live);
            live.get(id)
                .filter(|l| !l.attached && l.uid == uid)
                .map(|l| l.child.clone())
        };
        match child {
            Some(child) => {
                child.shut().await;
                true
            }
            None => false,
        }
    }

    /// The live session whose child is process `pid`.
    pub fn by_pid(&self, pid: i32) -> Option<String> {
        lock(&self.live)
            .iter()
            .find(|(_, l)| l.child.pid() == pid)
            .map(|(id, _)| id.clone())
    }

    /// Sends a `session/update` about a run nested under session `id` to its parent, if the
    /// session is live (a detached one drops it).
    pub fn announce(&self, id: &str, params: Box<RawValue>) {
        if let Some(live) = lock(&self.live).get(id) {
            live.child.announce(params);
        }
    }

    /// The connection of the editor holding live session `id`, when it can be asked about a
    /// run nested under it (attached, opted in to Subagent Sessions).
    pub async fn editor_of(&self, id: &str) -> Option<crate::wire::Peer> {
        let child = lock(&self.live).get(id).map(|l| l.child.clone())?;
        child.parent_peer().await
    }

    pub fn counts(&self) -> SessionCounts {
        let live = lock(&self.live);
        let attached = live.values().filter(|l| l.attached).count();
        SessionCounts {
            attached,
            detached: live.len() - attached,
        }
    }

    /// The live sessions of `uid`, for `acpd runs`.
    pub fn entries(&self, uid: Option<u32>) -> Vec<acpd_protocol::methods::SessionEntry> {
        let live = lock(&self.live);
        let mut entries: Vec<_> = live
            .iter()
            .filter(|(_, l)| l.uid == uid)
            .map(|(id, l)| acpd_protocol::methods::SessionEntry {
                session_id: id.clone(),
                provider: l.child.provider().name.clone(),
                pid: l.child.pid(),
                state: if l.attached { "attached" } else { "detached" }.to_string(),
            })
            .collect();
        entries.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        entries
    }

    /// Ends every live session and waits until each tree is reaped (acpd is stopping).
    pub async fn shut_all(&self) {
        let children: Vec<Child> = lock(&self.live).values().map(|l| l.child.clone()).collect();
        futures::future::join_all(children.iter().map(|c| c.shut())).await;
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    #[serde(default)]
    cwd: Option<PathBuf>,
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChildListing {
    #[serde(default)]
    sessions: Vec<ChildSession>,
    #[serde(default)]
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChildSession {
    session_id: String,
    cwd: PathBuf,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    updated_at: Option<String>,
}

/// `session/list`: the sessions of every provider whose agent lists them (asked now, under
/// acpd ids) and the ones acpd opened on any other, newest first, in pages.
pub async fn list(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: ListParams = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let store = &conn.ctx.sessions.store;
    for provider in conn.ctx.registry.provider_names() {
        let Some(agent) = conn.ctx.registry.cached(&provider) else {
            continue;
        };
        if !advertises(&agent, "/sessionCapabilities/list") {
            continue;
        }
        if let Err(e) = refresh(&conn, &provider, req.cwd.as_deref()).await {
            // An agent that wants a login says so to the editor, as it would directly.
            if e.code == acpd_protocol::envelope::AUTH_REQUIRED {
                return conn.reply_err(&id, &e).await;
            }
            tracing::warn!(%provider, "session/list: the agent's own listing failed: {}", e.message);
        }
    }
    let rows = match store.list(req.cwd.as_deref()).await {
        Ok(rows) => rows,
        Err(e) => {
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    };
    let (page, next) = match acpd_protocol::listing::page(
        rows,
        req.cursor.as_deref(),
        acpd_protocol::listing::PAGE,
    ) {
        Ok(p) => p,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let sessions: Vec<serde_json::Value> = page.iter().map(session_info).collect();
    let mut result = json!({ "sessions": sessions });
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    }
    let _ = conn.peer.respond_ok(&id, &result).await;
}

fn session_info(row: &SessionRow) -> serde_json::Value {
    let mut info = json!({
        "sessionId": row.acpd_id,
        "cwd": row.cwd,
        "updatedAt": row.updated_at,
        "_meta": { "acpd": { "provider": row.provider } },
    });
    if let Some(title) = &row.title {
        info["title"] = json!(title);
    }
    info
}

/// Asks a child of `provider` for its sessions and files each under an acpd id.
async fn refresh(
    conn: &Arc<Conn>,
    provider: &str,
    cwd: Option<&std::path::Path>,
) -> Result<(), RpcError> {
    let internal = |e: String| RpcError::internal(e);
    let auth = conn.auth_for(provider);
    let mut ready = conn
        .ctx
        .registry
        .ready(
            Some(provider),
            None,
            ClientCapabilities::default(),
            auth.as_deref(),
            &conn.closing,
        )
        .await
        .map_err(|e| bridge_error(&e))?;
    let listing = list_all(&mut ready, conn, provider, cwd).await;
    ready.close().await;
    let (listed, complete) = listing?;
    // What the agent no longer lists, it deleted (only a whole, unfiltered listing says so).
    if complete && cwd.is_none() {
        conn.ctx
            .sessions
            .store
            .forget_unlisted(provider, &listed)
            .await
            .map_err(|e| internal(e.to_string()))?;
    }
    Ok(())
}

/// Every page of the agent's listing, each session filed; the child ids and whether the
/// listing was whole.
async fn list_all(
    ready: &mut crate::registry::Ready,
    conn: &Arc<Conn>,
    provider: &str,
    cwd: Option<&std::path::Path>,
) -> Result<(Vec<String>, bool), RpcError> {
    let internal = |e: String| RpcError::internal(e);
    let store = &conn.ctx.sessions.store;
    let mut cursor: Option<String> = None;
    let mut listed = Vec::new();
    for _ in 0..MAX_CHILD_PAGES {
        let mut params = json!({});
        if let Some(cwd) = cwd {
            params["cwd"] = json!(cwd);
        }
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let answer = ready
            .call("session/list", &raw(&params), &conn.closing)
            .await
            .map_err(|e| bridge_error(&e))?;
        let page: ChildListing =
            serde_json::from_str(answer.get()).map_err(|e| internal(e.to_string()))?;
        for s in page.sessions {
            store
                .adopt(provider, &s.session_id, &s.cwd, s.title, s.updated_at)
                .await
                .map_err(|e| internal(e.to_string()))?;
            listed.push(s.session_id);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok((listed, true));
        }
    }
    Ok((listed, false))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionOnly {
    session_id: String,
}

/// `session/close` of a session not open on this connection: a detached one ends; one acpd
/// knows but has no child for is already closed.
pub async fn close_elsewhere(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: SessionOnly = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let sid = req.session_id;
    if conn
        .ctx
        .sessions
        .end_detached(&sid, conn.ctx.peer_uid)
        .await
    {
        let _ = conn.peer.respond_ok(&id, &json!({})).await;
        return;
    }
    match conn.ctx.sessions.store.get(&sid).await {
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

/// `session/delete`: the agent deletes its session (when it can), acpd forgets the id.
pub async fn delete(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: SessionOnly = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let sid = req.session_id;
    let store = &conn.ctx.sessions.store;
    let row = match store.get(&sid).await {
        Ok(Some(row)) => row,
        Ok(None) => return conn.reply_err(&id, &session_not_found(&sid)).await,
        Err(e) => {
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    };
    // A session open here or detached ends first.
    let open_here = lock(&conn.sessions).remove(&sid);
    if let Some(SessionRef::Bridge(b)) = open_here {
        b.shut().await;
    }
    conn.ctx
        .sessions
        .end_detached(&sid, conn.ctx.peer_uid)
        .await;
    let auth = conn.auth_for(&row.provider);
    let ready = conn
        .ctx
        .registry
        .ready(
            Some(&row.provider),
            None,
            ClientCapabilities::default(),
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
    let params = raw(&json!({ "sessionId": row.child_session_id }));
    let answer = ready.call("session/delete", &params, &conn.closing).await;
    ready.close().await;
    match answer {
        Ok(result) => {
            if let Err(e) = store.remove(&sid).await {
                tracing::warn!(session = %sid, "cannot forget a deleted session: {e}");
            }
            let _ = conn.peer.respond(&id, Ok(&result)).await;
        }
        Err(e) => conn.reply_err(&id, &bridge_error(&e)).await,
    }
}
