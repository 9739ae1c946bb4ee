//! The built-in config (only the echo provider) and the default of every key.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use super::{Config, PermissionPolicy, ProviderConfig};

const ECHO: &str = "echo";
pub(super) const ECHO_DESCRIPTION: &str = "Built-in scripted ACP agent (acpd agent echo)";
pub(super) const ETC_CONFIG: &str = "/etc/acpd/config.toml";
/// The official ACP Registry's aggregate document.
pub(crate) const DEFAULT_REGISTRY_URL: &str =
    "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json";

impl ProviderConfig {
    /// A provider with every optional key at its default; `builtin` is false.
    pub fn with_defaults(name: &str, command: Vec<String>) -> Self {
        ProviderConfig {
            name: name.to_owned(),
            command,
            description: String::new(),
            cwd: None,
            env: BTreeMap::new(),
            env_passthrough: Vec::new(),
            env_file: None,
            permission: PermissionPolicy::Forward,
            handshake_timeout: Duration::from_secs(60),
            idle_timeout: Some(Duration::from_secs(600)),
            run_timeout: None,
            cancel_grace: Duration::from_secs(2),
            keep_alive: Duration::from_secs(600),
            eof_grace: Duration::from_secs(2),
            term_grace: Duration::from_secs(3),
            max_concurrent: 64,
            warm: 0,
            warm_max_age: Duration::from_secs(30 * 60),
            preset: None,
            registry: None,
            auth_method: None,
            offer_delegation: false,
            remote: None,
            memory_max: None,
            pids_max: None,
            workspace: Default::default(),
            sandbox: Default::default(),
            network: true,
            budget: Default::default(),
            tool_filter: Default::default(),
            builtin: false,
        }
    }
}

impl Config {
    /// Built-in defaults: only the echo provider.
    pub fn builtin(echo_command: Vec<String>) -> Config {
        let mut echo = ProviderConfig::with_defaults(ECHO, echo_command);
        echo.description = ECHO_DESCRIPTION.to_owned();
        echo.builtin = true;
        Config {
            source: None,
            default_provider: ECHO.to_owned(),
            max_depth: 2,
            max_output: 8 * 1024 * 1024,
            max_children: 256,
            max_connections: 64,
            max_connections_per_child: 8,
            queue_timeout: None,
            allow_group: None,
            max_line: acpd_protocol::codec::DEFAULT_MAX_LINE,
            line_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_sessions_per_connection: 16,
            max_listed_sessions: 1000,
            max_pending_requests: 64,
            detach_timeout: Some(Duration::from_secs(600)),
            registry_url: DEFAULT_REGISTRY_URL.to_owned(),
            trace_dir: None,
            metrics_listen: None,
            containment: Default::default(),
            child_stderr: None,
            network: Default::default(),
            providers: BTreeMap::from([(ECHO.to_owned(), Arc::new(echo))]),
        }
    }
}
