//! The start gate every child passes — a delegated run's, a bridge session's, a warm
//! spare's, a probe's — in one order: the depth, the working directory, the registry agent
//! resolved, a slot claimed, the spec built, then the caller's handshake; a child that failed
//! before publication becomes one typed error ([`start_failed`]). Also the checks a run's
//! request gets before the gate (the capabilities a provider can enforce).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use acpd_protocol::diagnostic;
use acpd_protocol::subagent::{Capabilities, Category, StartRequest, WorkspaceKind};
use acpd_protocol::tool_filter::ToolFilter;
use tokio_util::sync::CancellationToken;

use super::{Registry, RegistryError, Slot};
use crate::child::{AgentInfo, Child, ChildSpec, SessionParams, StartFailure};
use crate::config::{Config, ProviderConfig, ToolFilterMode, WorkspaceMode, presets};
use crate::workspace::{Base, WorkspaceError, Worktree};

/// What a start asks of the gate besides the provider: where its child runs, how deep, under
/// which name, and what its spec carries beyond the provider's own.
pub(super) struct Admission<'a> {
    /// Names the child in logs and its trace: a run id, `bridge-…`, `probe-…`.
    pub log_id: String,
    /// Whether the child's traffic is traced (`trace_dir`); a probe's is not.
    pub traced: bool,
    /// The depth limit the request asks for (a run's `maxDepth`).
    pub max_depth: Option<u32>,
    /// The depth and depth limit of the child that asked for this one, when nested.
    pub nested_in: Option<(u32, u32)>,
    /// What the sandboxed child that asked for this one may write: this child is held within
    /// it (see [`super::sandbox_plan::confine`]).
    pub confined: Option<Arc<crate::supervise::Confinement>>,
    /// The cwd asked for; it wins over the provider's `cwd`, which wins over `fallback_cwd`.
    pub cwd: Option<&'a Path>,
    pub fallback_cwd: Option<&'a Path>,
    /// A run's session, made at start: acpd is offered to it when its child may delegate.
    pub session: Option<SessionParams>,
    /// A bridge session's child: its output waits in the pipe for the relay.
    pub relay: bool,
    /// Abandons the start (the registry agent's resolution, the wait for a slot, the handshake).
    pub cancel: &'a CancellationToken,
    /// The child works in a git worktree of the cwd's repository, named by `log_id` (its
    /// branch `acpd/<log_id>`), checked out as the base says; made once a slot is claimed.
    pub worktree: Option<Base<'a>>,
}

impl<'a> Admission<'a> {
    /// A traced child at this acpd's depth, in the provider's cwd, with no session of its own.
    pub(super) fn new(log_id: String, cancel: &'a CancellationToken) -> Self {
        Admission {
            log_id,
            traced: true,
            max_depth: None,
            nested_in: None,
            confined: None,
            cwd: None,
            fallback_cwd: None,
            session: None,
            relay: false,
            cancel,
            worktree: None,
        }
    }
}

/// A child that passed the gate and started — a `Child` with its session, an initialized
/// child, what a probe learned — with its claim on the limits (released when the slot drops).
pub struct Launched<C = Child> {
    pub child: C,
    pub slot: Slot,
    /// The provider as started (a registry agent resolved to its command).
    pub provider: Arc<ProviderConfig>,
    pub depth: u32,
    pub max_depth: u32,
    /// The child's worktree, when it has one: its owner removes it at dispose.
    pub workspace: Option<Worktree>,
}

/// Why a start gave no child: the gate refused it, or the agent did not start (with the
/// spawn's own detail, which `acpd doctor` prints as it is).
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Refused(#[from] RegistryError),
    #[error("{failure}")]
    Start {
        provider: Arc<ProviderConfig>,
        failure: StartFailure,
    },
}

impl From<GateError> for RegistryError {
    fn from(e: GateError) -> Self {
        match e {
            GateError::Refused(e) => e,
            GateError::Start { provider, failure } => start_failed(&provider, failure),
        }
    }
}

