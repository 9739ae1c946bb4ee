//! Spawn and handshake: `initialize` (protocol version 1 checked), then `session/new`. The
//! handshake reads the child inline, like the driver after it; requests the child makes
//! meanwhile are refused and notifications dropped. Anything that goes wrong tears the child
//! down before the failure is returned.

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::{ClientCapabilities, Implementation, InitializeRequest};
use acpd_protocol::envelope::{self, AUTH_REQUIRED, Id, Message, RpcError};
use acpd_protocol::subagent::{Category, Stage};
use agent_client_protocol::schema::ProtocolVersion;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::driver::{ChildWire, Driver};
use super::{AgentInfo, CMD_DEPTH, Child, ChildSpec, Shared, StartFailure, failure};
use crate::supervise::{self, Graces, ProcessTree, SpawnSpec, StderrTail};
use crate::wire::{LineReader, Outbox, sleep_until_opt};

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

/// A spawned child before its driver starts.
struct Handshake {
    spec: ChildSpec,
    tree: ProcessTree,
    wire: ChildWire,
    stderr: StderrTail,
}

pub(super) async fn start(
    spec: ChildSpec,
    client_capabilities: ClientCapabilities,
    cancel: &CancellationToken,
) -> Result<Child, StartFailure> {
    let h = spawn(spec).await?;
    handshake(h, client_capabilities, cancel).await
}

/// Runs the handshake on a spawned child, then starts its driver.
async fn handshake(
    mut h: Handshake,
    client_capabilities: ClientCapabilities,
    cancel: &CancellationToken,
) -> Result<Child, StartFailure> {
    let deadline = Instant::now() + h.spec.provider.handshake_timeout;
    let result = async {
        let agent = h.initialize(client_capabilities, deadline, cancel).await?;
        let (session_id, reply) = h.new_session(deadline, cancel).await?;
        Ok((agent, session_id, reply))
    }
    .await;
    let (agent, session_id, session_reply) = match result {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(
                provider = %h.spec.provider.name, run = %h.spec.run_id,
                stderr_tail = ?h.stderr.snapshot(), "child failed to start: {e}"
            );
            h.teardown().await;
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::channel(CMD_DEPTH);
    let shared = Arc::new(Shared {
        provider: h.spec.provider.clone(),
        relay_child: h.spec.relay,
        log_id: h.spec.run_id.clone(),
        session_id,
        session_reply,
        agent,
        tree: h.tree,
        out: h.wire.out.clone(),
        stderr: h.stderr,
        relay_cancel: Notify::new(),
        stop: CancellationToken::new(),
        done: CancellationToken::new(),
        relay_end: std::sync::Mutex::new(None),
    });
    tokio::spawn(Driver::new(shared.clone(), h.wire, rx).run());
    Ok(Child { cmds: tx, shared })
}

/// Spawns the child, runs `initialize` only, and tears it down: what the agent says about
/// itself, learned before a run's own child is spawned.
pub async fn probe(spec: ChildSpec, cancel: &CancellationToken) -> Result<AgentInfo, StartFailure> {
    let mut h = spawn(spec).await?;
    let deadline = Instant::now() + h.spec.provider.handshake_timeout;
    let result = h
        .initialize(ClientCapabilities::default(), deadline, cancel)
        .await;
    h.teardown().await;
    result
}

async fn spawn(spec: ChildSpec) -> Result<Handshake, StartFailure> {
    let spawned = supervise::spawn(SpawnSpec {
        argv: spec.provider.command.clone(),
        cwd: spec.cwd.clone(),
        env: spec.env.clone(),
    })
    .await?;
    let stderr = StderrTail::drain(
        spawned.stderr,
        format!("{}/{}", spec.provider.name, spec.run_id),
    );
    let wire = ChildWire::new(
        LineReader::new(Box::new(spawned.stdout), spec.limits),
        Outbox::start(spawned.stdin, spec.limits.write_timeout),
    );
    Ok(Handshake {
        spec,
        tree: spawned.tree,
        wire,
        stderr,
    })
}

/// A child whose ACP wire is `output`/`input` instead of its own stdio: the in-process tests
/// script the agent on a duplex pipe while a real process stands for the tree.
#[cfg(test)]
pub(super) async fn start_over(
    spec: ChildSpec,
    spawned: supervise::Spawned,
    output: super::driver::ChildOutput,
    input: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
) -> Result<Child, StartFailure> {
    let stderr = StderrTail::drain(spawned.stderr, spec.run_id.clone());
    let wire = ChildWire::new(
        LineReader::new(output, spec.limits),
        Outbox::start(input, spec.limits.write_timeout),
    );
    let h = Handshake {
        spec,
        tree: spawned.tree,
        wire,
        stderr,
    };
    handshake(h, ClientCapabilities::default(), &CancellationToken::new()).await
}

/// Something that stopped us waiting for a handshake reply.
enum Interrupt {
    Rpc(RpcError),
    Exited(Option<std::process::ExitStatus>),
    Protocol(String),
    Timeout,
    Cancelled,
}

impl Handshake {
    async fn teardown(&self) {
        let out = self.wire.out.clone();
        let graces = Graces {
            eof: self.spec.provider.eof_grace,
            term: self.spec.provider.term_grace,
        };
        self.tree.teardown(move || out.close(), graces).await;
    }

    async fn initialize(
        &mut self,
        client_capabilities: ClientCapabilities,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, StartFailure> {
        let init = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(client_capabilities)
            .client_info(Implementation::new("acpd", env!("CARGO_PKG_VERSION")));
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
            auth_method_ids: reply.auth_methods.into_iter().map(|m| m.id).collect(),
            capabilities: reply.agent_capabilities,
        })
    }

    async fn new_session(
        &mut self,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<(String, Box<RawValue>), StartFailure> {
        let mut new = serde_json::json!({ "cwd": self.spec.cwd, "mcpServers": [] });
        if let Some(servers) = &self.spec.session.mcp_servers
            && let Ok(servers) = serde_json::from_str::<serde_json::Value>(servers.get())
        {
            new["mcpServers"] = servers;
        }
        if let Some(prompt) = &self.spec.session.system_prompt {
            new["systemPrompt"] = serde_json::json!({
                "mode": "append",
                "content": [{ "type": "text", "text": prompt }],
            });
        }
        let raw = self
            .exchange(
                Stage::SessionNew,
                "session/new",
                &envelope::to_raw(&new),
                deadline,
                cancel,
            )
            .await?;
        let reply: NewSessionReply = serde_json::from_str(raw.get()).map_err(|e| {
            handshake_failure(
                Stage::SessionNew,
                Category::Protocol,
                format!("bad session/new result: {e}"),
            )
        })?;
        Ok((reply.session_id, raw))
    }

    /// Sends one handshake request and waits for its reply, the child's exit, the deadline or
    /// a cancel.
    async fn exchange(
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
                    Some(Ok(Message::Notification { .. })) => {}
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

fn handshake_failure(stage: Stage, category: Category, detail: String) -> StartFailure {
    StartFailure::Handshake {
        failure: failure(stage, category),
        detail,
    }
}
