//! The start-time gate: everything decided before a child is spawned — the capabilities a
//! provider can enforce, the depth limits, the working directory — and the typed error for a
//! child that failed before publication.

use std::path::{Path, PathBuf};

use acpd_protocol::diagnostic;
use acpd_protocol::subagent::{Capabilities, Category, StartRequest};

use super::RegistryError;
use crate::child::{AgentInfo, StartFailure};
use crate::config::{ProviderConfig, presets};
use crate::supervise;

/// Where this acpd sits in a delegation chain, read from its own environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct DepthContext {
    /// `ACPD_DEPTH` of this process (0 at the top).
    pub depth: u32,
    /// `ACPD_MAX_DEPTH` an outer acpd imposed, if any.
    pub inherited_max: Option<u32>,
}

impl DepthContext {
    pub fn from_env() -> Self {
        let read = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        DepthContext {
            depth: read(supervise::DEPTH_VAR).unwrap_or(0),
            inherited_max: read(supervise::MAX_DEPTH_VAR),
        }
    }
}

/// What acpd can enforce for an ACP child: depth (through `ACPD_DEPTH`), an output schema
/// (checked by acpd itself), and a persona when the agent takes a `systemPrompt` (known once
/// probed). Tool filters cannot be enforced across the process boundary.
pub(super) fn capabilities(persona: bool) -> Capabilities {
    Capabilities {
        output_schema: true,
        depth_limit: true,
        tool_filter: false,
        persona,
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
    let caps = capabilities(true);
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
pub fn auth_env_names(preset: Option<&str>, method_ids: &[String]) -> Vec<String> {
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
    // An auth_method the agent does not offer is the config's mistake, not a credential's.
    if is_auth && e.unadvertised_auth_method().is_none() {
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
