//! The ACP Registry: `registry = "ID"` providers resolved from a registry document into a
//! command and environment, at the moment a child is spawned (so a config load never needs
//! the network). The document comes from `registry_url` and is cached in the state directory
//! ([`fetch`]); a `binary` distribution is installed once per version into the data
//! directory ([`binary_install`]); `npx` and `uvx` distributions run through those tools.

mod binary_install;
pub(crate) mod document;
mod fetch;
#[cfg(test)]
mod tests;
mod unpack;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProviderConfig};

pub(crate) use document::{Agent, BinaryTarget, Choice, Document, platform};
pub(crate) use fetch::{Origin, load};

/// Why a registry agent could not be made ready to spawn. Every message names the URL
/// involved (without credentials or query) and what failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot fetch the registry document {url}: {reason}")]
    Fetch { url: String, reason: String },
    #[error("the registry document {url} is not valid: {reason}")]
    Parse { url: String, reason: String },
    #[error("the registry document {url} has no agent \"{id}\"")]
    UnknownAgent { id: String, url: String },
    #[error("registry agent \"{id}\" has no distribution for {platform} (offers: {offers})")]
    NoDistribution {
        id: String,
        platform: String,
        offers: String,
    },
    #[error("cannot download the agent archive {url}: {reason}")]
    Download { url: String, reason: String },
    #[error("the agent archive {url} does not match its sha256 {expected} (got {actual})")]
    Checksum {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("cannot extract the agent archive {url}: {reason}")]
    Extract { url: String, reason: String },
    #[error("registry agent \"{id}\" has a cmd outside its archive: {cmd:?}")]
    BadCmd { id: String, cmd: String },
    #[error("cannot {what} ({}): {reason}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("no data directory to install a binary agent into (set XDG_DATA_HOME or HOME)")]
    NoDataDir,
    #[error("registry resolution stopped: {0}")]
    Task(String),
}

/// Why [`resolve_provider`] gave no provider: the registry turns it into START_CANCELLED or
/// START_FAILED (`From<ResolveError> for RegistryError`).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("the start of a \"{provider}\" run was cancelled while its registry agent resolved")]
    Cancelled { provider: String },
    #[error("provider \"{provider}\": {source}")]
    Failed {
        provider: String,
        #[source]
        source: CatalogError,
    },
}

/// Where the document cache and installed binaries live.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dirs {
    /// The state directory; the document cache goes under `registry/` (none: no cache).
    pub state: Option<PathBuf>,
    /// The data directory; binaries go under `registry/<id>/<version>/`.
    pub data: Option<PathBuf>,
}

impl Dirs {
    /// acpd's own: [`crate::supervise::default_state_dir`] and [`data_dir`].
    pub(crate) fn from_env() -> Dirs {
        Dirs {
            state: crate::supervise::default_state_dir(),
            data: data_dir(),
        }
    }
}

pub(crate) use crate::config::presets::data_dir;
#[cfg(test)]
pub(crate) use document::Distribution;
#[cfg(test)]
pub(crate) use fetch::{TTL, cache_path};

/// What a registry agent runs as here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub id: String,
    pub version: String,
    /// `binary`, `npx` or `uvx`.
    pub distribution: &'static str,
    pub command: Vec<String>,
    /// The distribution's own environment (fixed values from the document).
    pub env: BTreeMap<String, String>,
}

impl Resolved {
    /// `provider` with this command, and this environment under the provider's own `env`
    /// (a key the table sets wins).
    pub(crate) fn apply(&self, provider: &ProviderConfig) -> ProviderConfig {
        let mut env = self.env.clone();
        env.extend(provider.env.clone());
        ProviderConfig {
            command: self.command.clone(),
            env,
            ..provider.clone()
        }
    }
}

