//! The ACP client toward one child agent: spawn, handshake (`initialize` with protocol version
//! 1 checked, then `session/new`), turns, and teardown. Everything before publication that goes
//! wrong tears the child down and reaps it before the failure is returned.

mod output;
mod permission;
mod turn;

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::{ClientCapabilities, Implementation, InitializeRequest};
use acpd_protocol::envelope::{self, AUTH_REQUIRED, Id, RpcError};
use acpd_protocol::subagent::{Category, Failure, Stage};
use agent_client_protocol::schema::ProtocolVersion;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ProviderConfig;
use crate::supervise::{
    self, Graces, ProcessTree, SpawnError, SpawnSpec, StderrTail, TeardownOutcome,
};
use crate::wire::{self, CallError, Incoming, Peer, PendingCall};

pub use permission::{Decision, cancelled as permission_cancelled, decide as decide_permission};
pub use turn::{PermissionAsk, Tap, TurnControl, TurnReport};

/// How a child is started.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub provider: Arc<ProviderConfig>,
    /// Names the run in logs.
    pub run_id: String,
    pub cwd: PathBuf,
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    pub max_line: usize,
    pub session: SessionParams,
}

impl ChildSpec {
    /// A spec with the provider's allowlisted environment at `depth` of `max_depth`, the
    /// default line cap and no session extras.
    pub fn new(
        provider: Arc<ProviderConfig>,
        run_id: String,
        cwd: PathBuf,
        depth: u32,
        max_depth: u32,
    ) -> ChildSpec {
        let env = supervise::child_env(
            std::env::vars_os(),
            &provider.env_passthrough,
            &provider.env,
            depth,
            max_depth,
        );
        ChildSpec {
            provider,
            run_id,
            cwd,
            env,
            max_line: acpd_protocol::codec::DEFAULT_MAX_LINE,
            session: SessionParams::default(),
        }
    }
}

/// What goes into the child's `session/new` besides the cwd.
#[derive(Debug, Clone, Default)]
pub struct SessionParams {
    /// The parent's `mcpServers`, forwarded unchanged; none for a delegated run.
    pub mcp_servers: Option<Box<RawValue>>,
    /// Sent as `systemPrompt` (mode `append`); only for agents that advertise it.
    pub system_prompt: Option<String>,
}

/// Why a child could not be published.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("{} failed ({}): {detail}", failure.stage.as_str(), failure.category.as_str())]
    Handshake { failure: Failure, detail: String },
    #[error("cancelled during {}", stage.as_str())]
    Cancelled { stage: Stage },
}

impl StartFailure {
    /// The fixed facts, for the diagnostic and `error.data`.
    pub fn failure(&self) -> Failure {
        match self {
            StartFailure::Spawn(_) => Failure {
                stage: Stage::Spawn,
                category: Category::Spawn,
                code: None,
                exit_code: None,
                signal: None,
            },
            StartFailure::Handshake { failure, .. } => failure.clone(),
            StartFailure::Cancelled { stage } => Failure {
                stage: *stage,
                category: Category::Reported("cancelled".into()),
                code: None,
                exit_code: None,
                signal: None,
            },
        }
    }
}

/// What the child said about itself in `initialize`.
#[derive(Debug, Clone, Default)]
pub struct AgentInfo {
    pub protocol_version: serde_json::Value,
    /// `agentInfo` as the child sent it (name, version, title).
    pub agent_info: serde_json::Value,
    pub auth_method_ids: Vec<String>,
    /// `agentCapabilities` as the child sent them.
    pub capabilities: serde_json::Value,
}

/// A live, initialized child with one ACP session.
pub struct AcpChild {
    provider: Arc<ProviderConfig>,
    run_id: String,
    tree: ProcessTree,
    peer: Peer,
    incoming: mpsc::Receiver<Incoming>,
    incoming_open: bool,
    session_id: String,
    /// The child's `session/new` result, for bridges that pass `modes`, `configOptions` and
    /// `models` through.
    session_reply: Box<RawValue>,
    stderr: StderrTail,
    agent: AgentInfo,
}

/// The pieces of a started child, for a bridge session that drives the connection itself.
pub struct BridgeParts {
    pub peer: Peer,
    pub incoming: mpsc::Receiver<Incoming>,
    pub handle: ChildHandle,
    pub session_id: String,
    pub session_reply: Box<RawValue>,
    pub agent: AgentInfo,
    pub stderr: StderrTail,
}

