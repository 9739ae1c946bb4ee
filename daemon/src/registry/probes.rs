//! What a provider's agent says about itself in `initialize`: learned by a probe (a child
//! through the start gate, asked `initialize` only, torn down) or from a live child, kept per
//! provider until a reload, and in the durable cache by the agent's exact command. A run's
//! persona is checked against it; the editor's `initialize` and `acpd doctor` show it.

use std::path::Path;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::gate::{Admission, GateError, home, takes_system_prompt};
use super::{Registry, RegistryError, lock};
use crate::child::{self, AgentInfo};
use crate::config::{Config, ProviderConfig};

impl Registry {
    /// Spawns the provider's agent (in the provider's `cwd`, else `cwd`), runs `initialize`
    /// only and tears it down: what the agent says about itself. Goes through the same gate as
    /// a start (depth, cwd, capacity), so a probe counts against the limits while it lives.
    pub async fn probe(
        &self,
        provider: &str,
        cwd: Option<&Path>,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, GateError> {
        let config = self.config();
        let provider = self.provider(&config, Some(provider))?;
        self.probe_provider(&config, provider, cwd, cancel).await
    }

    /// [`Registry::probe`] for a provider already looked up.
    async fn probe_provider(
        &self,
        config: &Config,
        provider: Arc<ProviderConfig>,
        cwd: Option<&Path>,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, GateError> {
        let home = home();
        let admission = Admission {
            traced: false,
            fallback_cwd: Some(cwd.unwrap_or(&home)),
            ..Admission::new(format!("probe-{}", provider.name), cancel)
        };
        let probed = self
            .gate(config, provider, admission, |spec| {
                child::probe(spec, cancel)
            })
            .await?;
        Ok(probed.child)
    }

    /// Whether a probe found the provider's agent taking a `systemPrompt`; false if not probed.
    pub(super) fn cached_persona(&self, provider: &str) -> bool {
        lock(&self.inner.probes)
            .get(provider)
            .and_then(|cell| cell.get().cloned())
            .is_some_and(|agent| takes_system_prompt(&agent))
    }

    /// Probes the provider once (spawn, `initialize`, teardown) and caches what it said.
    pub(super) async fn probe_persona(
        &self,
        config: &Config,
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
                self.probe_provider(config, provider.clone(), Some(cwd), cancel)
                    .await
                    .inspect_err(|e| {
                        tracing::warn!(provider = %provider.name, "capability probe failed: {e}");
                    })
            })
            .await;
        agent.is_ok_and(takes_system_prompt)
    }

    /// What the provider's agent says about itself: what a live child or an earlier probe
    /// said, else what the durable cache holds for this exact command, else a probe now.
    pub async fn agent_info(
        &self,
        provider: Option<&str>,
        store: Option<&crate::store::Store>,
        cancel: &CancellationToken,
    ) -> Result<AgentInfo, RegistryError> {
        let config = self.config();
        let provider = self.provider(&config, provider)?;
        if let Some(agent) = self.cached(&provider.name) {
            return Ok(agent);
        }
        // A registry agent is known by the command it resolves to (its version in it), so a
        // new release is probed again; the id alone if it cannot be resolved now.
        let resolved = crate::catalog::resolve_provider(&config, provider.clone(), cancel)
            .await
            .unwrap_or_else(|_| provider.clone());
        let fingerprint = fingerprint(&resolved);
        if let Some(store) = store
            && let Ok(Some(value)) = store.probe_get(&provider.name, &fingerprint).await
            && let Ok(agent) = serde_json::from_value::<AgentInfo>(value)
        {
            self.learned(&provider, &agent);
            return Ok(agent);
        }
        let agent = self
            .probe_provider(&config, provider.clone(), None, cancel)
            .await?;
        self.learned(&provider, &agent);
        if let Some(store) = store
            && let Ok(value) = serde_json::to_value(&agent)
            && let Err(e) = store.probe_put(&provider.name, &fingerprint, &value).await
        {
            tracing::warn!(provider = %provider.name, "cannot cache what the agent advertised: {e}");
        }
        Ok(agent)
    }

    /// What a probe or a live child of `provider` said in `initialize`, if anything yet.
    pub fn cached(&self, provider: &str) -> Option<AgentInfo> {
        lock(&self.inner.probes)
            .get(provider)
            .and_then(|cell| cell.get().cloned())
    }

    /// Remembers what a child of `provider` said (the first answer wins until a reload).
    pub(super) fn learned(&self, provider: &ProviderConfig, agent: &AgentInfo) {
        let cell = lock(&self.inner.probes)
            .entry(provider.name.clone())
            .or_default()
            .clone();
        let _ = cell.set(agent.clone());
    }
}

/// What identifies an agent's answer in the durable cache: its command and environment.
fn fingerprint(provider: &ProviderConfig) -> String {
    serde_json::json!({
        "command": provider.command,
        "env": provider.env,
        "passthrough": provider.env_passthrough,
        "registry": provider.registry,
        "acpd": env!("CARGO_PKG_VERSION"),
    })
    .to_string()
}
