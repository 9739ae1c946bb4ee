//! Why a tool call failed, with acpd's stable error names and codes (docs/src/run.md, "Typed start
//! errors") and, for the model that called it, what to do about it.

use std::path::PathBuf;

use acpd_protocol::envelope::RpcError;
use acpd_protocol::errors::ErrorName;
use serde_json::{Value, json};

use crate::registry::RegistryError;

#[derive(Debug, Clone)]
pub(super) enum Failure {
    /// The in-process registry refused.
    Registry(RegistryError),
    /// The daemon refused, with its typed error.
    Remote(RpcError),
    /// The daemon `acpd mcp` was using is gone (and with it every run it held).
    DaemonGone { path: PathBuf, detail: String },
    /// The tool's arguments do not fit its input schema.
    InvalidArguments(String),
    /// Something acpd mcp did not expect (a daemon answer it cannot read).
    Internal { detail: String },
}

impl Failure {
    /// The stable name: one of the table's, `DAEMON_GONE` or `INTERNAL`.
    pub(super) fn name(&self) -> String {
        match self {
            Failure::Registry(e) => e.name().as_str().to_string(),
            Failure::Remote(e) => e
                .data_value()
                .as_ref()
                .and_then(|d| d.get("code"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| ErrorName::from_code(e.code).map(|n| n.as_str().to_string()))
                .unwrap_or_else(|| "RPC_ERROR".to_string()),
            Failure::DaemonGone { .. } => "DAEMON_GONE".to_string(),
            Failure::InvalidArguments(_) => ErrorName::InvalidRequest.as_str().to_string(),
            Failure::Internal { .. } => "INTERNAL".to_string(),
        }
    }

    pub(super) fn code(&self) -> i64 {
        match self {
            Failure::Registry(e) => e.name().code(),
            Failure::Remote(e) => e.code,
            Failure::InvalidArguments(_) => ErrorName::InvalidRequest.code(),
            Failure::DaemonGone { .. } | Failure::Internal { .. } => {
                acpd_protocol::envelope::INTERNAL_ERROR
            }
        }
    }

    pub(super) fn message(&self) -> String {
        match self {
            Failure::Registry(e) => e.to_string(),
            Failure::Remote(e) => e.message.clone(),
            Failure::DaemonGone { path, detail } => format!(
                "the acpd daemon at {} is gone ({detail}); every run it held ended with it",
                path.display()
            ),
            Failure::InvalidArguments(reason) => format!("invalid arguments: {reason}"),
            Failure::Internal { detail } => detail.clone(),
        }
    }

    /// Structured facts beyond the name (a start failure's `failure` and `diagnostic`).
    fn data(&self) -> Option<Value> {
        match self {
            Failure::Registry(e) => Some(e.data()),
            Failure::Remote(e) => e.data_value(),
            _ => None,
        }
    }

    /// What the calling model should do next.
    pub(super) fn hint(&self, providers: &[String]) -> String {
        let list = if providers.is_empty() {
            "none is configured".to_string()
        } else {
            providers.join(", ")
        };
        match self.name().as_str() {
            "NO_PROVIDER" => format!(
                "Pass one of the configured providers as `provider` ({list}), or leave it out \
                 for the default; the `providers` tool describes each."
            ),
            "UNSUPPORTED_CAPABILITY" => {
                "Leave out the field this provider cannot enforce, or pick another provider.".into()
            }
            "UNSUPPORTED_SCHEMA" => "Give `outputSchema` as a self-contained JSON Schema object \
                                     (local `#/...` references only), or leave it out."
                .into(),
            "INVALID_CWD" => "Pass `cwd` as an existing directory (absolute, or relative to the \
                              directory acpd mcp runs in), or leave it out."
                .into(),
            "DEPTH_EXCEEDED" => {
                "Delegation depth is used up here: do this work yourself instead of delegating."
                    .into()
            }
            "CAPACITY" | "LIMIT" => "Too many subagents are live: wait for or dispose runs you no \
                                     longer need (subagent_wait, subagent_dispose), then retry."
                .into(),
            "START_FAILED" => "The agent could not be started (see the diagnostic). Try another \
                               provider, or tell the user; `acpd doctor` checks the setup."
                .into(),
            "START_CANCELLED" => {
                "The start was cancelled; start it again if it is still wanted.".into()
            }
            "UNKNOWN_RUN" => "Use a runId returned by subagent_start in this session; \
                              subagent_list shows the live ones."
                .into(),
            "RUN_BUSY" => "That run is still working: call subagent_wait first, then send.".into(),
            "RUN_ENDED" => "That run's agent is gone (disposed, or kept alive no longer): start \
                            a new run with subagent_start, giving it the context it needs."
                .into(),
            "INVALID_REQUEST" => {
                "Fix the arguments to match the tool's input schema and call it again.".into()
            }
            "NOT_PERMITTED" => "You run sandboxed, and a run you start is held to your sandbox: \
                                pick a provider with sandbox = \"landlock\" (and no network if \
                                you have none) and a `cwd` where you may write, or do the work \
                                yourself."
                .into(),
            "DAEMON_GONE" => "Start the daemon again (`acpd serve`, or `systemctl --user start \
                              acpd.socket`) and start new runs; runs from before are lost."
                .into(),
            _ => "This is unexpected; tell the user (acpd's log on stderr has the details).".into(),
        }
    }

    /// The `structuredContent` of the tool error.
    pub(super) fn to_json(&self, providers: &[String]) -> Value {
        let mut error = json!({
            "name": self.name(),
            "code": self.code(),
            "message": self.message(),
            "hint": self.hint(providers),
        });
        if let Some(data) = self.data() {
            error["data"] = data;
        }
        json!({ "error": error })
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.name(), self.code(), self.message())
    }
}
