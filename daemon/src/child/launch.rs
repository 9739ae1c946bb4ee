//! Spawn and handshake: `initialize` (protocol version 1 checked), `authenticate` with the
//! provider's `auth_method` when it names one, then `session/new` ([`super::handshake`] has
//! the wire). The handshake reads the child inline, like the driver after it; requests the
//! child makes meanwhile are refused and notifications dropped. Anything that goes wrong tears
//! the child down before the failure is returned, and is logged with its cause.

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::ClientCapabilities;
use acpd_protocol::envelope;
use acpd_protocol::outcome::air;
use acpd_protocol::subagent::{Category, Stage};
use serde_json::value::RawValue;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cause::{self, Program};
use super::driver::{ChildWire, Driver};
use super::handshake::{Handshake, handshake_failure};
use super::{AgentInfo, Child, ChildSpec, ClientCaps, Shared, StartFailure};
use crate::config::ProviderConfig;
use crate::supervise::{self, Graces, ProcessTree, SpawnError, StderrTail};
use crate::trace::Hop;
use crate::wire::{LineReader, Outbox};

pub(super) async fn start(
    spec: ChildSpec,
    client_capabilities: ClientCapabilities,
    cancel: &CancellationToken,
) -> Result<Child, StartFailure> {
    let open = Open::Create {
        method: "session/new",
        params: spec.session.new_session_params(&spec.cwd),
    };
    let client_capabilities = if spec.relay {
        ClientCaps::typed(&client_capabilities)
    } else {
        collect_capabilities(client_capabilities)
    };
    initialize(spec, client_capabilities, cancel)
        .await?
        .open(open, cancel)
        .await
}

/// A run's child has acpd itself as its client, which reads typed failure records: it opts
/// in to AIR's `sessionFailure` (an agent that knows it then ends a failed turn with a record
/// instead of a bare error, or a bare `end_turn`). A bridge session's child is never opted in
/// behind its editor's back: the agent would then answer a failed prompt with `end_turn`, which
/// an editor that does not read AIR records shows as success.
fn collect_capabilities(mut caps: ClientCapabilities) -> ClientCaps {
    air::declare(caps.meta.get_or_insert_with(Default::default));
    ClientCaps::typed(&caps)
}

/// Spawns the child, runs `initialize`, and `authenticate` with the provider's `auth_method`
/// when it names one. On failure the child's whole tree is gone.
pub(crate) async fn initialize(
    spec: ChildSpec,
    client_capabilities: ClientCaps,
    cancel: &CancellationToken,
) -> Result<Initialized, StartFailure> {
    let client_capabilities = if spec.sandbox.is_some() {
        client_capabilities.without_terminal()
    } else {
        client_capabilities
    };
    let h = spawn(spec).await?;
    Initialized::handshake(h, &client_capabilities, Auth::Configured, cancel).await
}

/// Whether a handshake authenticates with the provider's `auth_method`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Auth {
    Configured,
    /// A probe only learns what the agent says about itself.
    Skip,
}

/// How a child's session comes to be.
pub enum Open {
    /// `method` (`session/new`, `session/fork`) is sent now with `params`; the child's session
    /// id is the one its answer names.
    Create {
        method: &'static str,
        params: serde_json::Value,
    },
    /// A session the agent already has: the relay's first call (`session/load` or
    /// `session/resume`, the parent's own) makes it live, so a replay reaches the parent.
    Existing { child_session_id: String },
    /// A session this child made earlier with [`Initialized::create`] (a warm spare's, made
    /// for the cwd and params the editor now asks for): nothing is sent, its answer is the
    /// editor's.
    Made {
        session_id: String,
        reply: Box<RawValue>,
    },
}

/// A spawned child that answered `initialize` and has no session yet: a warm spare, a child
/// asked one question (`session/list`, `session/delete`, `authenticate`), or a bridge about to
/// open or load its session.
pub struct Initialized {
    h: Handshake,
    agent: AgentInfo,
    /// When `initialize` was answered (a spare's age). tokio's clock, so the pool's
    /// `warm_max_age` can be tested on paused time; the same instant as `std`'s otherwise.
    pub ready_at: Instant,
    /// Tears the child down if this is dropped unused (an owner that returned early).
    guard: DropGuard,
}

/// Runs the teardown ladder in the background when dropped armed: a child nobody opened or
/// closed never outlives its owner.
struct DropGuard {
    armed: Option<(ProcessTree, Outbox, Graces)>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        let Some((tree, out, graces)) = self.armed.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { tree.teardown(move || out.close(), graces).await });
        }
    }
}

impl Initialized {
    async fn handshake(
        mut h: Handshake,
        client_capabilities: &ClientCaps,
        auth: Auth,
        cancel: &CancellationToken,
    ) -> Result<Initialized, StartFailure> {
        let deadline = crate::config::durations::deadline(h.spec.provider.handshake_timeout);
        let agent = match h.initialize(client_capabilities, deadline, cancel).await {
            Ok(agent) if auth == Auth::Configured => {
                match h.authenticate(&agent, deadline, cancel).await {
                    Ok(()) => Ok(agent),
                    Err(e) => Err(e.with_advertised(&agent)),
                }
            }
            other => other,
        };
        match agent {
            Ok(agent) => {
                let graces = Graces {
                    eof: h.spec.provider.eof_grace,
                    term: h.spec.provider.term_grace,
                };
                let guard = DropGuard {
                    armed: Some((h.tree.clone(), h.wire.out.clone(), graces)),
                };
                Ok(Initialized {
                    h,
                    agent,
                    ready_at: Instant::now(),
                    guard,
                })
            }
            Err(e) => Err(h.fail(e).await),
        }
    }

