//! Where `acpd mcp`'s runs live: a running daemon, reached through its `_acpd/*` methods over
//! its socket (the runs show in `acpd status` and count in its limits), or a registry of this
//! process (`--in-process`, or no daemon answering). Both answer with the same types.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use acpd_protocol::acp::{ContentBlock, RequestPermissionRequest};
use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::methods::{
    DisposeReply, DisposeRequest, Empty, ListReply, ProvidersReply, RunRef, RunSummary, SendReply,
    SendRequest, StartReply, name,
};
use acpd_protocol::permission::{Decision, cancelled, decide};
use acpd_protocol::subagent::{ProviderInfo, StartRequest, SubagentResult, WorkspaceFailure};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::mcp_error::Failure;
use crate::registry::{DepthContext, Registry, RunState, StartOptions};
use crate::wire::{self, CallError, Incoming};

/// The only owner of an in-process registry: one MCP client per `acpd mcp` process.
const OWNER: crate::registry::Owner = 0;

/// What a run has streamed so far (in-process runs only: the daemon sends output with the
/// result).
#[derive(Debug, Clone, Default)]
pub(super) struct Activity {
    pub chunks: u64,
    pub bytes: u64,
    /// The end of the latest output, at most [`TAIL`] characters, on one line.
    pub tail: String,
}

const TAIL: usize = 80;

pub(super) enum Backend {
    Local(Local),
    Daemon(Daemon),
}

impl Backend {
    pub(super) fn describe(&self) -> String {
        match self {
            Backend::Local(_) => "this acpd mcp process (no daemon)".to_string(),
            Backend::Daemon(d) => format!("the acpd daemon at {}", d.path.display()),
        }
    }

    pub(super) async fn providers(&self) -> Result<Vec<ProviderInfo>, Failure> {
        match self {
            Backend::Local(l) => Ok(l.registry.providers()),
            Backend::Daemon(d) => {
                let reply: ProvidersReply = d.call(name::PROVIDERS, &Empty {}).await?;
                Ok(reply.providers)
            }
        }
    }

    /// Starts a run; its first turn runs at once. `cancel` abandons an in-process start
    /// before publication (a daemon's start is disposed once it answers).
    pub(super) async fn start(
        &self,
        request: StartRequest,
        cancel: &CancellationToken,
    ) -> Result<StartReply, Failure> {
        match self {
            Backend::Local(l) => l.start(request, cancel).await,
            Backend::Daemon(d) => d.start(request).await,
        }
    }

    pub(super) async fn wait(&self, run_id: &str) -> Result<SubagentResult, Failure> {
        match self {
            Backend::Local(l) => Ok((*l.registry.wait(OWNER, run_id).await?).clone()),
            Backend::Daemon(d) => d.call(name::WAIT, &run_ref(run_id)).await,
        }
    }

    pub(super) async fn send(
        &self,
        run_id: &str,
        prompt: Vec<ContentBlock>,
    ) -> Result<SendReply, Failure> {
        match self {
            Backend::Local(l) => {
                let turn = l.registry.send(OWNER, run_id, prompt).await?;
                Ok(SendReply {
                    run_id: run_id.to_string(),
                    turn,
                })
            }
            Backend::Daemon(d) => {
                let req = SendRequest {
                    run_id: run_id.to_string(),
                    prompt,
                };
                d.call(name::SEND, &req).await
            }
        }
    }

    pub(super) async fn cancel(&self, run_id: &str) -> Result<(), Failure> {
        match self {
            Backend::Local(l) => Ok(l.registry.cancel(OWNER, run_id)?),
            Backend::Daemon(d) => d
                .call::<Empty>(name::CANCEL, &run_ref(run_id))
                .await
                .map(drop),
        }
    }

    pub(super) async fn dispose(&self, run_id: &str) -> Result<(), Failure> {
        self.dispose_with(run_id, true, false).await.map(drop)
    }