/// Resolves agent `id` from the document at `url`, installing a binary distribution first
/// when this version is not installed yet. Blocking (network, disk).
pub(crate) fn resolve(url: &str, id: &str, dirs: &Dirs) -> Result<Resolved, CatalogError> {
    let loaded = load(url, dirs.state.as_deref())?;
    let agent = loaded
        .document
        .agent(id)
        .ok_or_else(|| CatalogError::UnknownAgent {
            id: id.to_owned(),
            url: shown(url),
        })?;
    resolve_agent(agent, &platform(), dirs.data.as_deref(), on_path)
}

/// One agent's command on `platform`; `has` tells which package runners are installed.
pub(crate) fn resolve_agent(
    agent: &Agent,
    platform: &str,
    data: Option<&Path>,
    has: impl Fn(&str) -> bool,
) -> Result<Resolved, CatalogError> {
    let choice = agent
        .choose(platform, has)
        .ok_or_else(|| CatalogError::NoDistribution {
            id: agent.id.clone(),
            platform: platform.to_owned(),
            offers: agent.offers().join(", "),
        })?;
    let resolved = |distribution, command: Vec<String>, env: &BTreeMap<String, String>| Resolved {
        id: agent.id.clone(),
        version: agent.version.clone(),
        distribution,
        command,
        env: env.clone(),
    };
    Ok(match choice {
        Choice::Npx(p) => {
            let mut command = vec!["npx".to_owned(), "--yes".to_owned(), p.package.clone()];
            command.extend(p.args.iter().cloned());
            resolved("npx", command, &p.env)
        }
        Choice::Uvx(p) => {
            let mut command = vec!["uvx".to_owned(), p.package.clone()];
            command.extend(p.args.iter().cloned());
            resolved("uvx", command, &p.env)
        }
        Choice::Binary { target, .. } => {
            let data = data.ok_or(CatalogError::NoDataDir)?;
            let exe = binary_install::ensure(data, &agent.id, &agent.version, target)?;
            let mut command = vec![exe.to_string_lossy().into_owned()];
            command.extend(target.args.iter().cloned());
            resolved("binary", command, &target.env)
        }
    })
}

/// Whether an executable `name` is on `PATH`.
pub(crate) fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(name))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// The spawn hook: a provider naming a registry agent (and no command of its own) gets the
/// agent's command and environment; any other provider is returned as it is, at no cost.
/// A failure says what failed and at which URL.
pub(crate) async fn resolve_provider(
    config: &Config,
    provider: Arc<ProviderConfig>,
    cancel: &CancellationToken,
) -> Result<Arc<ProviderConfig>, ResolveError> {
    let Some(id) = provider
        .registry
        .clone()
        .filter(|_| provider.command.is_empty())
    else {
        return Ok(provider);
    };
    let url = config.registry_url.clone();
    let dirs = Dirs::from_env();
    let task = tokio::task::spawn_blocking(move || resolve(&url, &id, &dirs));
    let result = tokio::select! {
        joined = task => joined.unwrap_or_else(|e| Err(CatalogError::Task(e.to_string()))),
        // The blocking work finishes on its own (an install completes for the next start).
        _ = cancel.cancelled() => {
            return Err(ResolveError::Cancelled { provider: provider.name.clone() });
        }
    };
    match result {
        Ok(resolved) => {
            tracing::debug!(
                provider = %provider.name,
                agent = %resolved.id,
                version = %resolved.version,
                distribution = resolved.distribution,
                "registry agent resolved"
            );
            Ok(Arc::new(resolved.apply(&provider)))
        }
        Err(e) => {
            tracing::warn!(provider = %provider.name, "{e}");
            Err(ResolveError::Failed {
                provider: provider.name.clone(),
                source: e,
            })
        }
    }
}

/// A URL as messages show it: without `user:password@`, query or fragment (either may carry
/// a token).
pub(crate) fn shown(url: &str) -> String {
    let base = url.split(['?', '#']).next().unwrap_or(url);
    match base.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => base.to_owned(),
    }
}