    pub fn agent(&self) -> &AgentInfo {
        &self.agent
    }

    pub fn provider(&self) -> &Arc<ProviderConfig> {
        &self.h.spec.provider
    }

    /// False once the child's leader has exited (a spare that died waiting).
    pub fn alive(&self) -> bool {
        self.h.tree.exit_status().is_none()
    }

    pub fn pid(&self) -> i32 {
        self.h.tree.pid()
    }

    /// The directory the child's process was started in (some agents, gemini-cli among
    /// them, find a session by it rather than by the `cwd` a request names).
    pub fn cwd(&self) -> &std::path::Path {
        &self.h.spec.cwd
    }

    /// One request and its answer, before any session: `authenticate`, `session/list`,
    /// `session/delete`. The child's own error comes back as [`StartFailure::Refused`]; a
    /// child that dies, hangs past `handshake_timeout` or breaks the protocol is torn down.
    pub async fn call(
        &mut self,
        method: &str,
        params: &RawValue,
        cancel: &CancellationToken,
    ) -> Result<Box<RawValue>, StartFailure> {
        let deadline = crate::config::durations::deadline(self.h.spec.provider.handshake_timeout);
        match self
            .h
            .exchange(Stage::SessionNew, method, params, deadline, cancel)
            .await
        {
            Ok(raw) => Ok(raw),
            Err(e @ StartFailure::Refused { .. }) => Err(e.with_advertised(&self.agent)),
            Err(e) => {
                self.h.teardown().await;
                Err(e)
            }
        }
    }

    /// Makes a session ahead (`session/new` on a warm spare) without starting the driver:
    /// [`Open::Made`] hands it over later. Failures as in [`Initialized::call`].
    pub async fn create(
        &mut self,
        method: &str,
        params: &serde_json::Value,
        cancel: &CancellationToken,
    ) -> Result<(String, Box<RawValue>), StartFailure> {
        let deadline = crate::config::durations::deadline(self.h.spec.provider.handshake_timeout);
        match self
            .h
            .create_session(method, params, deadline, cancel)
            .await
        {
            Ok(made) => Ok(made),
            Err(e @ StartFailure::Refused { .. }) => Err(e.with_advertised(&self.agent)),
            Err(e) => {
                self.h.teardown().await;
                Err(e)
            }
        }
    }

    /// Runs the teardown ladder.
    pub async fn close(mut self) {
        self.guard.armed = None;
        self.h.teardown().await;
    }

    /// Opens the child's session and starts its driver. On failure the child is gone.
    pub async fn open(
        mut self,
        open: Open,
        cancel: &CancellationToken,
    ) -> Result<Child, StartFailure> {
        // From here the child is torn down on failure, or owned by its driver.
        self.guard.armed = None;
        let deadline = crate::config::durations::deadline(self.h.spec.provider.handshake_timeout);
        let (session_id, session_reply) = match open {
            Open::Create { method, params } => {
                match self
                    .h
                    .create_session(method, &params, deadline, cancel)
                    .await
                {
                    Ok(r) => r,
                    Err(e) => return Err(self.h.fail(e.with_advertised(&self.agent)).await),
                }
            }
            Open::Existing { child_session_id } => {
                (child_session_id, envelope::to_raw(&serde_json::json!({})))
            }
            Open::Made { session_id, reply } => (session_id, reply),
        };
        let h = self.h;
        let (tx, rx) = super::queue::CmdTx::channel();
        let shared = Arc::new(Shared {
            provider: h.spec.provider.clone(),
            relay_child: h.spec.relay,
            log_id: h.spec.run_id.clone(),
            session_id,
            session_reply,
            agent: self.agent,
            tree: h.tree,
            out: h.wire.out.clone(),
            stderr: h.stderr,
            late_cancel: std::sync::Mutex::new(None),
            drops: Default::default(),
            relay_cancel: Notify::new(),
            relay_detach: Notify::new(),
            relay_left: Notify::new(),
            stop: CancellationToken::new(),
            done: CancellationToken::new(),
            relay_end: std::sync::Mutex::new(None),
            early: std::sync::Mutex::new(h.early),
            trace: h.spec.trace.clone(),
            span: std::sync::Mutex::new(None),
        });
        tokio::spawn(Driver::new(shared.clone(), h.wire, rx).run());
        Ok(Child { cmds: tx, shared })
    }
}