impl Registry {
    /// Passes a child of `provider` through the gate — depth, cwd, the registry agent
    /// resolved, a slot claimed (waiting up to `queue_timeout`), the spec — and `start`s it:
    /// `Child::start`, `child::initialize` or `child::probe`, whatever the caller needs.
    pub(super) async fn gate<C, F>(
        &self,
        config: &Config,
        provider: Arc<ProviderConfig>,
        a: Admission<'_>,
        start: impl FnOnce(ChildSpec) -> F,
    ) -> Result<Launched<C>, GateError>
    where
        F: Future<Output = Result<C, StartFailure>>,
    {
        let (depth, max_depth) = self.check_depth(config, a.max_depth, a.nested_in)?;
        let cwd = resolve_cwd(&provider, a.cwd, a.fallback_cwd)?;
        let cwd = match &a.confined {
            Some(limit) => super::sandbox_plan::confine(&provider, &cwd, limit)?,
            None => cwd,
        };
        let provider = crate::catalog::resolve_provider(config, provider, a.cancel)
            .await
            .map_err(RegistryError::from)?;
        let slot = self.claim(config, &provider, a.cancel).await?;
        let workspace = match (a.worktree, &a.confined) {
            (Some(base), Some(limit)) => {
                let dirs = crate::workspace::git_dirs(&cwd)
                    .await
                    .map_err(|e| workspace_failed(&provider, e))?;
                super::sandbox_plan::confine_repository(&cwd, &dirs, limit)?;
                Some(
                    Worktree::create_pinned(&cwd, &a.log_id, base, &dirs[0])
                        .await
                        .map_err(|e| workspace_failed(&provider, e))?,
                )
            }
            (Some(base), None) => Some(
                Worktree::create(&cwd, &a.log_id, base)
                    .await
                    .map_err(|e| workspace_failed(&provider, e))?,
            ),
            (None, _) => None,
        };
        // A repository swapped in under the checked cwd while git ran: the worktree acpd made
        // must be of the repository that holds the directory that passed the check.
        let swapped = match (&a.confined, &workspace) {
            (Some(limit), Some(w))
                if !(std::fs::canonicalize(&w.repo).is_ok_and(|r| r == w.repo)
                    && cwd.starts_with(&w.repo)) =>
            {
                Some(limit.clone())
            }
            _ => None,
        };
        if let Some(limit) = swapped {
            if let Some(w) = workspace {
                w.remove(false).await;
            }
            return Err(RegistryError::Confined {
                reason: format!(
                    "the repository of {:?} changed while its worktree was made",
                    cwd.to_string_lossy()
                ),
                limit,
            }
            .into());
        }
        let cwd = workspace.as_ref().map_or(cwd, |w| w.cwd.clone());
        let mut spec = ChildSpec {
            relay: a.relay,
            limits: config.wire_limits(),
            trace: a.traced.then(|| trace_for(config, &a.log_id)).flatten(),
            ..ChildSpec::new(provider.clone(), a.log_id, cwd, depth, max_depth)
        };
        // The whole worktree (not only the cwd's subdirectory) is the child's to write.
        let root = workspace
            .as_ref()
            .map_or(spec.cwd.clone(), |w| w.path.clone());
        let sandboxed = super::sandbox_plan::sandbox_for(
            &provider,
            (&root, workspace.is_some()),
            a.confined.as_ref(),
            &spec.run_id,
            &mut spec.env,
        )
        .await;
        // `auto` on a kernel that lost Landlock since the asking child was sandboxed.
        let sandboxed = match (sandboxed, &a.confined) {
            (Ok(None), Some(limit)) => Err(RegistryError::Confined {
                reason: format!(
                    "provider \"{}\" would run unsandboxed here, and the child asking is \
                     sandboxed ({})",
                    provider.name,
                    limit.describe()
                ),
                limit: limit.clone(),
            }),
            (other, _) => other,
        };
        match sandboxed {
            Ok(sandbox) => spec.sandbox = sandbox,
            Err(e) => {
                if let Some(w) = workspace {
                    w.remove(false).await;
                }
                return Err(e.into());
            }
        }
        if let Some(mut session) = a.session {
            if let Some(entry) = self.offered_server(&provider, depth, max_depth) {
                session.mcp_servers =
                    Some(acpd_protocol::envelope::to_raw(&serde_json::json!([entry])));
            }
            spec.session = session;
        }
        let began = std::time::Instant::now();
        let started = start(spec).await;
        if started.is_ok() {
            crate::metrics::get().child_started(&provider.name, began.elapsed());
        }
        match started {
            Ok(child) => Ok(Launched {
                child,
                slot,
                provider,
                depth,
                max_depth,
                workspace,
            }),
            Err(failure) => {
                // Nothing ran in it: the worktree and its branch go.
                if let Some(w) = workspace {
                    w.remove(false).await;
                }
                Err(GateError::Start { provider, failure })
            }
        }
    }
}

