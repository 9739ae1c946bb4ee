//! Everything that talks to one child agent, in one driver: spawn and handshake
//! ([`launch`]: `initialize` with protocol version 1 checked, then `session/new`), then one
//! task per child that owns its wire and reads every line the child writes, in order, in one of
//! two modes over the same code — **collect** (a run: turns with output, outcome facts,
//! timeouts, cancel) or **relay** (a bridge session: every message forwarded to the parent's
//! connection). Owners hold a [`Child`] handle, never the wire.
//!
//! A child is untrusted input: a bad line fails the turn, updates outside a turn are dropped
//! (collect), an update must carry exactly the child's own `sessionId`, and a child can never
//! emit `_acpd/*` ([`strict`]).

mod cause;
mod client_caps;
mod collect;
mod driver;
mod handshake;
mod launch;
pub(crate) mod queue;
mod relay;
mod relay_types;
mod start_failure;
mod strict;
#[cfg(test)]
pub(crate) mod tests;
mod tool_guard;
mod turn_output;

use std::path::PathBuf;
use std::sync::Arc;

use acpd_protocol::acp::{ContentBlock, RequestPermissionRequest, RequestPermissionResponse};
use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::outcome::TurnEnd;
use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::ProviderConfig;
use crate::supervise::{self, Graces, ProcessTree, StderrTail, TeardownOutcome};
use crate::wire::{Outbox, WireLimits};

pub(crate) use client_caps::ClientCaps;
pub(crate) use launch::{Initialized, Open, initialize, probe};
pub(crate) use queue::CallRefused;
use queue::{CMD_DEPTH, CmdTx, QUEUE_BYTES, Refused};
pub(crate) use relay_types::{AfterOk, Cmd};
pub(crate) use relay_types::{First, ParentServes, RelayEnd, RelayTarget};
use start_failure::failure;
pub(crate) use start_failure::{StartFailure, auth_notes, with_auth_advice};

/// The log target of a failed start's or turn's one warning line: `acpd run`, which prints
/// the same cause as its own error, leaves it out of its stderr.
pub(crate) const FAILURE_LOG: &str = "acpd::failure";

/// How a child is started.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub provider: Arc<ProviderConfig>,
    /// Names the run or session in logs.
    pub run_id: String,
    pub cwd: PathBuf,
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    pub limits: WireLimits,
    pub session: SessionParams,
    /// A bridge session's child: its output waits in the pipe until [`Child::relay`].
    pub relay: bool,
    /// Where this child's traffic is traced (`trace_dir`).
    pub trace: Option<Arc<crate::trace::Trace>>,
    /// The Landlock ruleset its tree runs under (`sandbox`), applied between fork and exec.
    pub sandbox: Option<Arc<supervise::Sandbox>>,
}

impl ChildSpec {
    /// A spec with the provider's allowlisted environment at `depth` of `max_depth`, default
    /// wire limits and no session extras.
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
            limits: WireLimits::default(),
            session: SessionParams::default(),
            relay: false,
            trace: None,
            sandbox: None,
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
    /// Sent as `_meta` (an object): what an agent reads from there, such as a run's tool
    /// filter in claude-agent-acp's `claudeCode.options`.
    pub meta: Option<serde_json::Value>,
}

impl SessionParams {
    /// A delegated run's `session/new` params.
    pub fn new_session_params(&self, cwd: &std::path::Path) -> serde_json::Value {
        let mut new = serde_json::json!({ "cwd": cwd, "mcpServers": [] });
        if let Some(servers) = &self.mcp_servers
            && let Ok(servers) = serde_json::from_str::<serde_json::Value>(servers.get())
        {
            new["mcpServers"] = servers;
        }
        if let Some(prompt) = &self.system_prompt {
            new["systemPrompt"] = serde_json::json!({
                "mode": "append",
                "content": [{ "type": "text", "text": prompt }],
            });
        }
        if let Some(meta) = &self.meta {
            new["_meta"] = meta.clone();
        }
        new
    }
}

