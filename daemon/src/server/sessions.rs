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
use crate::store::{Claim, Holder, Listed, SessionRow, Store};

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
    /// This acpd process, as it holds leases on the sessions live in it.
    pub holder: Holder,
    live: Mutex<HashMap<String, Live>>,
    /// Ids being opened right now (a load spawning its child) and by which uid, so a second
    /// load of the same id waits its turn instead of opening it twice (and another user's
    /// load learns nothing of it).
    opening: Mutex<HashMap<String, Option<u32>>>,
    /// Ids a `session/delete` is deleting right now and by which uid: the lease the delete took
    /// is kept until the agent answered it (the session it ends on the way does not release
    /// it), and no load here opens it meanwhile.
    deleting: Mutex<HashMap<String, Option<u32>>>,
    /// Woken when a connection releases its sessions or a live session ends (see
    /// [`RELEASE_WAIT`]).
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
    /// Being opened by another user's load (of their own session, or of an id they guessed):
    /// waited for like [`Taken::Attached`], never answered "unknown" meanwhile, so another
    /// user's load cannot make the owner's fail.
    Foreign,
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
        // A load waiting behind this one (see [`Taken::Foreign`]) tries again.
        self.sessions.released.notify_waiters();
    }
}

/// An id being deleted (see [`Sessions::begin_delete`]): its lease stays taken until this
/// drops.
pub struct Deleting {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for Deleting {
    fn drop(&mut self) {
        lock(&self.sessions.deleting).remove(&self.id);
        self.sessions.released.notify_waiters();
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
            holder: Holder::me(),
            live: Mutex::new(HashMap::new()),
            opening: Mutex::default(),
            deleting: Mutex::default(),
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
            // No longer live here: another acpd may load it now. Released before the entry
            // goes, so a load of it in this process (which waits for the entry) claims after
            // this release, never before it. Not while a delete of it runs: the delete took
            // the lease for its whole call to the agent and gives it up itself.
            let deleting = lock(&me.deleting).contains_key(&id);
            if deleting {
                tracing::debug!(session = %id, "session ended by its delete: the lease stays with the delete");
            } else if let Err(e) = me.store.release(&id, &me.holder).await {
                tracing::warn!(session = %id, "cannot release the session's lease: {e}");
            }
            lock(&me.live).remove(&id);
            // A load waiting for it (a close then a load, as an editor does) goes on now.
            me.released.notify_waiters();
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
        if let Some(deleter) = lock(&self.deleting).get(id) {
            if *deleter != uid {
                return Ok(Taken::Foreign);
            }
            return Err(RpcError::invalid_request(format!(
                "session {id} is being deleted by another request"
            )));
        }
        if let Some(opener) = lock(&self.opening).get(id) {
            if *opener != uid {
                return Ok(Taken::Foreign);
            }
            return Err(RpcError::invalid_request(format!(
                "session {id} is being opened by another request; retry when it answers"
            )));
        }
        let Some(entry) = live.get_mut(id) else {
            lock(&self.opening).insert(id.to_string(), uid);
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

    /// Marks `id` as being deleted by `uid` until the guard drops (see [`Sessions::deleting`]);
    /// an error when another delete of it runs.
    pub fn begin_delete(
        self: &Arc<Self>,
        id: &str,
        uid: Option<u32>,
    ) -> Result<Deleting, RpcError> {
        let mut deleting = lock(&self.deleting);
        if deleting.contains_key(id) {
            return Err(RpcError::invalid_request(format!(
                "session {id} is being deleted by another request; retry when it answers"
            )));
        }
        deleting.insert(id.to_string(), uid);
        Ok(Deleting {
            sessions: self.clone(),
            id: id.to_string(),
        })
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
    /// Absent, `null` (`Some(None)`: codex-acp ends its listing so) or a cursor.
    #[serde(default, deserialize_with = "present")]
    next_cursor: Option<Option<String>>,
}

/// A field that is there, even as `null`: what tells `"nextCursor": null` from no key.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
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
    // Whether an agent ended its listing with `"nextCursor": null`: acpd's last page then says
    // so too, so an editor sees the answer it gets from that agent directly.
    let mut null_cursor = false;
    for provider in conn.ctx.registry.provider_names() {
        let Some(agent) = conn.ctx.registry.cached(&provider) else {
            continue;
        };
        if !advertises(&agent, "/sessionCapabilities/list") {
            continue;
        }
        match refresh(&conn, &provider, req.cwd.as_deref()).await {
            Ok(null) => null_cursor |= null,
            // An agent that wants a login says so to the editor, as it would directly.
            Err(e) if e.code == acpd_protocol::envelope::AUTH_REQUIRED => {
                return conn.reply_err(&id, &e).await;
            }
            Err(e) => {
                tracing::warn!(%provider, "session/list: the agent's own listing failed: {}", e.message)
            }
        }
    }
    let rows = match store.list(req.cwd.as_deref(), conn.caller()).await {
        Ok(rows) => rows,
        Err(e) => {
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    };
    let infos: Vec<serde_json::Value> = rows.iter().map(session_info).collect();
    // The answer line stays within max_line: the envelope with the longest cursor, plus each
    // entry and its comma.
    let envelope = acpd_protocol::envelope::encode_result(
        &id,
        &raw(&json!({ "sessions": [], "nextCursor": format!("acpd-p{}", u64::MAX) })),
    )
    .len()
        + 1;
    let budget = conn.ctx.registry.config().max_line.saturating_sub(envelope);
    let cost = |v: &serde_json::Value| serde_json::to_string(v).map_or(usize::MAX, |t| t.len() + 1);
    let (sessions, next, skipped) = match acpd_protocol::listing::page_within(
        infos,
        req.cursor.as_deref(),
        acpd_protocol::listing::PAGE,
        budget,
        cost,
    ) {
        Ok(p) => p,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "session/list: sessions too long for one line of max_line left out; raise max_line"
        );
    }
    let mut result = json!({ "sessions": sessions });
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    } else if null_cursor {
        result["nextCursor"] = serde_json::Value::Null;
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

/// Asks a child of `provider` for its sessions and files each under an acpd id; whether its
/// last page said `"nextCursor": null`.
async fn refresh(
    conn: &Arc<Conn>,
    provider: &str,
    cwd: Option<&std::path::Path>,
) -> Result<bool, RpcError> {
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
    // Rows written after this (a `session/new` racing the listing) are not the agent's to
    // forget: its listing may predate them.
    let since = crate::store::now();
    let listing = list_all(&mut ready, conn, provider, cwd).await;
    ready.close().await;
    let (listed, whole, null_cursor) = listing?;
    // What the agent no longer lists, it deleted; only an unfiltered listing says so. A whole
    // one forgets any row it lacks (see `forget_unlisted`); one cut at max_listed_sessions is
    // all acpd keeps of the agent's own sessions, so listed-only rows past it go, but never a
    // row someone opened: the bound is about what an agent brings in, not about them.
    let whole_since = match whole {
        Whole::Yes => Some(since.as_str()),
        Whole::Cut => None,
        Whole::No => return Ok(null_cursor),
    };
    if cwd.is_none() {
        conn.ctx
            .sessions
            .store
            .forget_unlisted(provider, &listed, whole_since)
            .await
            .map_err(|e| internal(e.to_string()))?;
    }
    Ok(null_cursor)
}

/// How much of an agent's listing [`list_all`] saw.
enum Whole {
    /// Every page.
    Yes,
    /// Cut at `max_listed_sessions`: all acpd keeps of it, not all there is.
    Cut,
    /// Cut at [`MAX_CHILD_PAGES`].
    No,
}

/// Every page of the agent's listing, each session filed, up to `max_listed_sessions`; the
/// child ids, whether the listing was whole and whether its last page said
/// `"nextCursor": null`.
async fn list_all(
    ready: &mut crate::registry::Ready,
    conn: &Arc<Conn>,
    provider: &str,
    cwd: Option<&std::path::Path>,
) -> Result<(Vec<String>, Whole, bool), RpcError> {
    let internal = |e: String| RpcError::internal(e);
    let store = &conn.ctx.sessions.store;
    let max = conn.ctx.registry.config().max_listed_sessions;
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
        let room = max.saturating_sub(listed.len());
        let cut = page.sessions.len() > room;
        let page_sessions: Vec<Listed> = page
            .sessions
            .into_iter()
            .filter(plausible)
            .take(room)
            .map(|s| Listed {
                child_session_id: s.session_id,
                cwd: s.cwd,
                title: s.title,
                updated_at: s.updated_at,
            })
            .collect();
        listed.extend(page_sessions.iter().map(|s| s.child_session_id.clone()));
        store
            .adopt_listing(provider, page_sessions, max)
            .await
            .map_err(|e| internal(e.to_string()))?;
        let null_cursor = page.next_cursor == Some(None);
        cursor = page.next_cursor.flatten();
        if cut || (cursor.is_some() && listed.len() >= max) {
            tracing::warn!(%provider, max, "the agent lists more sessions than max_listed_sessions; the rest are not kept");
            return Ok((listed, Whole::Cut, false));
        }
        if cursor.is_none() {
            return Ok((listed, Whole::Yes, null_cursor));
        }
    }
    Ok((listed, Whole::No, false))
}

/// The longest child session id and cwd the map keeps from an agent's listing: an id is a
/// key, a cwd a path (PATH_MAX); anything longer is a lie, left out.
const MAX_CHILD_ID: usize = 1024;
const MAX_CWD: usize = 4096;

/// Whether a listed session is one acpd can keep: a short id, an absolute cwd of a path's
/// length.
fn plausible(s: &ChildSession) -> bool {
    let ok = s.session_id.len() <= MAX_CHILD_ID
        && s.cwd.is_absolute()
        && s.cwd.as_os_str().len() <= MAX_CWD;
    if !ok {
        tracing::warn!(
            "an agent listed a session with an id over {MAX_CHILD_ID} bytes or a cwd that is not an absolute path of at most {MAX_CWD}: left out"
        );
    }
    ok
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
pub async fn delete(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
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
    // Taken for the delete, until the agent answered it: no other acpd loads it meanwhile,
    // and the session ended below does not give the lease up on its way out.
    let deleting = match conn.ctx.sessions.begin_delete(&sid, conn.ctx.peer_uid) {
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
        .end_detached(&sid, conn.ctx.peer_uid)
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

/// The answer to a load, resume, fork or delete of a session live in another acpd process.
pub(super) fn held_elsewhere(sid: &str, h: &Holder) -> RpcError {
    RpcError::invalid_request(format!(
        "session {sid} is live in another acpd process (pid {pid}) sharing this session map; \
         close it there (session/close through that acpd, or end acpd {pid}), then retry",
        pid = h.pid
    ))
    .with_data(json!({ "holderPid": h.pid }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 18 (beyond the list): another user's load of an id (guessed, or learnt from a
    /// trace file's name) holds the id for a moment; the owner's own load then waits for it
    /// instead of being told its session is unknown.
    #[tokio::test]
    async fn another_users_load_never_makes_the_owners_fail() {
        let sessions = Sessions::new(Store::in_memory(), None);
        let theirs = sessions.take_for_load("acpd-x", Some(1001));
        assert!(matches!(theirs, Ok(Taken::Reserved(_))));
        assert!(
            matches!(
                sessions.take_for_load("acpd-x", Some(0)),
                Ok(Taken::Foreign)
            ),
            "the owner's load was refused while another user's held the id"
        );
        let woken = sessions.released.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(theirs);
        tokio::time::timeout(Duration::from_secs(10), woken)
            .await
            .expect("the waiting load is woken when the other one lets go");
        assert!(matches!(
            sessions.take_for_load("acpd-x", Some(0)),
            Ok(Taken::Reserved(_))
        ));
    }
}
