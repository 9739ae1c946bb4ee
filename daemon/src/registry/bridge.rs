//! What bridge sessions need from the registry beyond a delegation's start: a child opened
//! the way the editor asked (a new session, a fork, or an existing session to load or
//! resume), children asked one question before any session (`authenticate`, `session/list`,
//! `session/delete`), and what the default provider's agent says about itself, for the
//! editor's `initialize`.

use std::path::Path;
use std::sync::Arc;

use acpd_protocol::acp::ClientCapabilities;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::gate::{resolve_cwd, start_failed};
use super::{Launched, Registry, RegistryError, Slot, lock};
use crate::child::{self, AgentInfo, ChildSpec, Initialized, Open};
use crate::config::{Config, ProviderConfig};

/// What a bridge session asks for.
pub struct BridgeRequest<'a> {
    pub provider: Option<&'a str>,
    pub cwd: &'a Path,
    pub open: Open,
    /// The agent capability the open needs (a JSON pointer into `agentCapabilities`, e.g.
    /// `/loadSession`); checked after `initialize`, before anything is asked of the agent.
    pub needs: Option<&'static str>,
    pub client_capabilities: ClientCapabilities,
    /// The `authenticate` params the editor's connection used with this provider.
    pub auth: Option<&'a RawValue>,
    pub cancel: &'a CancellationToken,
}

/// An initialized child with no session, holding its claim on the limits.
pub struct Ready {
    pub child: Initialized,
    pub slot: Slot,
}

impl Ready {
    /// One request before any session, answered by the child (or the reason it was not).
    pub async fn call(
        &mut self,
        method: &str,
        params: &RawValue,
        cancel: &CancellationToken,
    ) -> Result<Box<RawValue>, RegistryError> {
        let provider = self.child.provider().clone();
        self.child
            .call(method, params, cancel)
            .await
            .map_err(|e| start_failed(&provider, e))
    }

    pub async fn close(self) {
        self.child.close().await;
    }
}

/// Whether the agent advertised the capability at `pointer` (present and not `false`/`null`).
pub fn advertises(agent: &AgentInfo, pointer: &str) -> bool {
    agent
        .capabilities
        .pointer(pointer)
        .is_some_and(|v| !v.is_null() && v != &serde_json::Value::Bool(false))
}

impl Registry {
    /// An initialized child of `provider` (the default when `None`), authenticated with
    /// `auth` when given: a warm spare when one is ready, else a new one.
    pub async fn ready(
        &self,
        provider: Option<&str>,
        cwd: Option<&Path>,
        client_capabilities: ClientCapabilities,
        auth: Option<&RawValue>,
        cancel: &CancellationToken,
    ) -> Result<Ready, RegistryError> {
        let config = self.config();
        let chosen = self.provider(&config, provider)?;
        let Some(mut spare) = self.take_spare(&chosen, &client_capabilities).await else {
            return self
                .ready_cold(provider, cwd, client_capabilities, auth, cancel)
                .await;
        };
        if let Some(auth) = auth {
            spare.call("authenticate", auth, cancel).await?;
        }
        Ok(spare)
    }

    /// Spawns and initializes a child through the same gate as a delegation (depth, cwd,
    /// capacity). Without a cwd it starts in the provider's, else the user's home.
    pub(super) async fn ready_cold(
        &self,
        provider: Option<&str>,
        cwd: Option<&Path>,
        client_capabilities: ClientCapabilities,
        auth: Option<&RawValue>,
        cancel: &CancellationToken,
    ) -> Result<Ready, RegistryError> {
        let config = self.config();
        let provider = self.provider(&config, provider)?;
        let (depth, max_depth) = self.check_depth(&config, None)?;
        let cwd = resolve_cwd(&provider, cwd, Some(&home()))?;
        let provider = crate::catalog::resolve_provider(&config, provider, cancel).await?;
        let slot = self.claim(&config, &provider, cancel).await?;
        let log_id = format!("bridge-{}", uuid::Uuid::new_v4());
        let spec = ChildSpec {
            relay: true,
            limits: config.wire_limits(),
            trace: super::trace_for(&config, &log_id),
            ..ChildSpec::new(provider.clone(), log_id.clone(), cwd, depth, max_depth)
        };
        let child = child::initialize(spec, client_capabilities, cancel)
            .await
            .map_err(|e| start_failed(&provider, e))?;
        self.learned(&provider, child.agent());
        let mut ready = Ready { child, slot };
        if let Some(auth) = auth {
            ready.call("authenticate", auth, cancel).await?;
        }
        Ok(ready)
    }

