//! The ACP agent toward parents: one connection per parent (stdio or an accepted socket). The
//! router reads the parent's messages and never waits on a turn: anything that takes time —
//! opening a child, a prompt, a start, a wait, a dispose — runs in its own task, so
//! `session/cancel` is always handled at once.
//!
//! Three ways in: bridge sessions ([`bridge`]), delegation through `_acpd/*` ([`delegation`]),
//! and Subagent Sessions announced on the parent's sessions ([`events`]).
//!
//! # Layout
//!
//! - This file: [`serve`] (one connection, from its first line to its last task reaped), the
//!   [`Conn`] type with every one of its methods (the connection's own state: seats, sessions,
//!   runs, logins, where the connected process stands), and the errors handlers share.
//! - `dispatch.rs`: every message parsed once into a typed request or notification, the
//!   connection's gates, and one match handing each to its handler. The only place in
//!   `server/` that reads a method name.
//! - The handlers, one file per concern, each a function per method taking the connection:
//!   - `capabilities.rs`: `_acpd/connect`, `initialize`, `authenticate`/`logout`, and any other
//!     request asked of a new child;
//!   - `bridge.rs`: bridge sessions — `session/new`, `session/load`/`resume`, `session/fork`;
//!   - `forward.rs`: what passes to a session's agent — prompts, settings, a close, extensions,
//!     `session/cancel` and other notifications;
//!   - `session_list.rs`: `session/list`;
//!   - `session_delete.rs`: `session/delete`, and `session/close` of a session not open here;
//!   - `delegation.rs`: `_acpd/providers` and `_acpd/subagent/*`;
//!   - `operator.rs`: `_acpd/status`, `_acpd/runs`, `_acpd/reload`.
//! - `events.rs`: what a connection's runs report, sent to the parent (`_acpd/subagent/started`
//!   and `ended`, Subagent Sessions, permission asks).
//! - `live_sessions.rs`: [`Sessions`], every live bridge session of this process (attached or
//!   detached) and the durable session map.
//! - `reloader.rs`: [`Reloader`], config reloads coalesced (SIGHUP and `_acpd/reload`).

mod bridge;
mod bridge_workspace;
mod capabilities;
mod delegation;
mod dispatch;
mod events;
mod forward;
mod live_sessions;
mod operator;
#[cfg(test)]
mod principal_tests;
mod reloader;
mod session_delete;
mod session_list;

pub(crate) use crate::store::Principal;
pub(crate) use live_sessions::{Sessions, open_store};
pub(crate) use operator::metrics_text;
pub(crate) use reloader::Reloader;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use acpd_protocol::envelope::{self, Id, RpcError};
use acpd_protocol::methods::name;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::registry::{Lineage, Owner, Registry, RunEvent};
use crate::wire::{self, Incoming, Peer};