/// What the child said about itself in `initialize` (kept in the durable probe cache).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct AgentInfo {
    pub protocol_version: serde_json::Value,
    /// `agentInfo` as the child sent it (name, version, title).
    pub agent_info: serde_json::Value,
    pub auth_method_ids: Vec<String>,
    /// `authMethods` as the child sent them.
    #[serde(default)]
    pub auth_methods: Vec<serde_json::Value>,
    /// The result's own `_meta`.
    #[serde(default)]
    pub meta: serde_json::Value,
    /// `agentCapabilities` as the child sent them.
    pub capabilities: serde_json::Value,
}

/// What a child's driver reports to the owner of a turn (collect mode).
pub enum ChildEvent {
    /// A `session/update`'s `update` object, checked to be the child's own session's.
    Update(Box<RawValue>),
    /// A permission request for whoever can answer it (policy `forward`).
    Ask(Box<PermissionAsk>),
}

/// A permission request for whoever can answer it (a user on a terminal, a parent over ACP).
pub struct PermissionAsk {
    pub request: RequestPermissionRequest,
    pub reply: oneshot::Sender<RequestPermissionResponse>,
}

/// How the owner steers a turn (collect mode).
pub struct TurnControl {
    /// Parent cancel, dispose or Ctrl-C.
    pub cancel: CancellationToken,
    pub run_timeout: Option<std::time::Duration>,
    pub max_output: usize,
    /// Receives output text as it streams (bounded: a slow reader slows the child).
    pub sink: Option<mpsc::Sender<String>>,
    /// Receives raw updates (when `updates`) and permission asks (when `asks`); without it
    /// `permission = "forward"` has nobody to ask.
    pub events: Option<mpsc::Sender<ChildEvent>>,
    pub updates: bool,
    pub asks: bool,
    /// The run's budget: charged with the tokens the agent reports, and ending the turn
    /// (`budget`) once spent.
    pub budget: Option<std::sync::Arc<dyn TokenMeter>>,
    /// The run's tool filter, which acpd holds the child to: a permission request for a
    /// filtered tool is refused, and a filtered tool reported running ends the turn.
    pub tool_filter: Option<std::sync::Arc<acpd_protocol::tool_filter::ToolFilter>>,
}

/// Where a turn's reported tokens go (a run's budget, kept by the registry).
pub trait TokenMeter: Send + Sync {
    /// Adds tokens the agent reported.
    fn charge(&self, tokens: u64);
    /// Cancelled once the budget (or one above it) is spent.
    fn spent(&self) -> &CancellationToken;
}

/// What happened in a turn, before mapping to a result.
#[derive(Debug)]
pub struct TurnReport {
    pub end: TurnEnd,
    pub cancel_requested: bool,
    /// The stop reason the child gave, when it gave one.
    pub child_stop_reason: Option<String>,
    pub output: Vec<ContentBlock>,
    pub output_truncated: bool,
    pub notes: Vec<&'static str>,
    /// The child cannot take another turn (it died, hung, timed out or broke the protocol).
    pub child_spent: bool,
}

/// Messages dropped to a full queue are logged at most this often.
const DROP_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a question about a nested run waits for its bridge session's relay.
const PARENT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Shared between the handle and the driver.
struct Shared {
    provider: Arc<ProviderConfig>,
    relay_child: bool,
    log_id: String,
    session_id: String,
    /// The child's `session/new` result.
    session_reply: Box<RawValue>,
    agent: AgentInfo,
    tree: ProcessTree,
    out: Outbox,
    stderr: StderrTail,
    /// A parent's `session/cancel` that found the command queue full (relay mode), waiting
    /// to be sent after what was queued before it. Until the relay sends it, the parent's
    /// calls and notifications are refused as if the queue were still full, so none of what
    /// the parent sent after the cancel reaches the child before it.
    late_cancel: std::sync::Mutex<Option<Box<RawValue>>>,
    /// When a dropped message was last logged, and how many were dropped since.
    drops: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
    /// Wakes the relay for a [`Shared::late_cancel`]: a cancel is never lost to a full queue.
    relay_cancel: Notify,
    /// The parent's connection closed: detach (relay mode, with `detach`).
    relay_detach: Notify,
    /// The relay has answered what the leaving connection was owed (its prompts, `cancelled`):
    /// that connection's outbox may close now.
    relay_left: Notify,
    /// Set when the owner shuts the child: the driver stops at once.
    stop: CancellationToken,
    /// Cancelled when the driver has ended (relay: the session is over).
    done: CancellationToken,
    relay_end: std::sync::Mutex<Option<RelayEnd>>,
    /// Notifications sent during the handshake, for a bridge's parent.
    early: std::sync::Mutex<Vec<(String, Option<Box<RawValue>>)>>,
    trace: Option<Arc<crate::trace::Trace>>,
    /// The span of the run or bridge session that owns the child, when spans are exported:
    /// ended by the teardown (see [`Child::hold_span`]).
    span: std::sync::Mutex<Option<crate::otel::Span>>,
}