/// A worktree that could not be made: a cwd outside a repository is an INVALID_CWD naming it
/// and git's message; anything else a START_FAILED.
fn workspace_failed(provider: &ProviderConfig, e: WorkspaceError) -> RegistryError {
    match e {
        WorkspaceError::NotARepository { .. } => RegistryError::InvalidCwd {
            reason: e.to_string(),
        },
        e => RegistryError::Workspace {
            provider: provider.name.clone(),
            reason: e.to_string(),
        },
    }
}

/// Whether a child of `provider` gets a worktree: the request's `workspace` (`asked`), else
/// the provider's when `by_default` (a run; a bridge session only when its editor asks); a
/// worktree only where the provider allows it (`workspace = "worktree"`), and a `ref` only
/// with one.
pub(super) fn wants_worktree(
    provider: &ProviderConfig,
    asked: Option<WorkspaceKind>,
    base_ref: Option<&str>,
    by_default: bool,
) -> Result<bool, RegistryError> {
    let allowed = provider.workspace == WorkspaceMode::Worktree;
    let worktree = match asked {
        Some(WorkspaceKind::Worktree) if !allowed => Err(RegistryError::UnsupportedCapability {
            provider: provider.name.clone(),
            capability: "workspace",
        }),
        Some(WorkspaceKind::Worktree) => Ok(true),
        Some(WorkspaceKind::Shared) => Ok(false),
        None => Ok(allowed && by_default),
    }?;
    if base_ref.is_some() && !worktree {
        return Err(RegistryError::InvalidRequest {
            reason: "`ref` names a worktree's base commit, and this child has no worktree \
                     (ask for `workspace: \"worktree\"`)"
                .into(),
        });
    }
    Ok(worktree)
}

/// A trace for the child of run or session `id`, when acpd traces (`trace_dir`).
fn trace_for(config: &Config, id: &str) -> Option<Arc<crate::trace::Trace>> {
    crate::trace::Trace::start(config.trace_dir.as_deref()?, id)
}

/// Where a child asked no question about a directory starts (a spare, a probe, a listing):
/// the user's home, else `/`.
pub(super) fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute() && h.is_dir())
        .unwrap_or_else(|| "/".into())
}

/// What acpd can enforce for an ACP child: depth (through `ACPD_DEPTH`), an output schema
/// (checked by acpd itself), a persona when the agent takes a `systemPrompt` (known once
/// probed), and a tool filter only where the provider names how its agent takes one
/// (`tool_filter`): acpd's own backstop alone would let a forbidden tool run once.
pub(super) fn capabilities(provider: &ProviderConfig, persona: bool) -> Capabilities {
    Capabilities {
        output_schema: true,
        depth_limit: true,
        tool_filter: provider.tool_filter != ToolFilterMode::None,
        persona,
    }
}

