//! The subagent registry: named providers, the start gate every child passes (depth, cwd,
//! capacity — all checked before anything is spawned), the run table, warm spares, and nested
//! delegation. [`Registry`] is one type whose methods are split by concern, one file each:
//!
//! | file | concern | `impl Registry` methods |
//! |---|---|---|
//! | `mod.rs` | the type, its config | `new`, `config`, `reload`, `providers`, `provider_names`, `provider` |
//! | `gate.rs` | the one start gate, capability checks, failure mapping | `gate` |
//! | `limits.rs` | depth and slots | `check_depth`, `max_depth`, `bridge_depth`, `claim`, `try_claim`, `live_children`, `live_children_of`, `queued` |
//! | `run_start.rs` | a delegated run's start and publication | `start` |
//! | `run_table.rs` | runs by owner, tombstones | `find`, `wait`, `cancel`, `send`, `dispose`, `bury`, `dispose_owner`, `runs` |
//! | `bridge_child.rs` | a bridge session's child | `ready`, `ready_for`, `ready_cold`, `open_bridge` |
//! | `probes.rs` | what an agent says about itself | `probe`, `probe_provider`, `probe_persona`, `cached_persona`, `agent_info`, `cached`, `learned` |
//! | `warm.rs` | warm spares | `keep_warm`, `follow_caps`, `take_spare`, `take_made`, `expect_session`, `plain_spares`, `spare_counts`, `tend`, `fill`, `start_spare`, `drain_spares` |
//! | `offer.rs` | acpd offered to a child as an MCP server | `offer_socket`, `offered_server`, `offer_in` |
//! | `lineage.rs` | where a connection stands, runs nested under a parent | `run_by_pid`, `lineage_of`, `nest_at`, `cancel_run`, `announce_to_run`, `session_of_run`, `top_session`, `nested_runs`, `cancel_nested`, `dispose_nested` |
//!
//! Beside them: a published run and its turns (`run_lifecycle.rs`, [`Run`]), its budget
//! (`budget.rs`, charged up its chain of nested runs), what it reports
//! to its owner (`run_events.rs`), `outputSchema` (`output_schema.rs`), the errors
//! (`registry_error.rs`), and the run timers on paused time (`tests.rs`).

mod bridge_child;
mod budget;
mod gate;
pub(crate) mod limits;
mod lineage;
mod offer;
mod output_schema;
mod probes;
mod registry_error;
pub(crate) mod run_events;
mod run_lifecycle;
pub(crate) mod run_start;
mod run_table;
mod sandbox_plan;
#[cfg(test)]
mod tests;
mod warm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use acpd_protocol::subagent::{ProviderInfo, WorkspaceKind};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::child::AgentInfo;
use crate::config::{Config, ProviderConfig};
use gate::capabilities;

pub(crate) use bridge_child::{BridgeRequest, Ready, WorkspaceAsk, advertises};
pub(crate) use gate::{GateError, Launched, auth_env_names};
pub(crate) use limits::{DepthContext, Slot};
pub(crate) use lineage::{Lineage, Nest, Origin, Parent, Tree};
pub(crate) use registry_error::RegistryError;
pub(crate) use run_events::RunEvent;
pub(crate) use run_lifecycle::{Run, RunState};
pub(crate) use run_start::StartOptions;
pub(crate) use sandbox_plan::enforced as sandbox_enforced;

/// Who started a run; only its owner may wait on, cancel, send to or dispose it.
pub(crate) type Owner = u64;

/// How many disposed run ids are remembered.
const TOMBSTONES: usize = 4096;

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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    pub fn new(config: Config, depth: DepthContext) -> Self {
        // Worktrees and children's tmps of an acpd that was killed go before this one makes
        // its own.
        let leftovers = [
            crate::workspace::worktrees_dir(),
            crate::workspace::tmps_dir(),
        ];
        if leftovers.iter().flatten().any(|d| d.is_dir())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(crate::workspace::sweep(None, None));
        }
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
                capabilities: capabilities(p, self.cached_persona(&p.name)),
                inherits_parent_context: false,
                default: p.name == config.default_provider,
                workspace: Some(match p.workspace {
                    crate::config::WorkspaceMode::Shared => WorkspaceKind::Shared,
                    crate::config::WorkspaceMode::Worktree => WorkspaceKind::Worktree,
                }),
                sandbox: Some(sandbox_plan::enforced(p)),
            })
            .collect()
    }

    /// The configured providers, the default first.
    pub fn provider_names(&self) -> Vec<String> {
        let config = self.config();
        let mut names: Vec<String> = config.providers.keys().cloned().collect();
        names.sort_by_key(|n| *n != config.default_provider);
        names
    }

    /// The provider named `name`, else the default one.
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
}