    /// [`Backend::dispose`], deleting the run's worktree branch too unless `keep_branch`,
    /// and a worktree whose work git refuses to commit only when `force`; returns the
    /// worktree it kept.
    pub(super) async fn dispose_with(
        &self,
        run_id: &str,
        keep_branch: bool,
        force: bool,
    ) -> Result<Option<WorkspaceFailure>, Failure> {
        match self {
            Backend::Local(l) => {
                let kept = l
                    .registry
                    .dispose_with(OWNER, run_id, keep_branch, force)
                    .await?;
                lock(&l.activity).remove(run_id);
                Ok(kept)
            }
            Backend::Daemon(d) => {
                let request = DisposeRequest {
                    run_id: run_id.to_string(),
                    keep_branch: (!keep_branch).then_some(false),
                    force: force.then_some(true),
                };
                d.call::<DisposeReply>(name::DISPOSE, &request)
                    .await
                    .map(|r| r.kept)
            }
        }
    }

    pub(super) async fn list(&self) -> Result<Vec<RunSummary>, Failure> {
        match self {
            Backend::Local(l) => Ok(l.list()),
            Backend::Daemon(d) => {
                let reply: ListReply = d.call(name::LIST, &Empty {}).await?;
                Ok(reply.runs)
            }
        }
    }

    /// What the run has streamed, while it lives in this process.
    pub(super) fn activity(&self, run_id: &str) -> Option<watch::Receiver<Activity>> {
        match self {
            Backend::Local(l) => lock(&l.activity).get(run_id).cloned(),
            Backend::Daemon(_) => None,
        }
    }

    /// The MCP client is gone: every run is cancelled and its tree torn down and reaped (a
    /// daemon does that itself when the connection closes).
    pub(super) async fn close(&self) {
        match self {
            Backend::Local(l) => {
                l.warm.cancel();
                l.registry.dispose_owner(OWNER).await;
                let nest = lock(&l.nest).take();
                if let Some(nest) = nest {
                    nest.close().await;
                }
                l.registry.drain_spares().await;
                lock(&l.activity).clear();
            }
            Backend::Daemon(d) => d.close().await,
        }
    }

    /// The longest a graceful close may take before every child group is SIGKILLed.
    pub(super) fn close_bound(&self) -> std::time::Duration {
        match self {
            // As `acpd stdio`: the largest cancel + EOF + TERM grace, plus a margin.
            Backend::Local(l) => crate::runtime::shutdown_bound(&l.registry.config()),
            Backend::Daemon(_) => std::time::Duration::from_secs(5),
        }
    }
}