/// A parent connection's claim on one of its `max_sessions_per_connection` seats (a bridge
/// session or an undisposed run); released when dropped.
pub(crate) struct Seat(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Extension methods acpd serves, advertised under `agentCapabilities._meta.acpd`.
pub(crate) const METHODS: &[&str] = &[
    name::PROVIDERS,
    name::START,
    name::WAIT,
    name::CANCEL,
    name::DISPOSE,
    name::SEND,
    name::LIST,
    name::STATUS,
    name::RUNS,
];

/// What every connection shares.
#[derive(Clone)]
pub(crate) struct ServerContext {
    pub registry: Registry,
    /// The working directory of `acpd stdio`'s caller; `None` over a socket.
    pub caller_cwd: Option<PathBuf>,
    pub daemon: Arc<DaemonInfo>,
    /// Cancelled when acpd shuts down: every connection cancels and reaps what it started.
    pub shutdown: CancellationToken,
    /// Every live bridge session of this process and the durable session map.
    pub sessions: Arc<Sessions>,
    /// Who is connected: the socket peer's user, or the token a network connection
    /// authenticated with. Sessions belong to it: only it lists, loads, attaches, closes and
    /// deletes them, and another principal's are answered as unknown ids. `None`: no peer
    /// (`acpd stdio`, in-process), whose sessions are acpd's own user's in the map.
    pub principal: Option<Principal>,
    /// What acpd read of the connected process (a socket's `SO_PEERCRED` pid) as it
    /// connected: a child of this acpd delegating in turn is known by its ancestry, never by
    /// what it says.
    pub origin: Option<Arc<crate::registry::Origin>>,
}

/// Daemon-wide facts for `_acpd/status`, and the daemon's own operations.
pub(crate) struct DaemonInfo {
    pub started: std::time::Instant,
    pub connections: std::sync::atomic::AtomicUsize,
    /// `_acpd/reload`: `acpd serve` only (`acpd stdio` is restarted by whoever runs it).
    pub reload: Option<Reload>,
    /// The network face's endpoints, set once its listeners are bound.
    pub listening: std::sync::OnceLock<Vec<String>>,
    /// The network tokens (`acpd serve` only): what a network connection authenticates
    /// against, read again on `_acpd/tokens/reload`.
    pub tokens: Option<crate::store::tokens::TokenBook>,
}

/// Re-reads the config from where it was read at start and puts it in force for new runs,
/// coalesced (at most one read running, one pending): see [`Reloader`].
pub(crate) type Reload = Arc<Reloader>;

impl Default for DaemonInfo {
    fn default() -> Self {
        DaemonInfo {
            started: std::time::Instant::now(),
            connections: Default::default(),
            reload: None,
            listening: Default::default(),
            tokens: None,
        }
    }
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// Where a connection comes from, for the metrics: no peer process (`acpd stdio`), or the
/// tree its process was in when it connected.
fn connection_kind(origin: Option<&crate::registry::Origin>) -> crate::metrics::ConnKind {
    match origin.map(crate::registry::Origin::tree) {
        None => crate::metrics::ConnKind::Stdio,
        Some(crate::registry::Tree::Outside) => crate::metrics::ConnKind::Parent,
        Some(_) => crate::metrics::ConnKind::Child,
    }
}

/// What `acpd connect --provider NAME` sends first (see [`capabilities::connect`]).
pub(crate) const CONNECT: &str = "_acpd/connect";

/// What the parent said about itself in `initialize`.
#[derive(Debug, Clone, Default)]
struct ClientInfo {
    /// `clientCapabilities` as sent (missing means all false).
    capabilities: serde_json::Value,
    /// The same as written, for a bridge child's `initialize`.
    written: crate::child::ClientCaps,
    subagents: bool,
}

impl ClientInfo {
    fn has(&self, pointer: &str) -> bool {
        self.capabilities
            .pointer(pointer)
            .is_some_and(|v| v.as_bool().unwrap_or(!v.is_null()))
    }
}

/// A parent-facing session id and what it names.
#[derive(Clone)]
enum SessionRef {
    Bridge(bridge::BridgeHandle),
    /// A delegated run shown as a Subagent Session (or just addressable by its minted id).
    Run {
        run_id: String,
    },
}

/// One parent connection's state, shared by the router and the tasks it spawns.
pub(crate) struct Conn {
    peer: Peer,
    ctx: ServerContext,
    owner: Owner,
    client: Mutex<Option<ClientInfo>>,
    sessions: Mutex<HashMap<String, SessionRef>>,
    /// Per run: the parent session it was started under, for Subagent Sessions and cascades.
    runs: Mutex<HashMap<String, events::RunMeta>>,
    events: mpsc::Sender<RunEvent>,
    tracker: TaskTracker,
    closing: CancellationToken,
    /// Seats taken (bridge sessions and undisposed runs), against `max_sessions_per_connection`.
    seats: Arc<std::sync::atomic::AtomicUsize>,
    max_seats: usize,
    /// Per provider, the `authenticate` params that succeeded on this connection.
    auth: Mutex<HashMap<String, Box<RawValue>>>,
    /// Where this connection's process stands (see [`Conn::lineage`]), once settled.
    lineage: std::sync::OnceLock<Lineage>,
    /// The provider `acpd connect --provider NAME` made this connection's default
    /// (`_acpd/connect`); `None`: the config's.
    provider: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves one parent until it disconnects, then cancels and reaps everything it started.
pub(crate) async fn serve<R, W>(reader: R, writer: W, ctx: ServerContext)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let config = ctx.registry.config();
    let wire::Connection {
        peer,
        mut incoming,
        eof,
    } = wire::connect_with(
        reader,
        writer,
        config.wire_limits(),
        Some(wire::half::HalfBudget::global()),
    );
    peer.limit_pending(config.max_pending_requests);
    let (events_tx, events_rx) = mpsc::channel(wire::QUEUE_DEPTH);
    let conn = Arc::new(Conn {
        peer,
        ctx,
        owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
        client: Mutex::new(None),
        sessions: Mutex::new(HashMap::new()),
        runs: Mutex::new(HashMap::new()),
        events: events_tx,
        tracker: TaskTracker::new(),
        closing: CancellationToken::new(),
        seats: Arc::default(),
        max_seats: config.max_sessions_per_connection,
        auth: Mutex::new(HashMap::new()),
        lineage: std::sync::OnceLock::new(),
        provider: Mutex::new(None),
    });
    conn.tracker.spawn(events::pump(conn.clone(), events_rx));
    conn.ctx.daemon.connections.fetch_add(1, Ordering::Relaxed);
    let _counted = crate::metrics::get().connection(connection_kind(conn.ctx.origin.as_deref()));
    let broken = conn.peer.broken();
    let shutdown = conn.ctx.shutdown.clone();
    loop {
        let msg = tokio::select! {
            biased;
            // A parent that stopped reading (write_timeout) is gone, like one that hung up.
            _ = broken.cancelled() => None,
            _ = shutdown.cancelled() => None,
            msg = incoming.recv() => msg,
        };
        let Some(msg) = msg else { break };
        // Nothing below may wait on the parent reading: a send blocked on a full outbox must
        // not keep the router from seeing the end of the connection.
        let handled = async {
            match msg {
                Incoming::Request { id, method, params } => {
                    dispatch::request(&conn, id, method, params).await
                }
                Incoming::Notification { method, params } => {
                    dispatch::notification(&conn, &method, params.as_deref())
                }
                Incoming::Fault(fault) => dispatch::fault(&conn, fault).await,
            }
        };
        tokio::select! {
            biased;
            () = handled => {}
            _ = broken.cancelled() => break,
            _ = shutdown.cancelled() => break,
            // A parent that hung up while we were blocked writing to it is gone too.
            _ = eof.cancelled() => break,
        }
    }
    conn.shutdown().await;
    conn.ctx.daemon.connections.fetch_sub(1, Ordering::Relaxed);
    // What is queued goes out within a moment, not the whole write_timeout: the connection
    // is over (the parent hung up, stopped reading, or acpd is shutting down), everything it
    // started is already cancelled, and a parent that closed its input without ever reading
    // must not keep `acpd stdio` (the whole process) alive for another write_timeout. A
    // parent still reading takes a bounded outbox in far less than this.
    conn.peer.flush_and_close_within(SHUTDOWN_FLUSH).await;
}

/// How long a start from inside a child that is still starting waits for it to be filed.
const UNFILED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a connection's last answers may take to go out once it is over.
const SHUTDOWN_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

impl Conn {
    /// This connection's default provider: `acpd connect --provider`'s, else the config's.
    pub(crate) fn default_provider(&self) -> String {
        lock(&self.provider)
            .clone()
            .unwrap_or_else(|| self.ctx.registry.config().default_provider.clone())
    }

    /// A session this connection holds: its own, or one of a bridge child's subagent sessions
    /// (`<session id>.<n>`), which its bridge routes.
    fn session(&self, sid: &str) -> Option<SessionRef> {
        let sessions = lock(&self.sessions);
        if let Some(s) = sessions.get(sid) {
            return Some(s.clone());
        }
        let (parent, _) = sid.rsplit_once('.')?;
        match sessions.get(parent) {
            Some(SessionRef::Bridge(b)) => Some(SessionRef::Bridge(b.clone())),
            _ => None,
        }
    }

    /// Whose rows in the session map this connection's are: its principal's, or acpd's own
    /// user's (stdio, whose caller is whoever started acpd).
    fn caller(&self) -> crate::store::RowOwner {
        self.ctx
            .principal
            .as_ref()
            .map_or_else(crate::store::RowOwner::own, Principal::row_owner)
    }

    /// The `authenticate` params this connection used with `provider`.
    fn auth_for(&self, provider: &str) -> Option<Box<RawValue>> {
        lock(&self.auth).get(provider).cloned()
    }

    /// Cancels (or, on close, disposes) the runs started under a parent session.
    fn cascade(self: &Arc<Self>, parent_session: &str, dispose: bool) {
        let children: Vec<String> = lock(&self.runs)
            .iter()
            .filter(|(_, m)| m.parent_session.as_deref() == Some(parent_session))
            .map(|(run_id, _)| run_id.clone())
            .collect();
        for run_id in children {
            if dispose {
                let conn = self.clone();
                self.tracker.spawn(async move {
                    let _ = conn.ctx.registry.dispose(conn.owner, &run_id).await;
                });
            } else {
                let _ = self.ctx.registry.cancel(self.owner, &run_id);
            }
        }
    }

    /// A disposed run: its session id and its seat go.
    fn forget_run(&self, run_id: &str) {
        let meta = lock(&self.runs).remove(run_id);
        if let Some(sid) = meta.and_then(|m| m.session_id) {
            lock(&self.sessions).remove(&sid);
        }
    }

    /// Takes one of the connection's seats, if one is free.
    fn take_seat(&self) -> Option<Seat> {
        self.seats
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_seats).then_some(n + 1)
            })
            .ok()
            .map(|_| Seat(self.seats.clone()))
    }

    fn seat_limit(&self) -> RpcError {
        crate::metrics::get().limit_hit(crate::metrics::Limit::MaxSessionsPerConnection);
        RpcError::limit("max_sessions_per_connection", self.max_seats as u64)
    }

    fn client(&self) -> ClientInfo {
        lock(&self.client).clone().unwrap_or_default()
    }

    /// The capabilities a bridge child is initialized with: the editor's own, as written.
    fn child_capabilities(&self) -> crate::child::ClientCaps {
        self.client().written
    }

    /// Where the connected process stands: outside this acpd, or in the tree of one of its
    /// children (whose runs it starts nest there). Settled once known; a child still being
    /// started is asked again.
    fn lineage(&self) -> Lineage {
        if let Some(known) = self.lineage.get() {
            return known.clone();
        }
        let Some(origin) = &self.ctx.origin else {
            return self.lineage.get_or_init(|| Lineage::Outside).clone();
        };
        let sessions = &self.ctx.sessions;
        match self.ctx.registry.lineage_of(origin, |p| sessions.by_pid(p)) {
            Lineage::Unfiled => Lineage::Unfiled,
            settled => self.lineage.get_or_init(|| settled).clone(),
        }
    }

    /// The run or bridge session this connection's runs nest under; waits (a little) for a
    /// child that is still starting to be filed. `Err` when it never is.
    async fn nest(&self) -> Result<Option<crate::registry::Nest>, RpcError> {
        let deadline = tokio::time::Instant::now() + UNFILED_WAIT;
        loop {
            match self.lineage() {
                Lineage::Outside => return Ok(None),
                Lineage::Nested(nest) => return Ok(Some(nest)),
                Lineage::Unfiled if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Lineage::Unfiled => {
                    return Err(RpcError::invalid_request(
                        "this connection comes from inside a child of this acpd that belongs to \
                         no run or session (yet); try again once it is started",
                    ));
                }
            }
        }
    }

    async fn reply_err(&self, id: &Id, error: &RpcError) {
        let _ = self.peer.respond_err(Some(id), error).await;
    }

    /// The parent is gone: cancel and reap every bridge and run of this connection.
    async fn shutdown(&self) {
        self.closing.cancel();
        let bridges: Vec<(String, bridge::BridgeHandle)> = lock(&self.sessions)
            .drain()
            .filter_map(|(sid, s)| match s {
                SessionRef::Bridge(b) => Some((sid, b)),
                SessionRef::Run { .. } => None,
            })
            .collect();
        // With `detach_timeout`, bridge sessions outlive the connection (not acpd).
        let shutting = self.ctx.shutdown.is_cancelled();
        let sessions = &self.ctx.sessions;
        let closing_bridges = futures::future::join_all(
            bridges
                .iter()
                .map(|(sid, b)| sessions.release(sid, b.child(), shutting)),
        );
        let disposing_runs = self.ctx.registry.dispose_owner(self.owner);
        let (_, settled) = futures::join!(closing_bridges, disposing_runs);
        events::settle_nested(self, &settled);
        self.tracker.close();
        // Tasks still holding the parent's peer end once they notice the closed connection.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), self.tracker.wait()).await;
    }
}

pub(crate) use crate::child::session_not_found;

/// An error with acpd's typed code, `data.code` the stable name.
pub(crate) fn typed_error(e: &crate::registry::RegistryError) -> RpcError {
    RpcError::new(e.name().code(), e.to_string()).with_data(e.data())
}

/// A bridge's error: the agent's own when it refused (an editor sees exactly what the agent
/// said, as if it talked to it directly), else acpd's typed one.
pub(crate) fn bridge_error(e: &crate::registry::RegistryError) -> RpcError {
    if let crate::registry::RegistryError::StartFailed {
        agent_error: Some(error),
        ..
    } = e
    {
        return (**error).clone();
    }
    typed_error(e)
}

pub(crate) fn raw(value: &impl serde::Serialize) -> Box<RawValue> {
    envelope::to_raw(value)
}
