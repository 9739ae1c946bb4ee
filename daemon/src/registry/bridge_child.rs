//! The child a bridge session gets: opened the way the editor asked (a new session, a fork,
//! or an existing session to load or resume), or asked one question before any session
//! (`authenticate`, `session/list`, `session/delete`). A warm spare when one fits
//! ([`super::warm`]), else a new child through the start gate ([`super::gate`]).

use std::path::Path;
use std::sync::Arc;

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::gate::{Admission, home, start_failed, wants_worktree};
use super::{Launched, Registry, RegistryError, Slot};
use crate::child::{self, AgentInfo, ClientCaps, Initialized, Open};
use crate::config::{Config, ProviderConfig, WorkspaceMode};
use crate::workspace::{Base, has_own_branch};
use acpd_protocol::subagent::WorkspaceKind;

/// The worktree a bridge session asks for (`_meta.acpd.workspace` and `ref`).
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkspaceAsk<'a> {
    pub kind: Option<WorkspaceKind>,
    pub base_ref: Option<&'a str>,
    /// The acpd session id: the worktree's name and its branch's (`acpd/<id>`).
    pub name: &'a str,
    /// A session opened again (`session/load`, `session/resume`) whose worktree is gone: the
    /// branch its earlier worktree left is checked out again, when the repository has it.
    pub resume: bool,
}

/// What a bridge session asks for.
pub struct BridgeRequest<'a> {
    pub provider: Option<&'a str>,
    pub cwd: &'a Path,
    pub open: Open,
    /// The agent capability the open needs (a JSON pointer into `agentCapabilities`, e.g.
    /// `/loadSession`); checked after `initialize`, before anything is asked of the agent.
    pub needs: Option<&'static str>,
    pub client_capabilities: ClientCaps,
    /// The `authenticate` params the editor's connection used with this provider.
    pub auth: Option<&'a RawValue>,
    pub cancel: &'a CancellationToken,
    pub workspace: WorkspaceAsk<'a>,
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
pub(crate) fn advertises(agent: &AgentInfo, pointer: &str) -> bool {
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
        client_capabilities: ClientCaps,
        auth: Option<&RawValue>,
        cancel: &CancellationToken,
    ) -> Result<Ready, RegistryError> {
        let config = self.config();
        let provider = self.provider(&config, provider)?;
        self.ready_for(&config, provider, cwd, client_capabilities, auth, cancel)
            .await
    }

    /// [`Registry::ready`] for a provider already looked up.
    async fn ready_for(
        &self,
        config: &Config,
        provider: Arc<ProviderConfig>,
        cwd: Option<&Path>,
        client_capabilities: ClientCaps,
        auth: Option<&RawValue>,
        cancel: &CancellationToken,
    ) -> Result<Ready, RegistryError> {
        let Some(mut spare) = self.take_spare(&provider, &client_capabilities, cwd).await else {
            return self
                .ready_cold(config, provider, cwd, client_capabilities, auth, cancel)
                .await;
        };
        if let Some(auth) = auth {
            spare.call("authenticate", auth, cancel).await?;
        }
        Ok(spare)
    }

    /// A new initialized child through the start gate, its output held for a relay. Without
    /// a cwd it starts in the provider's, else the user's home.
    pub(super) async fn ready_cold(
        &self,
        config: &Config,
        provider: Arc<ProviderConfig>,
        cwd: Option<&Path>,
        client_capabilities: ClientCaps,
        auth: Option<&RawValue>,
        cancel: &CancellationToken,
    ) -> Result<Ready, RegistryError> {
        let home = home();
        let admission = Admission {
            cwd,
            fallback_cwd: Some(&home),
            relay: true,
            ..Admission::new(format!("bridge-{}", uuid::Uuid::new_v4()), cancel)
        };
        let launched = self
            .gate(config, provider, admission, |spec| {
                child::initialize(spec, client_capabilities, cancel)
            })
            .await?;
        self.learned(&launched.provider, launched.child.agent());
        let mut ready = Ready {
            child: launched.child,
            slot: launched.slot,
        };
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
        // Refused before anything is made: a worktree the provider does not allow.
        let fresh = wants_worktree(&chosen, req.workspace.kind, req.workspace.base_ref, false)?;
        let mut open = req.open;
        if let Open::Create { params, .. } = &mut open {
            self.offer_in(params, &chosen, depth);
        }
        let ask = req.workspace;
        let resumed = ask.resume
            && ask.kind != Some(WorkspaceKind::Shared)
            && ask.base_ref.is_none()
            && chosen.workspace == WorkspaceMode::Worktree
            && has_own_branch(req.cwd, ask.name).await;
        let base = match (resumed, fresh) {
            (true, _) => Some(Base::OwnBranch),
            (false, true) => Some(Base::Commit(ask.base_ref)),
            (false, false) => None,
        };
        if let Some(base) = base {
            let opening = Opening {
                cwd: req.cwd,
                open,
                needs: req.needs,
                client_capabilities: req.client_capabilities,
                auth: req.auth,
                cancel: req.cancel,
            };
            return self
                .open_in_worktree(&config, chosen, opening, ask.name, base)
                .await;
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
                    workspace: None,
                });
            }
        }
        let ready = self
            .ready_for(
                &config,
                chosen,
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
            workspace: None,
        })
    }
}

