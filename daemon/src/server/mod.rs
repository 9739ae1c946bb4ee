//! The ACP agent toward parents: one connection per parent (stdio or an accepted socket). The
//! router reads the parent's messages and never waits on a turn: anything that takes time —
//! opening a child, a prompt, a start, a wait, a dispose — runs in its own task, so
//! `session/cancel` is always handled at once.
//!
//! Three ways in: bridge sessions ([`bridge`]), delegation through `_acpd/*` ([`delegate`]),
//! and Subagent Sessions announced on the parent's sessions ([`events`]).

mod bridge;
mod capabilities;
mod delegate;
mod events;
mod nest;
pub(crate) mod reload;
mod sessions;

pub use sessions::{Sessions, open_store};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use acpd_protocol::envelope::{self, Id, RpcError};
use acpd_protocol::session_id::session_id;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::registry::{Owner, Registry, RunEvent};
use crate::wire::{self, Incoming, LineFault, Peer};

/// A parent connection's claim on one of its `max_sessions_per_connection` seats (a bridge
/// session or an undisposed run); released when dropped.
pub(crate) struct Seat(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Extension methods acpd serves, advertised under `agentCapabilities._meta.acpd`.
pub const METHODS: &[&str] = &[
    "_acpd/providers",
    "_acpd/subagent/start",
    "_acpd/subagent/wait",
    "_acpd/subagent/cancel",
    "_acpd/subagent/dispose",
    "_acpd/subagent/send",
    "_acpd/subagent/list",
    "_acpd/status",
    "_acpd/runs",
];

/// What every connection shares.
#[derive(Clone)]
pub struct ServerContext {
    pub registry: Registry,
    /// The working directory of `acpd stdio`'s caller; `None` over a socket.
    pub caller_cwd: Option<PathBuf>,
    pub daemon: Arc<DaemonInfo>,
    /// Cancelled when acpd shuts down: every connection cancels and reaps what it started.
    pub shutdown: CancellationToken,
    /// Every live bridge session of this process and the durable session map.
    pub sessions: Arc<Sessions>,
    /// The connected user (`acpd serve`); only they may attach their detached sessions.
    pub peer_uid: Option<u32>,
    /// What acpd read of the connected process (a socket's `SO_PEERCRED` pid) as it
    /// connected: a child of this acpd delegating in turn is known by its ancestry, never by
    /// what it says.
    pub origin: Option<Arc<crate::registry::Origin>>,
}

/// Daemon-wide facts for `_acpd/status`, and the daemon's own operations.
pub struct DaemonInfo {
    pub started: std::time::Instant,
    pub connections: std::sync::atomic::AtomicUsize,
    /// `_acpd/reload`: `acpd serve` only (`acpd stdio` is restarted by whoever runs it).
    pub reload: Option<Reload>,
}

/// Re-reads the config from where it was read at start and puts it in force for new runs,
/// coalesced (at most one read running, one pending): see [`reload::Reloader`].
pub type Reload = Arc<reload::Reloader>;

impl Default for DaemonInfo {
    fn default() -> Self {
        DaemonInfo {
            started: std::time::Instant::now(),
            connections: Default::default(),
            reload: None,
        }
    }
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// What `acpd connect --provider NAME` sends first (see [`Conn::choose_provider`]).
pub const CONNECT: &str = "_acpd/connect";

/// What the parent said about itself in `initialize`.
#[derive(Debug, Clone, Default)]
struct ClientInfo {
    /// `clientCapabilities` as sent (missing means all false).
    capabilities: serde_json::Value,
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
    lineage: std::sync::OnceLock<crate::registry::Lineage>,
    /// The provider `acpd connect --provider NAME` made this connection's default
    /// (`_acpd/connect`); `None`: the config's.
    provider: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves one parent until it disconnects, then cancels and reaps everything it started.
pub async fn serve<R, W>(reader: R, writer: W, ctx: ServerContext)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let config = ctx.registry.config();
    let wire::Connection {
        peer,
        mut incoming,
        eof,
    } = wire::connect_with(reader, writer, config.wire_limits());
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
                    conn.on_request(id, method, params).await
                }
                Incoming::Notification { method, params } => {
                    conn.on_notification(&method, params.as_deref())
                }
                Incoming::Fault(fault) => conn.on_fault(fault).await,
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

/// How long a connection's last answers may take to go out once it is over.
const SHUTDOWN_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

impl Conn {
    async fn on_request(self: &Arc<Self>, id: Id, method: String, params: Option<Box<RawValue>>) {
        match self.peer.admit(&id) {
            wire::Admit::Yes => {}
            wire::Admit::Full => {
                let max = self.ctx.registry.config().max_pending_requests;
                let e = RpcError::limit("max_pending_requests", max as u64);
                let _ = self.peer.respond_err(Some(&id), &e).await;
                return;
            }
            wire::Admit::DuplicateId => {
                let e = RpcError::invalid_request(format!(
                    "id {id} is already used by a request that has not been answered"
                ));
                let _ = self
                    .peer
                    .send_line(envelope::encode_error(Some(&id), &e))
                    .await;
                return;
            }
        }
        // A session id (or another routing key) written twice means one session to a reader
        // that takes the first and another to one that takes the last: refused, not guessed.
        if let Some(key) = params
            .as_deref()
            .and_then(|p| acpd_protocol::session_id::duplicate_routing_key(p.get()))
        {
            let e = RpcError::invalid_request(format!(
                "{method}: the key \"{key}\" appears twice in the params; send it once"
            ));
            return self.reply_err(&id, &e).await;
        }
        if method == CONNECT {
            let e = match self.choose_provider(params.as_deref()) {
                Ok(()) => {
                    return self
                        .peer
                        .respond_ok(&id, &serde_json::json!({}))
                        .await
                        .unwrap_or(());
                }
                Err(e) => e,
            };
            return self.reply_err(&id, &e).await;
        }
        if method == "initialize" {
            // Spawned: learning what the agent advertises may take a probe.
            let query = capabilities::note_client(self, params.as_deref());
            let conn = self.clone();
            self.tracker
                .spawn(capabilities::initialize(conn, id, query));
            return;
        }
        if lock(&self.client).is_none() {
            let e = RpcError::invalid_request(format!("initialize must complete before {method}"));
            return self.reply_err(&id, &e).await;
        }
        if nest::BRIDGE_ONLY.contains(&method.as_str())
            && !matches!(self.lineage(), crate::registry::Lineage::Outside)
        {
            let e = RpcError::invalid_request(format!(
                "{method}: this connection comes from inside the process tree of a child of \
                 this acpd, which may delegate (_acpd/subagent/*, depth counted from it) but not \
                 open or touch bridge sessions"
            ));
            return self.reply_err(&id, &e).await;
        }
        let conn = self.clone();
        match method.as_str() {
            "session/new" => {
                self.tracker.spawn(bridge::open(conn, id, params));
            }
            "session/load" | "session/resume" => {
                self.tracker.spawn(bridge::load(conn, id, method, params));
            }
            "session/fork" => {
                self.tracker.spawn(bridge::fork(conn, id, params));
            }
            "session/list" => {
                self.tracker.spawn(sessions::list(conn, id, params));
            }
            "session/delete" => {
                self.tracker.spawn(sessions::delete(conn, id, params));
            }
            "authenticate" | "logout" => {
                self.tracker
                    .spawn(capabilities::ask_new_child(conn, id, method, params));
            }
            m if m.starts_with("_acpd/") => delegate::handle(self, id, &method, params).await,
            "session/close" if !self.has_session(params.as_deref()) => {
                self.tracker
                    .spawn(sessions::close_elsewhere(conn, id, params));
            }
            "session/prompt"
            | "session/close"
            | "session/set_mode"
            | "session/set_model"
            | "session/set_config_option"
            | "session/set_title" => {
                self.to_session(id, method, params).await;
            }
            // Any other method (an extension, an ACP method acpd has no special part in, one
            // newer than acpd) goes to the session it names, or to a new child if it names none.
            _ => self.to_session(id, method, params).await,
        }
    }

    /// `_acpd/connect {"provider": NAME}`, before `initialize`: NAME is this connection's
    /// default provider (what `initialize` mirrors, what `session/new` without
    /// `_meta.acpd.provider` opens). An unknown name is refused, so `acpd connect` can say so.
    fn choose_provider(&self, params: Option<&RawValue>) -> Result<(), RpcError> {
        if lock(&self.client).is_some() {
            return Err(RpcError::invalid_request(format!(
                "{CONNECT} must come before initialize"
            )));
        }
        let name = params
            .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
            .and_then(|v| v.get("provider")?.as_str().map(str::to_string))
            .ok_or_else(|| RpcError::invalid_params(format!("{CONNECT} needs a provider name")))?;
        let config = self.ctx.registry.config();
        if !config.providers.contains_key(&name) {
            return Err(RpcError::invalid_params(format!(
                "no provider named {name:?} in {}; {}",
                config.source.as_deref().map_or_else(
                    || "the built-in config".to_string(),
                    |p| p.display().to_string()
                ),
                crate::config::suggest::unknown_provider(&config, &name)
            )));
        }
        *lock(&self.provider) = Some(name);
        Ok(())
    }

    /// This connection's default provider: `acpd connect --provider`'s, else the config's.
    pub(crate) fn default_provider(&self) -> String {
        lock(&self.provider)
            .clone()
            .unwrap_or_else(|| self.ctx.registry.config().default_provider.clone())
    }

    /// Whether the request names a session open on this connection.
    fn has_session(&self, params: Option<&RawValue>) -> bool {
        params
            .and_then(session_id)
            .is_some_and(|sid| self.session(&sid).is_some())
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

    /// The uid of the user on the other end: the socket peer's, or acpd's own (stdio, whose
    /// caller is whoever started acpd). Sessions in the map belong to it.
    fn caller(&self) -> u32 {
        self.ctx
            .peer_uid
            .unwrap_or_else(|| nix::unistd::Uid::effective().as_raw())
    }

    /// What a prompt or a new title on bridge session `b` will change in the session map once
    /// acpd has passed it on: `updatedAt` (and the title). Only for a session this connection
    /// holds under its own id (not a subagent session under it), and a title only for an agent
    /// that takes titles: what is refused changes nothing.
    fn activity(
        &self,
        method: &str,
        params: Option<&RawValue>,
        b: &bridge::BridgeHandle,
    ) -> Option<(String, Option<String>)> {
        let sid = params.and_then(session_id)?;
        if !matches!(lock(&self.sessions).get(&sid), Some(SessionRef::Bridge(_))) {
            return None;
        }
        match method {
            "session/prompt" => Some((sid, None)),
            "session/set_title"
                if crate::registry::advertises(b.child().agent(), "/sessionCapabilities/title") =>
            {
                let title = params
                    .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
                    .and_then(|v| v.get("title")?.as_str().map(str::to_string))?;
                Some((sid, Some(title)))
            }
            _ => None,
        }
    }

    /// Writes what [`Conn::activity`] found, off the router.
    fn note_activity(&self, (sid, title): (String, Option<String>)) {
        let store = self.ctx.sessions.store.clone();
        let owner = self.caller();
        self.tracker.spawn(async move {
            if let Err(e) = store.touch(&sid, owner, title).await {
                tracing::debug!(session = %sid, "cannot note the session's activity: {e}");
            }
        });
    }

    /// Writes `title` (and `updatedAt`) of session `sid` when run: after the agent took it.
    fn title_once_taken(&self, sid: String, title: String) -> crate::child::AfterOk {
        let store = self.ctx.sessions.store.clone();
        let owner = self.caller();
        Box::new(move || {
            Box::pin(async move {
                if let Err(e) = store.touch(&sid, owner, Some(title)).await {
                    tracing::debug!(session = %sid, "cannot note the session's title: {e}");
                }
            })
        })
    }

    /// The `authenticate` params this connection used with `provider`.
    fn auth_for(&self, provider: &str) -> Option<Box<RawValue>> {
        lock(&self.auth).get(provider).cloned()
    }

    fn on_notification(self: &Arc<Self>, method: &str, params: Option<&RawValue>) {
        if method.starts_with("_acpd/") {
            return;
        }
        if let Some(key) =
            params.and_then(|p| acpd_protocol::session_id::duplicate_routing_key(p.get()))
        {
            tracing::warn!(owner = self.owner, %method,
                "dropping a notification whose params carry \"{key}\" twice");
            return;
        }
        if method == "$/cancel_request" {
            // Which session's agent got the request is its relay's to know: each looks for the
            // id among the calls it forwarded, and the one that has it sends the cancel on.
            if let Some(p) = params {
                let bridges: Vec<bridge::BridgeHandle> = lock(&self.sessions)
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
            return;
        }
        let extension = method != "session/cancel";
        // A notification naming no session has nowhere to go: ignored, as JSON-RPC asks.
        let Some(sid) = params.and_then(session_id) else {
            return;
        };
        let own = lock(&self.sessions).get(&sid).cloned();
        let target = own.clone().or_else(|| self.session(&sid));
        if extension {
            // Every other notification passes to the session's agent; a run's child is acpd's
            // to drive.
            if let (Some(SessionRef::Bridge(b)), Some(p)) = (target, params) {
                b.notify(method.to_string(), p.to_owned());
            }
            return;
        }
        match target {
            // A bridge child's subagent session: its bridge routes the cancel to the child.
            Some(SessionRef::Bridge(b)) if own.is_none() => {
                if let Some(p) = params {
                    b.notify(method.to_string(), p.to_owned());
                }
            }
            Some(SessionRef::Bridge(b)) => {
                b.cancel();
                self.cascade(&sid, false);
                let nested = crate::registry::Parent::Session(sid.clone());
                self.ctx.registry.cancel_nested(&nested);
            }
            Some(SessionRef::Run { run_id }) => {
                let _ = self.ctx.registry.cancel(self.owner, &run_id);
            }
            None => self.cancel_nested_session(&sid),
        }
    }

    async fn on_fault(&self, fault: LineFault) {
        tracing::warn!(owner = self.owner, "parent sent a bad line: {fault}");
        let (id, error) = fault.to_rpc_error();
        let _ = self.peer.respond_err(id.as_ref(), &error).await;
    }

    /// Routes a request that names a session to that session.
    async fn to_session(self: &Arc<Self>, id: Id, method: String, params: Option<Box<RawValue>>) {
        let sid = params.as_deref().and_then(session_id);
        let target = sid.as_ref().and_then(|s| self.session(s));
        match (target, sid) {
            (Some(SessionRef::Bridge(b)), _) => {
                let activity = self.activity(&method, params.as_deref(), &b);
                // A new title is the agent's to refuse: written once it answered with a
                // result. A prompt it was given is activity whatever it answers.
                let (now, after_ok) = match activity {
                    Some((sid, Some(title))) => (None, Some(self.title_once_taken(sid, title))),
                    other => (other, None),
                };
                match b.forward(id, method, params, after_ok) {
                    Ok(()) => {
                        if let Some(activity) = now {
                            self.note_activity(activity);
                        }
                    }
                    Err(refused) => {
                        let (id, e) = *refused;
                        self.reply_err(&id, &e).await;
                    }
                }
            }
            (Some(SessionRef::Run { .. }), _) => {
                let e = RpcError::invalid_request(format!(
                    "{method}: a subagent session can only be cancelled by its parent"
                ));
                self.reply_err(&id, &e).await;
            }
            (None, Some(sid)) if method.starts_with("session/") => {
                self.reply_err(&id, &session_not_found(&sid)).await;
            }
            (None, None) if method.starts_with("session/") => {
                let e = RpcError::invalid_params(format!("{method} needs a sessionId"));
                self.reply_err(&id, &e).await;
            }
            // Naming no session, a method acpd has no part in (an extension, an ACP method newer
            // than acpd) is asked of a new child of the provider, as `authenticate` is: the
            // editor gets the agent's own answer, its -32601 included, as it would directly. Not
            // from inside a child's tree, which may not start bridge children.
            (None, None) if matches!(self.lineage(), crate::registry::Lineage::Outside) => {
                let conn = self.clone();
                self.tracker
                    .spawn(capabilities::ask_new_child(conn, id, method, params));
            }
            _ => {
                self.reply_err(&id, &RpcError::method_not_found(&method))
                    .await
            }
        }
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
        RpcError::limit("max_sessions_per_connection", self.max_seats as u64)
    }

    fn client(&self) -> ClientInfo {
        lock(&self.client).clone().unwrap_or_default()
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
        futures::join!(closing_bridges, disposing_runs);
        events::settle_nested(self);
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