    /// Opens a child for a bridge session, the editor's capabilities passed on: a
    /// `session/new` is handed a warm spare's session made for this cwd and params when one is
    /// ready (see [`super::warm`]).
    pub async fn open_bridge(&self, req: BridgeRequest<'_>) -> Result<Launched, RegistryError> {
        let config = self.config();
        let chosen = self.provider(&config, req.provider)?;
        let depth = self.bridge_depth();
        let mut open = req.open;
        if let Open::Create { params, .. } = &mut open {
            self.offer_in(params, &chosen, depth);
        }
        if let Open::Create {
            method: "session/new",
            params,
        } = &open
            && chosen.warm > 0
        {
            if req.auth.is_some() {
                self.plain_spares(&chosen.name);
            } else if let Some(h) = self
                .take_made(&chosen, &req.client_capabilities, req.cwd, params)
                .await
            {
                let provider = h.ready.child.provider().clone();
                let Ready { child, slot } = h.ready;
                let made = Open::Made {
                    session_id: h.session_id,
                    reply: h.reply,
                };
                let child = child
                    .open(made, req.cancel)
                    .await
                    .map_err(|e| start_failed(&provider, e))?;
                return Ok(Launched {
                    child,
                    slot,
                    provider,
                    depth,
                    max_depth: self.max_depth(None),
                });
            }
        }
        let ready = self
            .ready(
                req.provider,
                Some(req.cwd),
                req.client_capabilities,
                req.auth,
                req.cancel,
            )
            .await?;
        let provider = ready.child.provider().clone();
        if let Some(needs) = req.needs
            && !advertises(ready.child.agent(), needs)
        {
            ready.close().await;
            return Err(RegistryError::UnsupportedCapability {
                provider: provider.name.clone(),
                capability: needs.trim_start_matches('/'),
            });
        }
        let Ready { child, slot } = ready;
        let child = child
            .open(open, req.cancel)
            .await
            .map_err(|e| start_failed(&provider, e))?;
        Ok(Launched {
            child,
            slot,
            provider,
            depth,
            max_depth: self.max_depth(None),
        })
    }

    /// The depth of a bridge session's child (one below this acpd).
    pub fn bridge_depth(&self) -> u32 {
        self.inner.depth.depth.saturating_add(1)
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
            .probe(&provider.name, None, cancel)
            .await
            .map_err(|e| match e {
                super::ProbeError::Gate(e) => e,
                super::ProbeError::Start(e) => start_failed(&provider, e),
            })?;
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
    fn learned(&self, provider: &ProviderConfig, agent: &AgentInfo) {
        let cell = lock(&self.inner.probes)
            .entry(provider.name.clone())
            .or_default()
            .clone();
        let _ = cell.set(agent.clone());
    }

    /// The configured providers, the default first.
    pub fn provider_names(&self) -> Vec<String> {
        let config: Arc<Config> = self.config();
        let mut names: Vec<String> = config.providers.keys().cloned().collect();
        names.sort_by_key(|n| *n != config.default_provider);
        names
    }
}

/// Where a child asked no question about a directory starts (a spare, a probe, a listing):
/// the user's home, else `/`.
pub(super) fn home() -> std::path::PathBuf {
    std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .filter(|h| h.is_absolute() && h.is_dir())
        .unwrap_or_else(|| "/".into())
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