/// Something that stopped us waiting for a reply.
enum Interrupt {
    Rpc(RpcError),
    Exited(Option<ExitStatus>),
    Protocol(String),
    Timeout,
    Cancelled,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeReply {
    protocol_version: serde_json::Value,
    #[serde(default)]
    agent_capabilities: serde_json::Value,
    #[serde(default)]
    auth_methods: Vec<AuthMethodId>,
    #[serde(default)]
    agent_info: serde_json::Value,
}

#[derive(Deserialize)]
struct AuthMethodId {
    id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSessionReply {
    session_id: String,
}

impl AcpChild {
    /// Spawns and initializes the child and creates its session. On failure the child's whole
    /// tree is gone before this returns.
    pub async fn start(
        spec: ChildSpec,
        client_capabilities: ClientCapabilities,
        cancel: &CancellationToken,
    ) -> Result<AcpChild, StartFailure> {
        let mut child = Self::spawn(&spec).await?;
        let deadline = Instant::now() + child.provider.handshake_timeout;
        let handshake = async {
            child
                .initialize(client_capabilities, deadline, cancel)
                .await?;
            child
                .new_session(&spec.cwd, &spec.session, deadline, cancel)
                .await
        };
        match handshake.await {
            Ok(()) => Ok(child),
            Err(e) => {
                tracing::warn!(
                    provider = %child.provider.name, run = %child.run_id,
                    stderr_tail = ?child.stderr.snapshot(), "child failed to start: {e}"
                );
                child.teardown().await;
                Err(e)
            }
        }
    }