/// A run's tool filter as the provider's agent takes it in `session/new`'s `_meta`.
pub(super) fn tool_filter_meta(
    provider: &ProviderConfig,
    filter: &ToolFilter,
) -> Option<serde_json::Value> {
    match provider.tool_filter {
        ToolFilterMode::None => None,
        ToolFilterMode::ClaudeMeta => Some(filter.claude_meta()),
    }
}

pub(super) fn takes_system_prompt(agent: &AgentInfo) -> bool {
    agent
        .capabilities
        .pointer("/sessionCapabilities/systemPrompt")
        .is_some_and(|v| !v.is_null())
}

/// The fixed-order gate for what needs no probe; persona is probed afterwards.
pub(super) fn check_capabilities(
    provider: &ProviderConfig,
    req: &StartRequest,
) -> Result<(), RegistryError> {
    let caps = capabilities(provider, true);
    let asked = [
        (
            "outputSchema",
            req.output_schema.is_some(),
            caps.output_schema,
        ),
        ("depthLimit", req.max_depth.is_some(), caps.depth_limit),
        ("toolFilter", req.tool_filter.is_some(), caps.tool_filter),
        ("persona", req.persona.is_some(), caps.persona),
    ];
    for (capability, requested, supported) in asked {
        if requested && !supported {
            return Err(RegistryError::UnsupportedCapability {
                provider: provider.name.clone(),
                capability,
            });
        }
    }
    if let Some(filter) = &req.tool_filter {
        filter
            .check()
            .map_err(|reason| RegistryError::InvalidRequest { reason })?;
    }
    Ok(())
}

/// The request's cwd, else the provider's, else the caller's; absolute and enterable, never a
/// silent fallback to acpd's own directory.
pub(super) fn resolve_cwd(
    provider: &ProviderConfig,
    requested: Option<&Path>,
    caller: Option<&Path>,
) -> Result<PathBuf, RegistryError> {
    let (cwd, origin) = match (requested, provider.cwd.as_deref(), caller) {
        (Some(p), _, _) => (p, "the request's cwd"),
        (None, Some(p), _) => (p, "the provider's cwd"),
        (None, None, Some(p)) => (p, "the caller's working directory"),
        (None, None, None) => {
            return Err(RegistryError::InvalidCwd {
                reason: "no cwd given and no caller working directory to fall back on".into(),
            });
        }
    };
    if !cwd.is_absolute() {
        return Err(RegistryError::InvalidCwd {
            reason: format!("{origin} must be absolute"),
        });
    }
    // A remote provider's cwd is the far side's: `acpd supervise` checks it there.
    let far = provider.remote.is_some();
    if !far {
        let why = match std::fs::metadata(cwd) {
            Err(e) => Some(e.to_string()),
            Ok(m) if !m.is_dir() => Some("not a directory".into()),
            Ok(_) => nix::unistd::access(cwd, nix::unistd::AccessFlags::X_OK)
                .err()
                .map(|e| e.desc().to_string()),
        };
        if let Some(why) = why {
            return Err(RegistryError::InvalidCwd {
                reason: format!(
                    "{origin} {:?} is not an existing, enterable directory ({why}); create it, \
                     or give another",
                    cwd.to_string_lossy()
                ),
            });
        }
    }
    Ok(cwd.to_path_buf())
}

/// The environment variable names (never their values) that would satisfy an agent's auth,
/// from the preset table's hints ([`presets::hints_for`]). Without a hint the list is empty
/// and a diagnostic names the method ids only.
pub(crate) fn auth_env_names(preset: Option<&str>, method_ids: &[String]) -> Vec<String> {
    let hints = presets::hints_for(preset, method_ids);
    let mut names: Vec<String> = Vec::new();
    for name in hints.iter().flat_map(|h| h.env.iter()) {
        if !names.iter().any(|n| n == name) {
            names.push((*name).to_string());
        }
    }
    names
}

