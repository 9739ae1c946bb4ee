//! The subagent registry: named providers, the start-time gate (provider, capabilities, depth,
//! cwd, capacity — all checked before anything is spawned), the run table, and run ids.
//! Everything after publication lives in [`run`].

mod bridge;
mod error;
mod events;
mod gate;
mod limits;
mod nest;
mod run;
mod schema;
#[cfg(test)]
mod tests;
mod warm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use acpd_protocol::acp::ClientCapabilities;
use acpd_protocol::subagent::{ProviderInfo, StartRequest, Started, SubagentResult};
use tokio::sync::{OnceCell, mpsc};
use tokio_util::sync::CancellationToken;

use crate::child::{self, AgentInfo, Child, ChildSpec, SessionParams};
use crate::config::{Config, ProviderConfig};
pub use limits::Slot;
use schema::OutputSchema;

pub use bridge::{BridgeRequest, Ready, advertises};
pub use error::RegistryError;
pub use events::RunEvent;
pub use gate::{DepthContext, auth_env_names};
use gate::{capabilities, check_capabilities, resolve_cwd, start_failed, takes_system_prompt};
pub use nest::{Lineage, Nest, Origin, Parent, Tree};
pub use run::{Run, RunState};

/// Who started a run; only its owner may wait on, cancel, send to or dispose it.
pub type Owner = u64;

/// How many disposed run ids are remembered.
const TOMBSTONES: usize = 4096;

/// Everything a start needs besides the request itself.
#[derive(Default)]
pub struct StartOptions {
    pub request: StartRequest,
    /// The caller's working directory (`acpd run`, `acpd stdio`); `None` over a socket.
    pub caller_cwd: Option<PathBuf>,
    /// Overrides the provider's `run_timeout`.
    pub run_timeout: Option<Duration>,
    pub client_capabilities: ClientCapabilities,
    pub owner: Owner,
    /// Receives the `started`/`ended` pair of every turn without loss, and the traffic the
    /// flags below ask for, in order.
    pub events: Option<mpsc::Sender<RunEvent>>,
    /// Send the child's raw `session/update`s on `events`.
    pub forward_updates: bool,
    /// Send permission requests on `events` (policy `forward`); else nobody can answer them.
    pub forward_permissions: bool,
    /// Receives output text as it streams.
    pub sink: Option<mpsc::Sender<String>>,
    /// Abandons the start before publication.
    pub cancel: CancellationToken,
    /// A run id minted by the caller, so it can file the run before its first event.
    pub run_id: Option<String>,
    /// The run or bridge session whose child asked for this run (see [`nest`]): the run is
    /// one level deeper than that child, and goes with it.
    pub nest: Option<Nest>,
    /// The uid of the user asking (see [`Run::uid`]); a nested run takes its parent run's.
    pub uid: Option<u32>,
}

/// A started child with its claim on the limits (released when the slot is dropped).
pub struct Launched {
    pub child: Child,
    pub slot: Slot,
    pub provider: Arc<ProviderConfig>,
    pub depth: u32,
    pub max_depth: u32,
}

struct Launch<'a> {
    log_id: &'a str,
    max_depth: Option<u32>,
    /// The depth and depth limit of the child that asked for this one, when nested.
    nested_in: Option<(u32, u32)>,
    cwd: Option<&'a Path>,
    caller_cwd: Option<&'a Path>,
    session: SessionParams,
    client_capabilities: ClientCapabilities,
    cancel: &'a CancellationToken,
}

/// Why a probe found nothing: the gate refused it, or the agent did not start (with the
/// spawn's own detail, for the operator's terminal).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Gate(#[from] RegistryError),
    #[error(transparent)]
    Start(#[from] child::StartFailure),
}

/// A run that passed the publication boundary.
#[derive(Debug, Clone)]
pub struct Published {
    pub run_id: String,
    pub session_id: String,
}

#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    config: RwLock<Arc<Config>>,
    depth: DepthContext,
    table: Mutex<Table>,
    /// Woken whenever a slot is released, for starts queued by `queue_timeout`.
    freed: tokio::sync::Notify,
    /// How many starts wait for a slot right now.
    queued: std::sync::atomic::AtomicUsize,
    /// What each provider's agent said in `initialize`, learned once by a probe.
    /// Only successes are kept: a probe that failed (a cancel, a slow start) is tried again.
    probes: Mutex<HashMap<String, Arc<OnceCell<AgentInfo>>>>,
    /// Warm spares per provider, and the token that stops keeping them.
    pool: Mutex<warm::Pool>,
    warm_stop: Mutex<Option<CancellationToken>>,
    /// This acpd's socket, offered to children that may delegate (`offer_delegation`).
    offer_socket: RwLock<Option<PathBuf>>,
}

