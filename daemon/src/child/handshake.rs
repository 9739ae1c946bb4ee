//! The handshake's wire: `initialize` (protocol version 1 checked), `authenticate`, the
//! session-creating call, each one request read inline against the child's exit, the
//! `handshake_timeout` deadline and a cancel; and what a failed start logs before the child's
//! tree is torn down.

use std::time::Duration;

use acpd_protocol::acp::Implementation;
use acpd_protocol::envelope::{self, Id, Message, RpcError};
use acpd_protocol::subagent::{Category, Stage};
use agent_client_protocol::schema::ProtocolVersion;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cause::{self, Program};
use super::driver::ChildWire;
use super::{AgentInfo, ChildSpec, ClientCaps, StartFailure, failure};
use crate::supervise::{self, Graces, ProcessTree, StderrTail};
use crate::wire::sleep_until_opt;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeReply {
    protocol_version: serde_json::Value,
    #[serde(default)]
    agent_capabilities: serde_json::Value,
    #[serde(default)]
    auth_methods: Vec<serde_json::Value>,
    #[serde(default)]
    agent_info: serde_json::Value,
    #[serde(default, rename = "_meta")]
    meta: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSessionReply {
    session_id: String,
}

/// A spawned child before its driver starts.
pub(super) struct Handshake {
    pub(super) spec: ChildSpec,
    pub(super) tree: ProcessTree,
    pub(super) wire: ChildWire,
    pub(super) stderr: StderrTail,
    /// Notifications the child sent during the handshake.
    pub(super) early: Vec<(String, Option<Box<RawValue>>)>,
    /// What was started, to say why it ended before answering.
    pub(super) program: Option<Program>,
}

/// Handshake notifications kept for a bridge's parent, at most.
const EARLY: usize = 16;

/// Something that stopped us waiting for a handshake reply.
enum Interrupt {
    Rpc(RpcError),
    Exited(Option<std::process::ExitStatus>),
    Protocol(String),
    Timeout,
    Cancelled,
}

impl Handshake {
    pub(super) async fn teardown(&self) {
        let out = self.wire.out.clone();
        let graces = Graces {
            eof: self.spec.provider.eof_grace,
            term: self.spec.provider.term_grace,
        };
        self.tree.teardown(move || out.close(), graces).await;
    }

    pub(super) async fn initialize(
        &mut self,
        client_capabilities: &ClientCaps,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, StartFailure> {
        /// ACP's `InitializeRequest` with the capabilities as their text.
        #[derive(serde::Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Init<'a> {
            protocol_version: ProtocolVersion,
            client_capabilities: &'a RawValue,
            client_info: Implementation,
        }
        let init = Init {
            protocol_version: ProtocolVersion::V1,
            client_capabilities: client_capabilities.as_raw(),
            client_info: Implementation::new("acpd", env!("CARGO_PKG_VERSION")),
        };
        let raw = self
            .exchange(
                Stage::Initialize,
                "initialize",
                &envelope::to_raw(&init),
                deadline,
                cancel,
            )
            .await?;
        let reply: InitializeReply = serde_json::from_str(raw.get()).map_err(|e| {
            handshake_failure(
                Stage::Initialize,
                Category::Protocol,
                format!("bad initialize result: {e}"),
            )
        })?;
        if reply.protocol_version != serde_json::json!(1) {
            return Err(handshake_failure(
                Stage::Initialize,
                Category::ProtocolVersion,
                format!(
                    "child speaks ACP protocol version {}, acpd needs 1",
                    reply.protocol_version
                ),
            ));
        }
        Ok(AgentInfo {
            protocol_version: reply.protocol_version,
            agent_info: reply.agent_info,
            auth_method_ids: reply
                .auth_methods
                .iter()
                .filter_map(|m| m.get("id")?.as_str().map(str::to_string))
                .collect(),
            auth_methods: reply.auth_methods,
            meta: reply.meta,
            capabilities: reply.agent_capabilities,
        })
    }

    /// `authenticate {methodId}` with the provider's `auth_method`, when it names one the
    /// agent advertised; one it did not advertise fails the start, naming those it did.
    pub(super) async fn authenticate(
        &mut self,
        agent: &AgentInfo,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(), StartFailure> {
        let Some(method) = self.spec.provider.auth_method.clone() else {
            return Ok(());
        };
        if !agent.auth_method_ids.contains(&method) {
            return Err(StartFailure::AuthMethod {
                wanted: method,
                advertised: agent.auth_method_ids.clone(),
            });
        }
        let params = envelope::to_raw(&serde_json::json!({ "methodId": method }));
        self.exchange(Stage::Initialize, "authenticate", &params, deadline, cancel)
            .await
            .map(drop)
    }

    /// Logs a failed start and tears the child down: the cause at warn (what a daemon's
    /// operator needs), the child's stderr tail at debug only (it is the agent's, and long).
    pub(super) async fn fail(&self, e: StartFailure) -> StartFailure {
        let e = self.far_failure(e).await;
        let e = self.why_it_exited(e);
        let (provider, run) = (&self.spec.provider.name, &self.spec.run_id);
        match e.cause() {
            None => tracing::debug!(provider = %provider, run = %run, "child start {e}"),
            Some(cause) => {
                let advice = match e.failure().category {
                    // An ssh login refused (a far failure) is the host's keys, not the agent's.
                    Category::Auth if e.far().is_none() => {
                        let notes =
                            super::auth_notes(&self.spec.provider, e.advertised_auth_methods());
                        format!("; {}", notes.join("; "))
                    }
                    _ => String::new(),
                };
                tracing::warn!(target: super::FAILURE_LOG, provider = %provider, run = %run,
                    "child failed to start: {cause}{advice}");
                tracing::debug!(provider = %provider, run = %run,
                    stderr_tail = ?self.stderr.snapshot(), "the child's last stderr lines");
            }
        }
        self.teardown().await;
        e
    }

    /// A child that exited during `initialize`: when the file it ran is no program at all
    /// (an empty file, which `execvp` hands to `/bin/sh`), the detail says so.
    fn why_it_exited(&self, e: StartFailure) -> StartFailure {
        match e {
            StartFailure::Handshake { failure, detail }
                if failure.stage == Stage::Initialize
                    && failure.category == Category::ProcessExit =>
            {
                let detail = match self.program.as_ref().and_then(cause::exited_early) {
                    Some(why) => format!("{detail}: {why}"),
                    None => detail,
                };
                StartFailure::Handshake { failure, detail }
            }
            e => e,
        }
    }

    /// For a remote provider whose local ssh/launcher process ended before answering: what
    /// failed on the way (unreachable, auth refused, no acpd there). Anything else stays.
    async fn far_failure(&self, e: StartFailure) -> StartFailure {
        let StartFailure::Handshake { failure, .. } = &e else {
            return e;
        };
        if self.spec.provider.remote.is_none() || failure.category != Category::ProcessExit {
            return e;
        }
        // ssh's last words are what tell the failures apart.
        self.stderr.ended_within(Duration::from_millis(500)).await;
        match crate::remote::far_failure(&self.spec.provider, failure, &self.stderr.snapshot()) {
            Some((failure, target, far)) => StartFailure::Remote {
                failure,
                target,
                far,
            },
            None => e,
        }
    }

    pub(super) async fn create_session(
        &mut self,
        method: &str,
        params: &serde_json::Value,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(String, Box<RawValue>), StartFailure> {
        let raw = self
            .exchange(
                Stage::SessionNew,
                method,
                &envelope::to_raw(params),
                deadline,
                cancel,
            )
            .await?;
        let reply: NewSessionReply = serde_json::from_str(raw.get()).map_err(|e| {
            handshake_failure(
                Stage::SessionNew,
                Category::Protocol,
                format!("bad {method} result: {e}"),
            )
        })?;
        Ok((reply.session_id, raw))
    }

    /// Sends one handshake request and waits for its reply, the child's exit, the deadline or
    /// a cancel.
    pub(super) async fn exchange(
        &mut self,
        stage: Stage,
        method: &str,
        params: &RawValue,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Box<RawValue>, StartFailure> {
        let interrupt = match self.wire.request(method, Some(params)).await {
            Ok(id) => match self.await_reply(id, deadline, cancel).await {
                Ok(raw) => return Ok(raw),
                Err(i) => i,
            },
            Err(_) => Interrupt::Exited(self.exit_status_soon().await),
        };
        Err(match interrupt {
            Interrupt::Cancelled => StartFailure::Cancelled { stage },
            Interrupt::Rpc(error) => StartFailure::Refused {
                stage,
                method: method.to_string(),
                error: Box::new(error),
                advertised: Vec::new(),
            },
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
            Interrupt::Protocol(detail) => handshake_failure(stage, Category::Protocol, detail),
            Interrupt::Timeout => handshake_failure(
                stage,
                Category::Timeout,
                format!("no answer to {method} within handshake_timeout"),
            ),
        })
    }

    async fn await_reply(
        &mut self,
        want: Id,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<Box<RawValue>, Interrupt> {
        let mut exited: Option<(std::process::ExitStatus, Instant)> = None;
        loop {
            let last_words = exited.map(|(_, t)| t);
            tokio::select! {
                biased;
                frame = self.wire.reader.next() => match frame {
                    None => {
                        let status = match exited {
                            Some((s, _)) => Some(s),
                            None => self.exit_status_soon().await,
                        };
                        return Err(Interrupt::Exited(status));
                    }
                    Some(Err(fault)) => return Err(Interrupt::Protocol(fault.to_string())),
                    Some(Ok(Message::Response { id, outcome })) if id.as_ref() == Some(&want) => {
                        return outcome.map_err(Interrupt::Rpc);
                    }
                    Some(Ok(Message::Response { .. })) => {}
                    Some(Ok(Message::Request { id, method, .. })) => {
                        let _ = self
                            .wire
                            .respond(&id, Err(&RpcError::method_not_found(&method)))
                            .await;
                    }
                    Some(Ok(Message::Notification { method, params })) => {
                        // Kept for a bridge's parent (e.g. an agent's `_auth/status_update`
                        // during `session/new`), a few at most.
                        if self.spec.relay && self.early.len() < EARLY && super::strict::forwardable(&method) {
                            self.early.push((method, params));
                        }
                    }
                },
                status = self.tree.exited(), if exited.is_none() => {
                    // Its answer may already be in the pipe.
                    exited = Some((status, Instant::now() + super::driver::LAST_WORDS));
                }
                _ = sleep_until_opt(last_words) => {
                    return Err(Interrupt::Exited(exited.map(|(s, _)| s)));
                }
                _ = tokio::time::sleep_until(deadline) => return Err(Interrupt::Timeout),
                _ = cancel.cancelled() => return Err(Interrupt::Cancelled),
            }
        }
    }

    /// The child's exit status if it exits within a second (its output closed, so it most
    /// likely is exiting); `None` if it keeps running with its output closed.
    async fn exit_status_soon(&self) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(Duration::from_secs(1), self.tree.exited())
            .await
            .ok()
    }
}

pub(super) fn handshake_failure(stage: Stage, category: Category, detail: String) -> StartFailure {
    StartFailure::Handshake {
        failure: failure(stage, category),
        detail,
    }
}