/// A bridge session's open, once its provider is chosen.
struct Opening<'a> {
    cwd: &'a Path,
    open: Open,
    needs: Option<&'static str>,
    client_capabilities: ClientCaps,
    auth: Option<&'a RawValue>,
    cancel: &'a CancellationToken,
}

impl Registry {
    /// A bridge session's child in a worktree of its own, named `name` (never a warm spare:
    /// a spare runs elsewhere): its process and its session (`cwd` in `session/new`) start
    /// in the worktree, at the editor's cwd's place in the repository. Whatever fails after
    /// the worktree was made removes it again (a new branch with it, a resumed one kept).
    async fn open_in_worktree(
        &self,
        config: &Config,
        provider: Arc<ProviderConfig>,
        o: Opening<'_>,
        name: &str,
        base: Base<'_>,
    ) -> Result<Launched, RegistryError> {
        let home = home();
        let admission = Admission {
            cwd: Some(o.cwd),
            fallback_cwd: Some(&home),
            relay: true,
            worktree: Some(base),
            ..Admission::new(name.to_string(), o.cancel)
        };
        let caps = o.client_capabilities;
        let launched = self
            .gate(config, provider, admission, |spec| {
                child::initialize(spec, caps, o.cancel)
            })
            .await?;
        self.learned(&launched.provider, launched.child.agent());
        let Launched {
            child,
            slot,
            provider,
            workspace,
            ..
        } = launched;
        let mut open = o.open;
        if let (Open::Create { params, .. }, Some(w)) = (&mut open, &workspace) {
            params["cwd"] = serde_json::json!(w.cwd.to_string_lossy());
        }
        let mut ready = Ready { child, slot };
        let opened = async {
            if let Some(auth) = o.auth {
                ready.call("authenticate", auth, o.cancel).await?;
            }
            if let Some(needs) = o.needs
                && !advertises(ready.child.agent(), needs)
            {
                return Err(RegistryError::UnsupportedCapability {
                    provider: provider.name.clone(),
                    capability: needs.trim_start_matches('/'),
                });
            }
            Ok(())
        }
        .await;
        let opened = match opened {
            Ok(()) => {
                let Ready { child, slot } = ready;
                child
                    .open(open, o.cancel)
                    .await
                    .map(|child| (child, slot))
                    .map_err(|e| start_failed(&provider, e))
            }
            Err(e) => {
                ready.close().await;
                Err(e)
            }
        };
        match opened {
            Ok((child, slot)) => Ok(Launched {
                child,
                slot,
                provider,
                depth: self.bridge_depth(),
                max_depth: self.max_depth(None),
                workspace,
            }),
            Err(e) => {
                if let Some(w) = workspace {
                    w.remove(matches!(base, Base::OwnBranch)).await;
                }
                Err(e)
            }
        }
    }
}