/// Spawns the child, runs `initialize` only, and tears it down: what the agent says about
/// itself, learned before a run's own child is spawned.
pub(crate) async fn probe(
    spec: ChildSpec,
    cancel: &CancellationToken,
) -> Result<AgentInfo, StartFailure> {
    let h = spawn(spec).await?;
    let ready = Initialized::handshake(h, &ClientCaps::default(), Auth::Skip, cancel).await?;
    let agent = ready.agent.clone();
    ready.close().await;
    Ok(agent)
}

async fn spawn(spec: ChildSpec) -> Result<Handshake, StartFailure> {
    let provider = &spec.provider;
    // Read at every spawn, so a rotated key needs no reload; an unusable file fails the start
    // with its path and the reason, never a value.
    let (env, secrets) = match &provider.env_file {
        Some(file) => {
            let secrets = file.read().inspect_err(
                |e| tracing::warn!(target: super::FAILURE_LOG, provider = %provider.name, "{e}"),
            )?;
            (secrets.over(&spec.env), Some((file, secrets)))
        }
        None => (spec.env.clone(), None),
    };
    // Behind ssh or a launcher the local process is that tool, and the command, its env and
    // cwd go to `acpd supervise` on the far side in the setup line, before any ACP.
    let (local, setup) = crate::remote::spawn_spec(provider, &spec.cwd, &env);
    // Limits are a local cgroup's: a remote provider's local process is only its ssh or
    // launcher (the far side has its own).
    let limits = match provider.remote {
        None => provider.child_limits(),
        Some(_) => Default::default(),
    };
    // Behind ssh or a launcher the program that failed is that tool, started locally.
    // A PATH the env_file gave is named by the file, never shown (its values appear nowhere).
    let program = local.argv.first().map(|argv0| {
        let program = Program::of(argv0, &local.env, &local.cwd);
        match (&secrets, &program.path_var) {
            (Some((file, secrets)), Some(path)) if secrets.gives("PATH", path) => {
                program.with_path_from(file.to_string())
            }
            _ => program,
        }
    });
    let mut spawned = match supervise::spawn_sandboxed(local, limits, spec.sandbox.clone()).await {
        Ok(spawned) => spawned,
        Err(error) => return Err(spawn_failed(&spec, program.as_ref(), error)),
    };
    if let Some(line) = setup {
        // A few hundred bytes into an empty pipe; a write that fails means the launcher is
        // already gone, which the handshake then reports with its exit status.
        let written =
            tokio::time::timeout(provider.handshake_timeout, spawned.stdin.write_all(&line)).await;
        if written.is_err() {
            let stdin = spawned.stdin;
            let now = Graces {
                eof: Duration::ZERO,
                term: Duration::ZERO,
            };
            spawned.tree.teardown(move || drop(stdin), now).await;
            return Err(handshake_failure(
                Stage::Spawn,
                Category::Timeout,
                "the launcher did not take the setup line within handshake_timeout".into(),
            ));
        }
    }
    let stderr = StderrTail::drain(
        spawned.stderr,
        format!("{}/{}", spec.provider.name, spec.run_id),
        spec.trace.clone(),
    );
    let tap = |hop| spec.trace.clone().map(|t| (t, hop));
    let wire = ChildWire::new(
        LineReader::<super::driver::ChildOutput>::new(Box::new(spawned.stdout), spec.limits)
            .traced(tap(Hop::ChildToAcpd)),
        Outbox::start(spawned.stdin, spec.limits.write_timeout).traced(tap(Hop::AcpdToChild)),
    );
    Ok(Handshake {
        spec,
        tree: spawned.tree,
        wire,
        stderr,
        early: Vec::new(),
        program,
    })
}

/// A spawn that failed, with its cause in words, logged (nothing was started, so nothing is
/// torn down).
fn spawn_failed(spec: &ChildSpec, program: Option<&Program>, error: SpawnError) -> StartFailure {
    let cause = match (&error, program) {
        (SpawnError::Io { source, .. }, Some(program)) => cause::spawn_failed(program, source),
        _ => error.to_string(),
    };
    tracing::warn!(target: super::FAILURE_LOG, provider = %spec.provider.name, run = %spec.run_id,
        "child failed to start: {cause}");
    StartFailure::Spawn { error, cause }
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
    let open = Open::Create {
        method: "session/new",
        params: spec.session.new_session_params(&spec.cwd),
    };
    initialize_over(spec, spawned, output, input)
        .await?
        .open(open, &CancellationToken::new())
        .await
}

/// As [`start_over`], stopping after `initialize`: a warm spare, for the pool's tests.
#[cfg(test)]
pub(super) async fn initialize_over(
    spec: ChildSpec,
    spawned: supervise::Spawned,
    output: super::driver::ChildOutput,
    input: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
) -> Result<Initialized, StartFailure> {
    let stderr = StderrTail::drain(spawned.stderr, spec.run_id.clone(), None);
    let wire = ChildWire::new(
        LineReader::new(output, spec.limits),
        Outbox::start(input, spec.limits.write_timeout),
    );
    let h = Handshake {
        spec,
        tree: spawned.tree,
        wire,
        stderr,
        early: Vec::new(),
        program: None,
    };
    let caps = collect_capabilities(ClientCapabilities::default());
    Initialized::handshake(h, &caps, Auth::Configured, &CancellationToken::new()).await
}
