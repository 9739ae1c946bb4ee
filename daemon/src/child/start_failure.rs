//! [`StartFailure`]: why a child could not be published, as fixed facts (for the diagnostic)
//! and as a cause a person can act on.

use acpd_protocol::envelope::{AUTH_REQUIRED, RpcError};
use acpd_protocol::subagent::{Category, Failure, Stage};

use super::AgentInfo;
use crate::config::{ProviderConfig, presets};
use crate::supervise::SpawnError;

/// Why a child could not be published.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    /// The program could not be started; `cause` says why in words ([`super::cause`]).
    #[error("{cause}")]
    Spawn {
        #[source]
        error: SpawnError,
        cause: String,
    },
    /// The provider's `env_file` could not be used (its path and why; never a value).
    #[error(transparent)]
    EnvFile(#[from] crate::config::env_file::EnvFileError),
    #[error("{} failed ({}): {detail}", failure.stage.as_str(), failure.category.as_str())]
    Handshake { failure: Failure, detail: String },
    /// The child answered a handshake call with an error: kept whole, so a bridge can pass
    /// an auth-required error (code, message, data) to the editor's login UI.
    #[error("{} failed: the agent answered {method} with error {}: {}", stage.as_str(), error.code, error.message)]
    Refused {
        stage: Stage,
        method: String,
        error: Box<RpcError>,
        /// The auth method ids the agent advertised (empty before `initialize` answered), so
        /// an auth failure's diagnostic can name them.
        advertised: Vec<String>,
    },
    /// The provider's `auth_method` is not among the methods the agent advertised: acpd does
    /// not call `authenticate` with an id the agent never offered.
    #[error("initialize failed: auth_method \"{wanted}\" is not advertised by the agent (it offers: {})", if advertised.is_empty() { "none".to_string() } else { advertised.join(", ") })]
    AuthMethod {
        wanted: String,
        advertised: Vec<String>,
    },
    #[error("cancelled during {}", stage.as_str())]
    Cancelled { stage: Stage },
    /// A `host`/`launcher` provider's far side was not reached or could not start there.
    #[error("{target}: {}", far.note())]
    Remote {
        failure: Failure,
        /// The ssh destination or the launcher program.
        target: String,
        far: crate::remote::FarFailure,
    },
}

impl StartFailure {
    /// The fixed facts, for the diagnostic and `error.data`.
    pub fn failure(&self) -> Failure {
        match self {
            StartFailure::Spawn { .. } | StartFailure::EnvFile(_) => {
                failure(Stage::Spawn, Category::Spawn)
            }
            StartFailure::Handshake { failure, .. } | StartFailure::Remote { failure, .. } => {
                failure.clone()
            }
            StartFailure::Refused {
                stage,
                error,
                method,
                ..
            } => {
                let category = if error.code == AUTH_REQUIRED || method == "authenticate" {
                    Category::Auth
                } else {
                    Category::Rpc
                };
                let mut f = failure(*stage, category);
                f.code = Some(error.code);
                f
            }
            StartFailure::AuthMethod { .. } => failure(Stage::Initialize, Category::Auth),
            StartFailure::Cancelled { stage } => {
                failure(*stage, Category::Reported("cancelled".into()))
            }
        }
    }

    /// The auth method ids the agent advertised, when the failure knows them.
    pub fn advertised_auth_methods(&self) -> &[String] {
        match self {
            StartFailure::Refused { advertised, .. }
            | StartFailure::AuthMethod { advertised, .. } => advertised,
            _ => &[],
        }
    }

    /// What failed on the way to a remote provider's far side, and which side it was.
    pub fn far(&self) -> Option<(&str, crate::remote::FarFailure)> {
        match self {
            StartFailure::Remote { target, far, .. } => Some((target, *far)),
            _ => None,
        }
    }

    /// The configured `auth_method` the agent did not advertise.
    pub fn unadvertised_auth_method(&self) -> Option<&str> {
        match self {
            StartFailure::AuthMethod { wanted, .. } => Some(wanted),
            _ => None,
        }
    }

    /// What went wrong, for a person: the program and the OS error of a spawn, what the child
    /// did during the handshake, which call the agent refused. Never the child's stderr (that
    /// is in the log at debug level); `None` for a cancelled start.
    pub fn cause(&self) -> Option<String> {
        Some(match self {
            StartFailure::Spawn { cause, .. } => cause.clone(),
            StartFailure::Handshake { failure, detail } => match failure.category {
                Category::ProcessExit | Category::Timeout => format!(
                    "{detail}; the agent's stderr is in acpd's log at debug level \
                     (ACPD_LOG=acpd::child=debug)"
                ),
                _ => detail.clone(),
            },
            // The agent's own message stays out: an editor gets the agent's error whole
            // (`agent_error`), a run's parent only acpd's facts.
            StartFailure::Refused { method, error, .. } => {
                let what = if self.failure().category == Category::Auth {
                    "the agent needs credentials: it answered"
                } else {
                    "the agent answered"
                };
                format!("{what} {method} with error {}", error.code)
            }
            StartFailure::AuthMethod { .. }
            | StartFailure::Remote { .. }
            | StartFailure::EnvFile(_) => self.to_string(),
            StartFailure::Cancelled { .. } => return None,
        })
    }

    /// Names what the agent advertised in a refusal that came after `initialize`.
    pub(super) fn with_advertised(mut self, agent: &AgentInfo) -> StartFailure {
        if let StartFailure::Refused { advertised, .. } = &mut self {
            advertised.clone_from(&agent.auth_method_ids);
        }
        self
    }
}

/// What an auth failure says to do: each preset hint's one line (fixed text from the preset
/// table) for the methods the agent advertised, then where a daemon's credential goes.
pub(crate) fn auth_notes(provider: &ProviderConfig, advertised: &[String]) -> Vec<&'static str> {
    let mut notes: Vec<&'static str> = presets::hints_for(provider.preset.as_deref(), advertised)
        .iter()
        .map(|h| h.how)
        .collect();
    if notes.is_empty() {
        notes.push(presets::UNKNOWN_CREDENTIALS);
    }
    notes.push(presets::DAEMON_CREDENTIALS);
    notes
}

/// An agent's −32000 to an editor, with what would satisfy it appended to its message: the
/// code and data stay the agent's, so an editor's login UI still works.
pub(crate) fn with_auth_advice(
    mut error: RpcError,
    provider: &ProviderConfig,
    advertised: &[String],
) -> RpcError {
    error.message = format!(
        "{} (acpd: {})",
        error.message,
        auth_notes(provider, advertised).join("; ")
    );
    error
}

pub(super) fn failure(stage: Stage, category: Category) -> Failure {
    Failure {
        stage,
        category,
        code: None,
        exit_code: None,
        signal: None,
    }
}
