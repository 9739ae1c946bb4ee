//! The registry's errors: each maps to one stable name and code of acpd's error table.

use acpd_protocol::errors::{ErrorBody, ErrorName};
use acpd_protocol::subagent::Failure;

#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    #[error("no provider named \"{name}\" is configured; {hint}")]
    NoProvider {
        name: String,
        /// The closest configured name, or the preset that would add it.
        hint: String,
    },
    #[error("provider \"{provider}\" does not support the \"{capability}\" capability")]
    UnsupportedCapability {
        provider: String,
        capability: &'static str,
    },
    #[error("unsupported outputSchema: {reason}")]
    UnsupportedSchema { reason: String },
    #[error("invalid cwd: {reason}")]
    InvalidCwd { reason: String },
    #[error("run depth {depth} exceeds the depth limit {max}")]
    DepthExceeded { depth: u32, max: u32 },
    #[error("capacity reached: {scope} = {limit} live children")]
    Capacity { scope: String, limit: usize },
    #[error("provider \"{provider}\" failed to start: {}{diagnostic}", cause.as_deref().map(|c| format!("{c}. ")).unwrap_or_default())]
    StartFailed {
        provider: String,
        failure: Box<Failure>,
        /// What went wrong and what to do next, for a person: the program, PATH and OS error
        /// of a spawn, or the call the agent refused (`data.cause`).
        cause: Option<String>,
        diagnostic: String,
        /// The agent's own error, when it refused a handshake call: a bridge passes it to the
        /// editor as it is (an auth-required error's code and data drive its login UI).
        agent_error: Option<Box<acpd_protocol::envelope::RpcError>>,
    },
    #[error("the start of a \"{provider}\" run was cancelled before it was published")]
    StartCancelled { provider: String },
    #[error("no run \"{run_id}\" (it never existed or belongs to another connection)")]
    UnknownRun { run_id: String },
    #[error("run \"{run_id}\" is still running turn {turn}; wait for it first")]
    RunBusy { run_id: String, turn: u32 },
    #[error("run \"{run_id}\" has no live child any more ({reason})")]
    RunEnded {
        run_id: String,
        reason: &'static str,
    },
    #[error("invalid request: {reason}")]
    InvalidRequest { reason: String },
    #[error("provider \"{provider}\" could not get a workspace: {reason}")]
    Workspace { provider: String, reason: String },
    #[error("provider \"{provider}\" cannot be sandboxed: {reason}")]
    Sandbox { provider: String, reason: String },
    /// A run started from inside a sandboxed child's tree would escape that child's sandbox.
    #[error("not permitted from inside a sandboxed child: {reason}")]
    Confined {
        reason: String,
        limit: std::sync::Arc<crate::supervise::Confinement>,
    },
}

impl RegistryError {
    pub fn name(&self) -> ErrorName {
        match self {
            RegistryError::NoProvider { .. } => ErrorName::NoProvider,
            RegistryError::UnsupportedCapability { .. } => ErrorName::UnsupportedCapability,
            RegistryError::UnsupportedSchema { .. } => ErrorName::UnsupportedSchema,
            RegistryError::InvalidCwd { .. } => ErrorName::InvalidCwd,
            RegistryError::DepthExceeded { .. } => ErrorName::DepthExceeded,
            RegistryError::Capacity { .. } => ErrorName::Capacity,
            RegistryError::StartFailed { .. } => ErrorName::StartFailed,
            RegistryError::StartCancelled { .. } => ErrorName::StartCancelled,
            RegistryError::UnknownRun { .. } => ErrorName::UnknownRun,
            RegistryError::RunBusy { .. } => ErrorName::RunBusy,
            RegistryError::RunEnded { .. } => ErrorName::RunEnded,
            RegistryError::InvalidRequest { .. } => ErrorName::InvalidRequest,
            RegistryError::Confined { .. } => ErrorName::NotPermitted,
            RegistryError::Workspace { .. } | RegistryError::Sandbox { .. } => {
                ErrorName::StartFailed
            }
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            name: self.name(),
            code: self.name().code(),
            message: self.to_string(),
        }
    }

    /// Structured facts for `error.data`, beyond the name.
    pub fn data(&self) -> serde_json::Value {
        let mut data = serde_json::json!({ "code": self.name().as_str() });
        if let RegistryError::StartFailed {
            failure,
            cause,
            diagnostic,
            ..
        } = self
        {
            data["failure"] = serde_json::to_value(failure).unwrap_or_default();
            data["diagnostic"] = serde_json::Value::String(diagnostic.clone());
            if let Some(cause) = cause {
                data["cause"] = serde_json::Value::String(cause.clone());
            }
        }
        if let RegistryError::Confined { limit, .. } = self {
            data["confinement"] = serde_json::json!({
                "write": limit.write,
                "network": limit.network,
            });
        }
        data
    }
}

/// A registry agent that did not resolve: cancelled, or a START_FAILED at the spawn stage
/// whose diagnostic gives the fixed facts, then what failed (and at which URL).
impl From<crate::catalog::ResolveError> for RegistryError {
    fn from(e: crate::catalog::ResolveError) -> Self {
        use acpd_protocol::diagnostic;
        use acpd_protocol::subagent::{Category, Stage};
        let (provider, e) = match e {
            crate::catalog::ResolveError::Cancelled { provider } => {
                return RegistryError::StartCancelled { provider };
            }
            crate::catalog::ResolveError::Failed { provider, source } => (provider, source),
        };
        let failure = Failure {
            stage: Stage::Spawn,
            category: Category::Spawn,
            code: None,
            exit_code: None,
            signal: None,
        };
        let facts = diagnostic::build(&diagnostic::Facts {
            provider: &provider,
            failure: Some(&failure),
            ..Default::default()
        });
        RegistryError::StartFailed {
            // The diagnostic already ends with what failed.
            cause: None,
            diagnostic: diagnostic::limit(format!("{facts}: {e}")),
            provider,
            failure: Box::new(failure),
            agent_error: None,
        }
    }
}