/// The owner's handle on a live, initialized child with one ACP session.
#[derive(Clone)]
pub struct Child {
    cmds: CmdTx,
    shared: Arc<Shared>,
}

/// How long a closing connection waits for a detaching relay's last answers to it.
const LEFT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Child {
    /// Whether `other` is a handle to this same child.
    pub fn is(&self, other: &Child) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Spawns and initializes the child and creates its session, then starts its driver. On
    /// failure the child's whole tree is gone before this returns.
    pub async fn start(
        spec: ChildSpec,
        client_capabilities: acpd_protocol::acp::ClientCapabilities,
        cancel: &CancellationToken,
    ) -> Result<Child, StartFailure> {
        launch::start(spec, client_capabilities, cancel).await
    }

    /// Runs one turn to its end (collect mode). Never fails: every outcome is a report.
    pub async fn prompt(&self, prompt: Vec<ContentBlock>, ctl: TurnControl) -> TurnReport {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .cmds
            .send(Cmd::Prompt {
                prompt,
                ctl,
                reply: tx,
            })
            .await;
        match (sent.is_ok(), rx.await) {
            (true, Ok(report)) => report,
            _ => {
                let status = self.shared.tree.exit_status();
                TurnReport {
                    end: TurnEnd::ProcessExit {
                        exit_code: status.and_then(|s| s.code()),
                        signal: status.as_ref().and_then(supervise::signal_name),
                    },
                    cancel_requested: false,
                    child_stop_reason: None,
                    output: Vec::new(),
                    output_truncated: false,
                    notes: Vec::new(),
                    child_spent: true,
                }
            }
        }
    }

    /// Starts relaying the session to `target` (relay mode). Until then the child's output
    /// waits in its pipe, so nothing it says before the parent knows the session is lost.
    pub fn relay(&self, target: RelayTarget) {
        let _ = self.cmds.try_send(Cmd::Relay(target), 0);
    }

    /// Forwards a parent's call (relay mode). Refused when the driver's queue is full (in
    /// messages or bytes, see [`queue`]) or the session is over; the caller answers the parent
    /// with the error.
    pub fn call(
        &self,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        after_ok: Option<AfterOk>,
    ) -> Result<(), Box<(Id, CallRefused)>> {
        let late = lock(&self.shared.late_cancel);
        let len = method.len() + params.as_ref().map_or(0, |p| p.get().len());
        let answer_to = id.clone();
        let cmd = Cmd::Call {
            id,
            method,
            params,
            after_ok,
        };
        let refused = if late.is_some() {
            Refused::Full(Box::new(cmd))
        } else {
            match self.cmds.try_send(cmd, len) {
                Ok(()) => return Ok(()),
                Err(refused) => refused,
            }
        };
        let why = match refused {
            Refused::Full(_) => {
                crate::metrics::get().limit_hit(crate::metrics::Limit::SessionQueue);
                CallRefused::QueueFull
            }
            Refused::Closed => CallRefused::Over,
        };
        Err(Box::new((answer_to, why)))
    }

    /// Forwards a parent's extension notification (relay mode). One that finds the driver's
    /// queue full is dropped, counted (`acpd_limit_hits_total{limit="session_queue"}`) and
    /// logged: a notification has no answer to carry the refusal.
    pub fn notify(&self, method: String, params: Box<RawValue>) {
        let late = lock(&self.shared.late_cancel);
        let len = method.len() + params.get().len();
        let refused = if late.is_some() {
            Some(Refused::Full(Box::new(Cmd::Notify { method, params })))
        } else {
            self.cmds
                .try_send(Cmd::Notify { method, params }, len)
                .err()
        };
        drop(late);
        self.dropped(refused, "a notification of the editor's");
    }

    /// Tells the parent about a run nested under this session (relay mode): `params` of a
    /// `session/update`. Dropped, counted and logged like [`Child::notify`] when the driver's
    /// queue is full.
    pub fn announce(&self, params: Box<RawValue>) {
        let len = params.get().len();
        let refused = self.cmds.try_send(Cmd::Announce(params), len).err();
        self.dropped(refused, "an update about a nested run");
    }

    /// Counts and logs a message the queue refused: one warning per [`DROP_WARN_EVERY`] at
    /// most, saying how many went since the last (an editor flooding a stalled agent must not
    /// flood the log too).
    fn dropped(&self, refused: Option<Refused>, what: &str) {
        match refused {
            None => {}
            Some(Refused::Closed) => {
                tracing::debug!(session = %self.shared.log_id, "dropping {what}: the session is over");
            }
            Some(Refused::Full(_)) => {
                crate::metrics::get().limit_hit(crate::metrics::Limit::SessionQueue);
                let mut drops = lock(&self.shared.drops);
                drops.1 += 1;
                if drops.0.is_some_and(|at| at.elapsed() < DROP_WARN_EVERY) {
                    return;
                }
                let count = std::mem::take(&mut drops.1);
                drops.0 = Some(std::time::Instant::now());
                drop(drops);
                tracing::warn!(session = %self.shared.log_id, provider = %self.shared.provider.name,
                    "dropped {what}, {count} since the last warning: the queue toward the agent \
                     is full ({} MiB or {CMD_DEPTH} messages wait for an agent that is not reading them)",
                    QUEUE_BYTES >> 20);
            }
        }
    }

    /// The connection of the editor this session is attached to (see [`Cmd::Parent`]).
    pub async fn parent_peer(&self) -> Option<crate::wire::Peer> {
        let (tx, rx) = oneshot::channel();
        self.cmds.try_send(Cmd::Parent(tx), 0).ok()?;
        // A relay held up by an agent that is not reading answers late: nobody then.
        tokio::time::timeout(PARENT_WAIT, rx)
            .await
            .ok()?
            .ok()
            .flatten()
    }

    /// A parent's `session/cancel` of this session, with the params it sent (relay mode): it
    /// reaches the child in the order the parent sent it, under the child's session id. Never
    /// refused: one that finds the queue full waits in [`Shared::late_cancel`].
    pub fn cancel(&self, params: Box<RawValue>) {
        let mut late = lock(&self.shared.late_cancel);
        if late.is_some() {
            // Nothing was queued since the one waiting: it cancels the same turn.
            return;
        }
        let len = params.get().len();
        if let Err(Refused::Full(cmd)) = self.cmds.try_send(Cmd::Cancel(params), len)
            && let Cmd::Cancel(params) = *cmd
        {
            *late = Some(params);
            drop(late);
            self.shared.relay_cancel.notify_one();
        }
    }

    /// The parent's connection is closing: the session waits for [`Child::relay`] to attach it
    /// to another for its `detach` time, then ends (relay mode).
    pub fn detach(&self) {
        self.shared.relay_detach.notify_one();
    }

    /// [`Child::detach`] at once; the future it returns ends once the relay has answered the leaving connection's open
    /// prompts (or after [`LEFT_WAIT`]): the connection closes its outbox right after, and an
    /// answer queued later would never reach its editor.
    pub fn detach_answered(&self) -> impl std::future::Future<Output = ()> + '_ {
        let mut left = Box::pin(self.shared.relay_left.notified());
        left.as_mut().enable();
        self.detach();
        async move {
            let _ = tokio::time::timeout(LEFT_WAIT, left).await;
        }
    }

    /// Stops the driver and runs the teardown ladder. Idempotent; returns once the tree is gone.
    pub async fn shut(&self) -> TeardownOutcome {
        self.shared.stop.cancel();
        self.teardown().await
    }

    /// Runs the teardown ladder with the provider's graces. Idempotent.
    pub async fn teardown(&self) -> TeardownOutcome {
        self.shared.teardown().await
    }

    /// Hands the child its owner's span: a run's prompts name it as their parent, the
    /// teardown is its last child, and it ends with the teardown. Returns the span it held
    /// before (a re-attached bridge session's previous one), for the caller to end.
    pub(crate) fn hold_span(&self, span: crate::otel::Span) -> Option<crate::otel::Span> {
        lock(&self.shared.span).replace(span)
    }

    /// Sets an attribute of the owner's span (a run's stop reason), when spans are exported.
    pub(crate) fn note_span(&self, key: &'static str, value: &str) {
        if crate::otel::exporting().is_some()
            && let Some(span) = lock(&self.shared.span).as_ref()
        {
            span.set(key, value.to_string());
        }
    }

    /// Resolves when the driver has ended; in relay mode, says why.
    pub async fn ended(&self) -> Option<RelayEnd> {
        self.shared.done.cancelled().await;
        lock(&self.shared.relay_end).clone()
    }

    /// Resolves when the child's leader has exited.
    pub async fn exited(&self) -> std::process::ExitStatus {
        self.shared.tree.exited().await
    }

    pub fn provider(&self) -> &Arc<ProviderConfig> {
        &self.shared.provider
    }

    /// The child's own session id (never shown to parents, who get a minted one).
    pub fn session_id(&self) -> &str {
        &self.shared.session_id
    }

    /// The child's `session/new` result: which optional methods it supports.
    pub fn session_reply(&self) -> &RawValue {
        &self.shared.session_reply
    }

    pub fn agent(&self) -> &AgentInfo {
        &self.shared.agent
    }

    pub fn pid(&self) -> i32 {
        self.shared.tree.pid()
    }

    /// What this child's sandbox lets it write (none: it is not sandboxed); a run started
    /// from inside its tree is held within it.
    pub fn confinement(&self) -> Option<Arc<supervise::Confinement>> {
        self.shared.tree.confinement()
    }

    pub fn stderr_tail(&self) -> Vec<String> {
        self.shared.stderr.snapshot()
    }

    /// This child's trace, when acpd traces (`trace_dir`).
    pub fn trace(&self) -> Option<&Arc<crate::trace::Trace>> {
        self.shared.trace.as_ref()
    }
}