/// What an auth failure's diagnostic names: the advertised method ids and the environment
/// variable names that would satisfy them.
pub(super) fn auth_facts(provider: &ProviderConfig, advertised: &[String]) -> Vec<String> {
    auth_env_names(provider.preset.as_deref(), advertised)
}

const NOTE_AUTH_METHOD: &str = "auth: the configured auth_method is not advertised by the agent";

pub(super) fn start_failed(provider: &ProviderConfig, e: StartFailure) -> RegistryError {
    if let StartFailure::Cancelled { .. } = e {
        return RegistryError::StartCancelled {
            provider: provider.name.clone(),
        };
    }
    let failure = e.failure();
    crate::metrics::get().start_failed(&provider.name, &failure.category);

    let far = e.far();
    // A remote auth refusal is ssh's, not the agent's: no agent auth facts for it.
    let is_auth = failure.category == Category::Auth && far.is_none();
    let advertised: &[String] = if is_auth {
        e.advertised_auth_methods()
    } else {
        &[]
    };
    // An editor's login UI reads the agent's own code and data; its message gains the advice.
    let agent_error = match &e {
        StartFailure::Refused { error, .. }
            if is_auth && error.code == acpd_protocol::envelope::AUTH_REQUIRED =>
        {
            Some(Box::new(crate::child::with_auth_advice(
                (**error).clone(),
                provider,
                advertised,
            )))
        }
        StartFailure::Refused { error, .. } => Some(error.clone()),
        _ => None,
    };
    let env_names = if is_auth {
        auth_facts(provider, advertised)
    } else {
        Vec::new()
    };
    let mut notes: Vec<&'static str> = match (e.unadvertised_auth_method(), far) {
        (Some(_), _) => vec![NOTE_AUTH_METHOD],
        (None, Some((_, f))) => vec![f.note()],
        (None, None) => Vec::new(),
    };
    // An auth_method the agent does not offer is the config's mistake, not a credential's; an
    // ssh login refused is the host's keys, which the far failure's note names.
    if is_auth && e.unadvertised_auth_method().is_none() && far.is_none() {
        notes.extend(crate::child::auth_notes(provider, advertised));
    }
    let (host, launcher) = match provider.remote.as_ref().map(|r| (&r.via, r.target())) {
        Some((crate::remote::Via::Ssh { .. }, t)) => (Some(t), None),
        Some((crate::remote::Via::Launcher(_), t)) => (None, Some(t)),
        None => (None, None),
    };
    let diagnostic = diagnostic::build(&diagnostic::Facts {
        provider: &provider.name,
        failure: Some(&failure),
        auth_methods: advertised,
        auth_method: e.unadvertised_auth_method(),
        env_names: &env_names,
        notes: &notes,
        host: host.as_deref(),
        launcher: launcher.as_deref(),
        ..Default::default()
    });
    RegistryError::StartFailed {
        provider: provider.name.clone(),
        failure: Box::new(failure),
        cause: e.cause(),
        diagnostic,
        agent_error,
    }
}

#[cfg(test)]
mod tests {
    use super::auth_env_names;

    fn ids(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn auth_env_names_follow_the_preset_and_the_advertised_methods() {
        // claude-agent-acp advertises no method; its preset knows the key's name.
        let claude = auth_env_names(Some("claude"), &[]);
        assert!(
            claude.iter().any(|n| n == "ANTHROPIC_API_KEY"),
            "{claude:?}"
        );
        assert_eq!(
            auth_env_names(Some("codex"), &ids(&["api-key"])),
            ["CODEX_API_KEY", "OPENAI_API_KEY"]
        );
        // A method the table does not know names nothing.
        assert!(auth_env_names(Some("codex"), &ids(&["other"])).is_empty());
        // No preset: by the advertised method id.
        assert_eq!(
            auth_env_names(None, &ids(&["gemini-api-key"])),
            ["GEMINI_API_KEY"]
        );
        assert!(auth_env_names(None, &ids(&["key"])).is_empty());
        assert!(auth_env_names(None, &[]).is_empty());
    }
}