#[derive(Default)]
struct Table {
    runs: HashMap<String, Arc<Run>>,
    /// Disposed runs, by id: their owner only (no output), oldest first, at most
    /// [`TOMBSTONES`], so a late `wait` or `dispose` gets a clear answer.
    tombstones: HashMap<String, Owner>,
    tombstone_order: std::collections::VecDeque<String>,
    live_by_provider: HashMap<String, usize>,
    live_total: usize,
}

/// A trace for the child of run or session `id`, when acpd traces (`trace_dir`).
fn trace_for(config: &Config, id: &str) -> Option<Arc<crate::trace::Trace>> {
    crate::trace::Trace::start(config.trace_dir.as_deref()?, id)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    pub fn new(config: Config, depth: DepthContext) -> Self {
        Registry {
            inner: Arc::new(Inner {
                config: RwLock::new(Arc::new(config)),
                depth,
                table: Mutex::new(Table::default()),
                probes: Mutex::new(HashMap::new()),
                pool: Mutex::default(),
                warm_stop: Mutex::new(None),
                offer_socket: RwLock::new(None),
                freed: tokio::sync::Notify::new(),
                queued: Default::default(),
            }),
        }
    }

    pub fn config(&self) -> Arc<Config> {
        self.inner
            .config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Swaps in a new config: new starts use it, running runs keep their provider.
    pub fn reload(&self, config: Config) {
        *self.inner.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        lock(&self.inner.probes).clear();
    }

    pub fn providers(&self) -> Vec<ProviderInfo> {
        let config = self.config();
        config
            .providers
            .values()
            .map(|p| ProviderInfo {
                name: p.name.clone(),
                description: p.description.clone(),
                capabilities: capabilities(self.cached_persona(&p.name)),
                inherits_parent_context: false,
                default: p.name == config.default_provider,
            })
            .collect()
    }

    /// Validates, spawns, handshakes and publishes a run; its first turn starts at once.
    pub async fn start(&self, opts: StartOptions) -> Result<Published, RegistryError> {
        let config = self.config();
        let req = &opts.request;
        let provider = self.provider(&config, req.provider.as_deref())?;
        check_capabilities(&provider, req)?;
        if req.persona.is_some() {
            let cwd = resolve_cwd(&provider, req.cwd.as_deref(), opts.caller_cwd.as_deref())?;
            if !self.probe_persona(&provider, &cwd, &opts.cancel).await {
                return Err(RegistryError::UnsupportedCapability {
                    provider: provider.name.clone(),
                    capability: "persona",
                });
            }
        }
        let schema = match &req.output_schema {
            Some(s) => Some(Arc::new(OutputSchema::compile(s)?)),
            None => None,
        };
        let run_id = opts
            .run_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let launched = self
            .launch(
                &config,
                provider,
                Launch {
                    log_id: &run_id,
                    max_depth: req.max_depth,
                    nested_in: opts.nest.as_ref().map(|n| (n.depth, n.max_depth)),
                    cwd: req.cwd.as_deref(),
                    caller_cwd: opts.caller_cwd.as_deref(),
                    session: SessionParams {
                        mcp_servers: None,
                        system_prompt: req.persona.clone(),
                    },
                    client_capabilities: opts.client_capabilities.clone(),
                    cancel: &opts.cancel,
                },
            )
            .await?;
        let Launched {
            child,
            slot,
            provider,
            depth,
            max_depth,
        } = launched;

        let session_id = format!("sub-{}", uuid::Uuid::new_v4());
        let run = Run::new(run::RunInit {
            run_id: run_id.clone(),
            owner: opts.owner,
            provider,
            label: req.label.clone(),
            session_id: session_id.clone(),
            depth,
            max_depth,
            run_timeout: opts.run_timeout,
            max_output: config.max_output,
            events: opts.events,
            forward_updates: opts.forward_updates,
            forward_permissions: opts.forward_permissions,
            sink: opts.sink,
            schema,
            uid: match opts.nest.as_ref().map(|n| &n.parent) {
                Some(Parent::Run(parent)) => lock(&self.inner.table)
                    .runs
                    .get(parent)
                    .map_or(opts.uid, |p| p.uid),
                _ => opts.uid,
            },
            parent: opts.nest.map(|n| n.parent),
        });
        {
            // Checked under the table lock: an owner that is going away cancels first and
            // then collects its runs under this lock, so a run is either seen or never filed.
            let mut table = lock(&self.inner.table);
            if opts.cancel.is_cancelled() {
                drop(table);
                child.teardown().await;
                return Err(RegistryError::StartCancelled {
                    provider: run.provider.name.clone(),
                });
            }
            table.runs.insert(run_id.clone(), run.clone());
        }
        if let Some(events) = &run.events {
            let started = Started {
                run_id: run_id.clone(),
                provider: run.provider.name.clone(),
                turn: 1,
                session_id: session_id.clone(),
                label: run.label.clone(),
            };
            let _ = events.send(RunEvent::Started(started)).await;
        }
        run.begin_turn(child, slot, opts.request.prompt);
        Ok(Published { run_id, session_id })
    }

    /// Whether a probe found the provider's agent taking a `systemPrompt`; false if not probed.
    fn cached_persona(&self, provider: &str) -> bool {
        lock(&self.inner.probes)
            .get(provider)
            .and_then(|cell| cell.get().cloned())
            .is_some_and(|agent| takes_system_prompt(&agent))
    }

    /// Probes the provider once (spawn, `initialize`, teardown) and caches what it said.
    async fn probe_persona(
        &self,
        provider: &Arc<ProviderConfig>,
        cwd: &Path,
        cancel: &CancellationToken,
    ) -> bool {
        let cell = lock(&self.inner.probes)
            .entry(provider.name.clone())
            .or_default()
            .clone();
        let agent = cell
            .get_or_try_init(|| async {
                self.probe(&provider.name, Some(cwd), cancel)
                    .await
                    .inspect_err(|e| {
                        tracing::warn!(provider = %provider.name, "capability probe failed: {e}");
                    })
            })
            .await;
        agent.is_ok_and(takes_system_prompt)
    }

    /// Spawns the provider's agent (in the provider's `cwd`, else `cwd`), runs `initialize`
    /// only and tears it down: what the agent says about itself. Goes through the same gate as a start (depth, cwd, capacity), so a
    /// probe counts against the limits while it lives.
    pub async fn probe(
        &self,
        provider: &str,
        cwd: Option<&Path>,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, ProbeError> {
        let config = self.config();
        let provider = self.provider(&config, Some(provider))?;
        let (depth, max_depth) = self.check_depth(&config, None)?;
        let home = bridge::home();
        let cwd = resolve_cwd(&provider, None, Some(cwd.unwrap_or(&home)))?;
        let provider = crate::catalog::resolve_provider(&config, provider, cancel)
            .await
            .map_err(RegistryError::from)?;
        let _slot = self.claim(&config, &provider, cancel).await?;
        let spec = ChildSpec {
            limits: config.wire_limits(),
            ..ChildSpec::new(
                provider.clone(),
                format!("probe-{}", provider.name),
                cwd,
                depth,
                max_depth,
            )
        };
        Ok(child::probe(spec, cancel).await?)
    }

    fn provider(
        &self,
        config: &Config,
        name: Option<&str>,
    ) -> Result<Arc<ProviderConfig>, RegistryError> {
        let name = name.unwrap_or(&config.default_provider);
        config
            .provider(name)
            .cloned()
            .ok_or_else(|| RegistryError::NoProvider {
                name: name.to_string(),
                hint: crate::config::suggest::unknown_provider(config, name),
            })
    }

    async fn launch(
        &self,
        config: &Config,
        provider: Arc<ProviderConfig>,
        l: Launch<'_>,
    ) -> Result<Launched, RegistryError> {
        let (depth, max_depth) = self.check_depth_from(config, l.max_depth, l.nested_in)?;
        let cwd = resolve_cwd(&provider, l.cwd, l.caller_cwd)?;
        let provider = crate::catalog::resolve_provider(config, provider, l.cancel).await?;
        let slot = self.claim(config, &provider, l.cancel).await?;
        let mut session = l.session;
        if let Some(entry) = self.offered_server(&provider, depth, max_depth) {
            session.mcp_servers =
                Some(acpd_protocol::envelope::to_raw(&serde_json::json!([entry])));
        }
        let spec = ChildSpec {
            session,
            limits: config.wire_limits(),
            trace: trace_for(config, l.log_id),
            ..ChildSpec::new(
                provider.clone(),
                l.log_id.to_string(),
                cwd,
                depth,
                max_depth,
            )
        };
        let child = Child::start(spec, l.client_capabilities, l.cancel)
            .await
            .map_err(|e| start_failed(&provider, e))?;
        Ok(Launched {
            child,
            slot,
            provider,
            depth,
            max_depth,
        })
    }

    fn find(&self, owner: Owner, run_id: &str) -> Result<Arc<Run>, RegistryError> {
        let table = lock(&self.inner.table);
        if let Some(run) = table.runs.get(run_id).filter(|r| r.owner == owner) {
            return Ok(run.clone());
        }
        if table.tombstones.get(run_id) == Some(&owner) {
            return Err(RegistryError::RunEnded {
                run_id: run_id.to_string(),
                reason: "disposed",
            });
        }
        Err(RegistryError::UnknownRun {
            run_id: run_id.to_string(),
        })
    }

    /// Waits until the run's current turn settles and returns its result.
    pub async fn wait(
        &self,
        owner: Owner,
        run_id: &str,
    ) -> Result<Arc<SubagentResult>, RegistryError> {
        self.find(owner, run_id)?.wait().await
    }

    /// Cancels the run's current turn (no-op when it is settled).
    pub fn cancel(&self, owner: Owner, run_id: &str) -> Result<(), RegistryError> {
        match self.find(owner, run_id) {
            Ok(run) => {
                run.cancel();
                self.cancel_nested(&Parent::Run(run.run_id.clone()));
            }
            Err(RegistryError::RunEnded { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Starts a follow-up turn on a settled run whose child is still alive.
    pub async fn send(
        &self,
        owner: Owner,
        run_id: &str,
        prompt: Vec<acpd_protocol::acp::ContentBlock>,
    ) -> Result<u32, RegistryError> {
        self.find(owner, run_id)?.send(prompt).await
    }

    /// Cancels what runs, tears the child's tree down, reaps it, and forgets the run (a
    /// tombstone without output stays). A repeat succeeds.
    pub async fn dispose(&self, owner: Owner, run_id: &str) -> Result<(), RegistryError> {
        let run = match self.find(owner, run_id) {
            Ok(run) => run,
            Err(RegistryError::RunEnded { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.dispose_nested(&Parent::Run(run.run_id.clone())).await;
        run.dispose().await;
        self.bury(&run);
        Ok(())
    }

    fn bury(&self, run: &Run) {
        let mut table = lock(&self.inner.table);
        if table.runs.remove(&run.run_id).is_none() {
            return;
        }
        table.tombstones.insert(run.run_id.clone(), run.owner);
        table.tombstone_order.push_back(run.run_id.clone());
        while table.tombstone_order.len() > TOMBSTONES {
            if let Some(old) = table.tombstone_order.pop_front() {
                table.tombstones.remove(&old);
            }
        }
    }

    /// Disposes every run of `owner` in parallel (its connection ended) and forgets them.
    pub async fn dispose_owner(&self, owner: Owner) {
        let runs: Vec<Arc<Run>> = lock(&self.inner.table)
            .runs
            .values()
            .filter(|r| r.owner == owner)
            .cloned()
            .collect();
        futures::future::join_all(runs.iter().map(|r| async move {
            self.dispose_nested(&Parent::Run(r.run_id.clone())).await;
            r.dispose().await;
        }))
        .await;
        let mut table = lock(&self.inner.table);
        table.runs.retain(|_, r| r.owner != owner);
        table.tombstones.retain(|_, o| *o != owner);
        let Table {
            tombstones,
            tombstone_order,
            ..
        } = &mut *table;
        tombstone_order.retain(|id| tombstones.contains_key(id));
    }

    /// Every run in the table.
    pub fn runs(&self) -> Vec<Arc<Run>> {
        lock(&self.inner.table).runs.values().cloned().collect()
    }

    /// Live children of one provider.
    pub fn live_children_of(&self, provider: &str) -> usize {
        lock(&self.inner.table)
            .live_by_provider
            .get(provider)
            .copied()
            .unwrap_or(0)
    }

    /// Starts waiting for a free slot (`queue_timeout`).
    pub fn queued(&self) -> usize {
        self.inner.queued.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Live children across all providers.
    pub fn live_children(&self) -> usize {
        lock(&self.inner.table).live_total
    }
}