impl Shared {
    /// Marks the owner's span failed, saying why (a load the agent refused), when spans are
    /// exported; the teardown still ends it.
    fn fail_span(&self, why: String) {
        if crate::otel::exporting().is_some()
            && let Some(span) = lock(&self.span).as_ref()
        {
            span.fail(why);
        }
    }

    async fn teardown(&self) -> TeardownOutcome {
        let out = self.out.clone();
        let graces = Graces {
            eof: self.provider.eof_grace,
            term: self.provider.term_grace,
        };
        let ladder = self.tree.teardown(move || out.close(), graces);
        let Some(owner) = crate::otel::exporting().and_then(|_| lock(&self.span).take()) else {
            return ladder.await;
        };
        let span = owner.child("acpd.teardown", Vec::new());
        let outcome = ladder.await;
        if let Some(span) = span {
            let step = match outcome {
                TeardownOutcome::Exited => "eof",
                TeardownOutcome::Terminated => "term",
                TeardownOutcome::Killed => "kill",
            };
            span.set("acpd.teardown.step", step);
            span.end();
        }
        owner.end();
        outcome
    }

    /// The `_meta` naming the owner's span, for the child's `session/prompt` in a run.
    fn span_meta(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        crate::otel::exporting()?;
        lock(&self.span).as_ref().map(crate::otel::Span::meta)
    }
}

/// ACP's "Session not found" (-32002), naming the id.
pub(crate) fn session_not_found(sid: &str) -> RpcError {
    RpcError::new(
        acpd_protocol::envelope::RESOURCE_NOT_FOUND,
        "Session not found",
    )
    .with_data(serde_json::json!({ "sessionId": sid }))
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
