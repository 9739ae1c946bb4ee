//! The file's raw TOML shape: every value kept with its span, so a later check can still name
//! the line.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::PermissionPolicy;

/// Raw file shape; unknown keys are rejected so typos do not silently become defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "the acpd config table")]
pub(super) struct RawConfig {
    pub(super) default_provider: Option<Spanned<String>>,
    pub(super) max_depth: Option<u32>,
    /// A `Value` because both `8388608` and `"8MiB"` are accepted.
    pub(super) max_output: Option<Spanned<toml::Value>>,
    pub(super) max_children: Option<Spanned<usize>>,
    pub(super) max_connections: Option<Spanned<usize>>,
    pub(super) max_connections_per_child: Option<Spanned<usize>>,
    pub(super) queue_timeout: Option<Spanned<String>>,
    pub(super) allow_group: Option<Spanned<String>>,
    pub(super) max_line: Option<Spanned<toml::Value>>,
    pub(super) line_timeout: Option<Spanned<String>>,
    pub(super) write_timeout: Option<Spanned<String>>,
    pub(super) max_sessions_per_connection: Option<Spanned<usize>>,
    pub(super) max_listed_sessions: Option<Spanned<usize>>,
    pub(super) max_pending_requests: Option<Spanned<usize>>,
    pub(super) detach_timeout: Option<Spanned<String>>,
    pub(super) registry_url: Option<Spanned<String>>,
    pub(super) trace_dir: Option<Spanned<String>>,
    pub(super) metrics_listen: Option<Spanned<String>>,
    pub(super) containment: Option<crate::supervise::ContainmentSetting>,
    pub(super) child_stderr: Option<crate::supervise::ChildStderrMode>,
    pub(super) listen: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) tls_cert: Option<Spanned<String>>,
    pub(super) tls_key: Option<Spanned<String>>,
    pub(super) allowed_origins: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) max_network_connections: Option<Spanned<usize>>,
    pub(super) max_connections_per_token: Option<Spanned<usize>>,
    pub(super) http_header_timeout: Option<Spanned<String>>,
    pub(super) http_idle_timeout: Option<Spanned<String>>,
    pub(super) http_keepalive: Option<Spanned<String>>,
    pub(super) requests_per_second: Option<Spanned<usize>>,
    #[serde(default)]
    pub(super) providers: BTreeMap<Spanned<String>, RawProvider>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a provider table")]
pub(super) struct RawProvider {
    pub(super) command: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) description: Option<String>,
    pub(super) cwd: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) env: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    pub(super) env_passthrough: Vec<Spanned<String>>,
    pub(super) env_file: Option<Spanned<String>>,
    pub(super) permission: Option<PermissionPolicy>,
    pub(super) handshake_timeout: Option<Spanned<String>>,
    pub(super) idle_timeout: Option<Spanned<String>>,
    pub(super) run_timeout: Option<Spanned<String>>,
    pub(super) cancel_grace: Option<Spanned<String>>,
    pub(super) keep_alive: Option<Spanned<String>>,
    pub(super) eof_grace: Option<Spanned<String>>,
    pub(super) term_grace: Option<Spanned<String>>,
    pub(super) max_concurrent: Option<Spanned<usize>>,
    pub(super) warm: Option<Spanned<usize>>,
    pub(super) warm_max_age: Option<Spanned<String>>,
    pub(super) preset: Option<Spanned<String>>,
    pub(super) registry: Option<Spanned<String>>,
    pub(super) auth_method: Option<Spanned<String>>,
    pub(super) offer_delegation: Option<bool>,
    pub(super) host: Option<Spanned<String>>,
    pub(super) ssh_options: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) remote_acpd: Option<Spanned<String>>,
    pub(super) launcher: Option<Spanned<Vec<Spanned<String>>>>,
    /// A `Value` because both `268435456` and `"256MiB"` are accepted.
    pub(super) memory_max: Option<Spanned<toml::Value>>,
    pub(super) pids_max: Option<Spanned<usize>>,
    pub(super) workspace: Option<super::WorkspaceMode>,
    pub(super) sandbox: Option<super::SandboxMode>,
    pub(super) network: Option<Spanned<bool>>,
    pub(super) budget: Option<RawBudget>,
    pub(super) tool_filter: Option<super::ToolFilterMode>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a budget table like { tokens = 100000, wall = \"30m\" }"
)]
pub(super) struct RawBudget {
    pub(super) tokens: Option<Spanned<u64>>,
    pub(super) wall: Option<Spanned<String>>,
}