fn run_ref(run_id: &str) -> RunRef {
    RunRef {
        run_id: run_id.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registry of this process.
pub(super) struct Local {
    registry: Registry,
    caller_cwd: Option<PathBuf>,
    activity: Mutex<HashMap<String, watch::Receiver<Activity>>>,
    /// Stops keeping warm spares (`warm`).
    warm: CancellationToken,
    /// Where the children's own `acpd mcp` connects when a provider offers delegation.
    nest: Mutex<Option<crate::runtime::NestSocket>>,
}

impl Local {
    pub(super) fn new(config: crate::config::Config) -> Local {
        let registry = Registry::new(config, DepthContext::from_env());
        // Before the spares: the socket is what offers delegation in a session's MCP servers.
        let nest = crate::runtime::NestSocket::open_for(&registry);
        let warm = CancellationToken::new();
        registry.keep_warm(warm.clone());
        Local {
            registry,
            caller_cwd: std::env::current_dir().ok(),
            activity: Mutex::new(HashMap::new()),
            warm,
            nest: Mutex::new(nest),
        }
    }

    async fn start(
        &self,
        request: StartRequest,
        cancel: &CancellationToken,
    ) -> Result<StartReply, Failure> {
        let run_id = uuid::Uuid::new_v4().to_string();
        let (sink, chunks) = mpsc::channel::<String>(64);
        let (activity, seen) = watch::channel(Activity::default());
        tokio::spawn(track(chunks, activity));
        lock(&self.activity).insert(run_id.clone(), seen);
        let started = self
            .registry
            .start(StartOptions {
                request,
                caller_cwd: self.caller_cwd.clone(),
                owner: OWNER,
                sink: Some(sink),
                cancel: cancel.clone(),
                run_id: Some(run_id.clone()),
                ..Default::default()
            })
            .await;
        match started {
            Ok(p) => Ok(StartReply {
                run_id: p.run_id,
                session_id: p.session_id,
            }),
            Err(e) => {
                lock(&self.activity).remove(&run_id);
                Err(e.into())
            }
        }
    }

    fn list(&self) -> Vec<RunSummary> {
        self.registry
            .runs()
            .into_iter()
            .filter(|r| r.owner == OWNER)
            .filter_map(|r| {
                let state = r.state();
                let turn = match &state {
                    RunState::Running { turn } | RunState::Settled { turn, .. } => Some(*turn),
                    RunState::Disposed => return None,
                };
                Some(RunSummary {
                    run_id: r.run_id.clone(),
                    session_id: r.session_id.clone(),
                    provider: r.provider.name.clone(),
                    label: r.label.clone(),
                    state: state.name().to_string(),
                    turn,
                    depth: r.depth,
                })
            })
            .collect()
    }
}

/// Counts a run's streamed output until its last sender (the run) is gone.
async fn track(mut chunks: mpsc::Receiver<String>, activity: watch::Sender<Activity>) {
    while let Some(text) = chunks.recv().await {
        activity.send_modify(|a| {
            a.chunks += 1;
            a.bytes += text.len() as u64;
            let line = text.trim_end().rsplit('\n').next().unwrap_or_default();
            if !line.is_empty() {
                let skip = line.chars().count().saturating_sub(TAIL);
                a.tail = line.chars().skip(skip).collect();
            }
        });
    }
}

/// A running daemon, over one connection (opened again after the daemon went away).
pub(super) struct Daemon {
    pub path: PathBuf,
    conn: tokio::sync::Mutex<Option<Arc<DaemonConn>>>,
    /// The caller's working directory: a start without `cwd` that the daemon cannot place
    /// (it has no caller directory over a socket) is tried again in it.
    caller_cwd: Option<PathBuf>,
}

struct DaemonConn {
    peer: wire::Peer,
    gone: CancellationToken,
}

impl Daemon {
    /// The daemon at `path`, if one answers `initialize` there.
    pub(super) async fn connect(path: &Path) -> Result<Daemon, String> {
        let conn = DaemonConn::open(path).await?;
        Ok(Daemon {
            path: path.to_path_buf(),
            conn: tokio::sync::Mutex::new(Some(Arc::new(conn))),
            caller_cwd: std::env::current_dir().ok(),
        })
    }

    async fn conn(&self) -> Result<Arc<DaemonConn>, Failure> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.gone.is_cancelled()) {
            return Ok(c.clone());
        }
        match DaemonConn::open(&self.path).await {
            Ok(c) => {
                tracing::warn!(
                    "reconnected to the acpd daemon at {}; runs started before are gone",
                    self.path.display()
                );
                let c = Arc::new(c);
                *slot = Some(c.clone());
                Ok(c)
            }
            Err(detail) => Err(Failure::DaemonGone {
                path: self.path.clone(),
                detail,
            }),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: &(impl Serialize + ?Sized),
    ) -> Result<T, Failure> {
        let conn = self.conn().await?;
        let raw = match conn.peer.request(method, params).await {
            Ok(raw) => raw,
            Err(CallError::Rpc(e)) => return Err(Failure::Remote(e)),
            Err(CallError::Closed) => {
                conn.gone.cancel();
                return Err(Failure::DaemonGone {
                    path: self.path.clone(),
                    detail: "it closed the connection".into(),
                });
            }
        };
        serde_json::from_str(raw.get()).map_err(|e| Failure::Internal {
            detail: format!("the daemon's answer to {method} is not what acpd mcp expects: {e}"),
        })
    }

    async fn start(&self, mut request: StartRequest) -> Result<StartReply, Failure> {
        // The daemon counts depth from itself; a caller that is itself a run's descendant
        // (ACPD_DEPTH) is held to what is left of the limit it inherited.
        let depth = DepthContext::from_env();
        if let Some(max) = depth.inherited_max
            && depth.depth > 0
        {
            if depth.depth + 1 > max {
                return Err(Failure::Registry(
                    crate::registry::RegistryError::DepthExceeded {
                        depth: depth.depth + 1,
                        max,
                    },
                ));
            }
            let left = max - depth.depth;
            request.max_depth = Some(request.max_depth.map_or(left, |m| m.min(left)));
        }
        let retry = request
            .cwd
            .is_none()
            .then(|| self.caller_cwd.clone())
            .flatten();
        match self.call::<StartReply>(name::START, &request).await {
            // Over a socket the daemon has no caller directory to fall back on; ours is it
            // (a provider's own `cwd` still wins, as the first try shows).
            Err(Failure::Remote(e)) if retry.is_some() && no_cwd_given(&e) => {
                let request = StartRequest {
                    cwd: retry,
                    ..request
                };
                self.call(name::START, &request).await
            }
            other => other,
        }
    }

    async fn close(&self) {
        if let Some(c) = self.conn.lock().await.take() {
            c.peer.flush_and_close().await;
        }
    }
}

/// The daemon's INVALID_CWD for a start that named no directory and has no provider `cwd`.
fn no_cwd_given(e: &RpcError) -> bool {
    e.code == acpd_protocol::errors::ErrorName::InvalidCwd.code()
        && e.message.contains("no cwd given")
}

impl DaemonConn {
    async fn open(path: &Path) -> Result<DaemonConn, String> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| e.to_string())?;
        let (reader, writer) = stream.into_split();
        let conn = wire::connect(reader, writer, acpd_protocol::codec::DEFAULT_MAX_LINE);
        let gone = conn.eof.clone();
        let peer = conn.peer.clone();
        tokio::spawn(answer_daemon(conn.peer.clone(), conn.incoming));
        let init = json!({
            "protocolVersion": 1,
            "clientCapabilities": {},
            "clientInfo": { "name": "acpd mcp", "version": env!("CARGO_PKG_VERSION") },
            // acpd's own methods only: no probe of the default provider's agent.
            "_meta": { "acpd": { "query": true } },
        });
        let init = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            peer.request("initialize", &init),
        )
        .await
        .map_err(|_| "it did not answer initialize within 10s".to_string())?;
        init.map_err(|e| format!("initialize failed: {e}"))?;
        Ok(DaemonConn { peer, gone })
    }
}

/// What the daemon asks of us: a permission request (nobody here can answer one, so it is
/// rejected, as `acpd run` does without a terminal); anything else is not ours.
async fn answer_daemon(peer: wire::Peer, mut incoming: wire::Inbox) {
    while let Some(msg) = incoming.recv().await {
        match msg {
            Incoming::Request { id, method, params } => answer(&peer, id, &method, params).await,
            Incoming::Notification { .. } | Incoming::Fault(_) => {}
        }
    }
}

async fn answer(
    peer: &wire::Peer,
    id: Id,
    method: &str,
    params: Option<Box<serde_json::value::RawValue>>,
) {
    if method != "session/request_permission" {
        let _ = peer
            .respond_err(Some(&id), &RpcError::method_not_found(method))
            .await;
        return;
    }
    let request: Option<RequestPermissionRequest> =
        params.and_then(|p| serde_json::from_str(p.get()).ok());
    let response = match &request {
        Some(r) if !r.options.is_empty() => decide(r, Decision::Reject),
        _ => cancelled(),
    };
    let _ = peer.respond_ok(&id, &response).await;
}

impl From<crate::registry::RegistryError> for Failure {
    fn from(e: crate::registry::RegistryError) -> Self {
        Failure::Registry(e)
    }
}