    /// Spawns the child, runs `initialize` only, and tears it down: what the agent says about
    /// itself, learned before a run's own child is spawned.
    pub async fn probe(
        spec: ChildSpec,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, StartFailure> {
        let mut child = Self::spawn(&spec).await?;
        let deadline = Instant::now() + child.provider.handshake_timeout;
        let result = child
            .initialize(ClientCapabilities::default(), deadline, cancel)
            .await;
        child.teardown().await;
        result.map(|()| child.agent.clone())
    }

    async fn spawn(spec: &ChildSpec) -> Result<AcpChild, StartFailure> {
        let provider = spec.provider.clone();
        let spawned = supervise::spawn(SpawnSpec {
            argv: provider.command.clone(),
            cwd: spec.cwd.clone(),
            env: spec.env.clone(),
        })
        .await?;
        let stderr =
            StderrTail::drain(spawned.stderr, format!("{}/{}", provider.name, spec.run_id));
        let conn = wire::connect(spawned.stdout, spawned.stdin, spec.max_line);
        Ok(AcpChild {
            provider,
            run_id: spec.run_id.clone(),
            tree: spawned.tree,
            peer: conn.peer,
            incoming: conn.incoming,
            incoming_open: true,
            session_id: String::new(),
            session_reply: envelope::to_raw(&serde_json::Value::Null),
            stderr,
            agent: AgentInfo::default(),
        })
    }

    async fn initialize(
        &mut self,
        client_capabilities: ClientCapabilities,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(), StartFailure> {
        let init = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(client_capabilities)
            .client_info(Implementation::new("acpd", env!("CARGO_PKG_VERSION")));
        let raw = self
            .exchange(Stage::Initialize, "initialize", &init, deadline, cancel)
            .await?;
        let reply: InitializeReply = serde_json::from_str(raw.get()).map_err(|e| {
            handshake(
                Stage::Initialize,
                Category::Protocol,
                format!("bad initialize result: {e}"),
            )
        })?;
        if reply.protocol_version != serde_json::json!(1) {
            return Err(handshake(
                Stage::Initialize,
                Category::ProtocolVersion,
                format!(
                    "child speaks ACP protocol version {}, acpd needs 1",
                    reply.protocol_version
                ),
            ));
        }
        self.agent = AgentInfo {
            protocol_version: reply.protocol_version,
            agent_info: reply.agent_info,
            auth_method_ids: reply.auth_methods.into_iter().map(|m| m.id).collect(),
            capabilities: reply.agent_capabilities,
        };
        Ok(())
    }

    async fn new_session(
        &mut self,
        cwd: &std::path::Path,
        session: &SessionParams,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(), StartFailure> {
        let mut new = serde_json::json!({ "cwd": cwd, "mcpServers": [] });
        if let Some(servers) = &session.mcp_servers {
            new["mcpServers"] = serde_json::from_str(servers.get()).unwrap_or_default();
        }
        if let Some(prompt) = &session.system_prompt {
            new["systemPrompt"] = serde_json::json!({
                "mode": "append",
                "content": [{ "type": "text", "text": prompt }],
            });
        }
        let raw = self
            .exchange(Stage::SessionNew, "session/new", &new, deadline, cancel)
            .await?;
        let reply: NewSessionReply = serde_json::from_str(raw.get()).map_err(|e| {
            handshake(
                Stage::SessionNew,
                Category::Protocol,
                format!("bad session/new result: {e}"),
            )
        })?;
        self.session_reply = raw;
        self.session_id = reply.session_id;
        Ok(())
    }

    /// Sends one handshake request and waits for its reply, the child's exit, the deadline or
    /// a cancel. Requests the child makes meanwhile are refused; notifications are dropped.
    async fn exchange<P: serde::Serialize>(
        &mut self,
        stage: Stage,
        method: &str,
        params: &P,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Box<RawValue>, StartFailure> {
        let interrupt = match self.peer.call(method, params).await {
            Ok(call) => match self.await_reply(call, deadline, cancel).await {
                Ok(raw) => return Ok(raw),
                Err(i) => i,
            },
            Err(_) => Interrupt::Exited(self.exit_status_soon().await),
        };
        Err(match interrupt {
            Interrupt::Cancelled => StartFailure::Cancelled { stage },
            Interrupt::Rpc(e) => {
                let category = if e.code == AUTH_REQUIRED {
                    Category::Auth
                } else {
                    Category::Rpc
                };
                let mut f = failure(stage, category);
                f.code = Some(e.code);
                StartFailure::Handshake {
                    failure: f,
                    detail: format!("child answered {method} with error {}", e.code),
                }
            }
            Interrupt::Exited(status) => {
                let mut f = failure(stage, Category::ProcessExit);
                if let Some(status) = status {
                    f.exit_code = status.code();
                    f.signal = supervise::signal_name(&status);
                }
                StartFailure::Handshake {
                    failure: f,
                    detail: format!("child exited or closed its output during {method}"),
                }
            }
            Interrupt::Protocol(detail) => handshake(stage, Category::Protocol, detail),
            Interrupt::Timeout => handshake(
                stage,
                Category::Timeout,
                format!("no answer to {method} within handshake_timeout"),
            ),
        })
    }

    async fn await_reply(
        &mut self,
        call: PendingCall,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Box<RawValue>, Interrupt> {
        let reply = call.result();
        tokio::pin!(reply);
        loop {
            tokio::select! {
                biased;
                r = &mut reply => return match r {
                    Ok(raw) => Ok(raw),
                    Err(CallError::Rpc(e)) => Err(Interrupt::Rpc(e)),
                    Err(CallError::Closed) => Err(Interrupt::Exited(self.exit_status_soon().await)),
                },
                msg = self.incoming.recv(), if self.incoming_open => match msg {
                    None => self.incoming_open = false,
                    Some(Incoming::Fault(f)) => return Err(Interrupt::Protocol(f.to_string())),
                    Some(Incoming::Request { id, method, .. }) => self.refuse(&id, &method).await,
                    Some(Incoming::Notification { .. }) => {}
                },
                status = self.tree.exited() => {
                    // The reply may already be in the pipe; give the reader a moment.
                    return match tokio::time::timeout(Duration::from_millis(200), &mut reply).await {
                        Ok(Ok(raw)) => Ok(raw),
                        Ok(Err(CallError::Rpc(e))) => Err(Interrupt::Rpc(e)),
                        _ => Err(Interrupt::Exited(Some(status))),
                    };
                }
                _ = tokio::time::sleep_until(deadline) => return Err(Interrupt::Timeout),
                _ = cancel.cancelled() => return Err(Interrupt::Cancelled),
            }
        }
    }

    /// Answers a request acpd does not serve for this child with −32601.
    async fn refuse(&self, id: &Id, method: &str) {
        let _ = self
            .peer
            .respond_err(Some(id), &RpcError::method_not_found(method))
            .await;
    }

    /// The child's exit status if it exits within a second (its output closed, so it most
    /// likely is exiting); `None` if it keeps running with its output closed.
    async fn exit_status_soon(&self) -> Option<ExitStatus> {
        tokio::time::timeout(Duration::from_secs(1), self.tree.exited())
            .await
            .ok()
    }

    pub fn provider(&self) -> &Arc<ProviderConfig> {
        &self.provider
    }

    /// The child's own session id (never shown to parents, who get a minted one).
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    pub fn agent(&self) -> &AgentInfo {
        &self.agent
    }

    pub fn pid(&self) -> i32 {
        self.tree.pid()
    }

    pub fn tree(&self) -> &ProcessTree {
        &self.tree
    }

    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr.snapshot()
    }

    /// Runs the teardown ladder with the provider's graces. Idempotent.
    pub async fn teardown(&self) -> TeardownOutcome {
        self.handle().teardown().await
    }

    /// Hands the connection to a bridge session.
    pub fn into_bridge(self) -> BridgeParts {
        let handle = self.handle();
        BridgeParts {
            peer: self.peer,
            incoming: self.incoming,
            handle,
            session_id: self.session_id,
            session_reply: self.session_reply,
            agent: self.agent,
            stderr: self.stderr,
        }
    }

    /// A handle that can tear the child down while someone else owns it (a running turn).
    pub fn handle(&self) -> ChildHandle {
        ChildHandle {
            tree: self.tree.clone(),
            peer: self.peer.clone(),
            graces: Graces {
                eof: self.provider.eof_grace,
                term: self.provider.term_grace,
            },
        }
    }
}

/// Enough of a child to end it: its tree, its stdin (through the peer) and its graces.
#[derive(Clone)]
pub struct ChildHandle {
    tree: ProcessTree,
    peer: Peer,
    graces: Graces,
}

impl ChildHandle {
    pub async fn teardown(&self) -> TeardownOutcome {
        let peer = self.peer.clone();
        self.tree.teardown(move || peer.close(), self.graces).await
    }

    pub fn tree(&self) -> &ProcessTree {
        &self.tree
    }
}

fn failure(stage: Stage, category: Category) -> Failure {
    Failure {
        stage,
        category,
        code: None,
        exit_code: None,
        signal: None,
    }
}

fn handshake(stage: Stage, category: Category, detail: String) -> StartFailure {
    StartFailure::Handshake {
        failure: failure(stage, category),
        detail,
    }
}
