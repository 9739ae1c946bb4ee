//! The top-level keys: the raw table checked into a [`Config`], over the built-in defaults.

use std::{
    ops::Range,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::config_error::{line_of, toml_error};
use super::presets::PresetContext;
use super::providers::build_provider;
use super::schema::RawConfig;
use super::validate::{at_least_one, byte_size, parse_duration};
use super::{Config, ConfigError};

impl Config {
    /// Parses and validates text as if read from `path`; presets expand in this process's
    /// context (its data directory and uid).
    pub fn parse(
        text: &str,
        path: &Path,
        echo_command: Vec<String>,
    ) -> Result<Config, ConfigError> {
        Self::parse_in(text, path, echo_command, &PresetContext::from_env())
    }

    /// [`Config::parse`] with presets expanded in `presets` (for testing).
    pub fn parse_in(
        text: &str,
        path: &Path,
        echo_command: Vec<String>,
        presets: &PresetContext,
    ) -> Result<Config, ConfigError> {
        Self::checked(text, path, echo_command, presets).map_err(|e| e.with_line_of(text))
    }

    fn checked(
        text: &str,
        path: &Path,
        echo_command: Vec<String>,
        presets: &PresetContext,
    ) -> Result<Config, ConfigError> {
        let mut raw: RawConfig = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
        let at = |span: Range<usize>, key: &str, message: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: Some(line_of(text, span.start)),
            key: key.to_owned(),
            message: message.to_owned(),
            text: None,
        };
        let mut config = Self::builtin(echo_command);
        config.source = Some(path.to_path_buf());
        config.network = super::network::build(super::network::RawNetwork::take(&mut raw), &at)?;
        if let Some(depth) = raw.max_depth {
            config.max_depth = depth;
        }
        if let Some(containment) = raw.containment {
            config.containment = containment;
        }
        config.child_stderr = raw.child_stderr;
        if let Some(value) = raw.max_output {
            config.max_output =
                byte_size(&value).map_err(|msg| at(value.span(), "max_output", &msg))?;
        }
        if let Some(value) = raw.max_line {
            config.max_line =
                byte_size(&value).map_err(|msg| at(value.span(), "max_line", &msg))?;
        }
        for (raw, key, slot) in [
            (raw.line_timeout, "line_timeout", &mut config.line_timeout),
            (
                raw.write_timeout,
                "write_timeout",
                &mut config.write_timeout,
            ),
        ] {
            if let Some(text) = raw {
                let d = parse_duration(&text, key, &at)?;
                if d.is_zero() {
                    return Err(at(text.span(), key, "must be longer than 0s"));
                }
                *slot = d;
            }
        }
        if let Some(n) = raw.max_sessions_per_connection {
            config.max_sessions_per_connection =
                at_least_one(n, "max_sessions_per_connection", &at)?;
        }
        if let Some(n) = raw.max_listed_sessions {
            config.max_listed_sessions = at_least_one(n, "max_listed_sessions", &at)?;
        }
        if let Some(n) = raw.max_pending_requests {
            config.max_pending_requests = at_least_one(n, "max_pending_requests", &at)?;
        }
        if let Some(children) = raw.max_children {
            config.max_children = at_least_one(children, "max_children", &at)?;
        }
        if let Some(connections) = raw.max_connections {
            config.max_connections = at_least_one(connections, "max_connections", &at)?;
        }
        if let Some(per_child) = raw.max_connections_per_child {
            config.max_connections_per_child =
                at_least_one(per_child, "max_connections_per_child", &at)?;
        }
        if let Some(wait) = raw.queue_timeout {
            let d = parse_duration(&wait, "queue_timeout", &at)?;
            config.queue_timeout = (!d.is_zero()).then_some(d);
        }
        if let Some(url) = raw.registry_url {
            let u = url.get_ref();
            if !(u.starts_with("https://") || u.starts_with("http://") || u.starts_with("file://"))
            {
                return Err(at(
                    url.span(),
                    "registry_url",
                    "must be an http(s):// or file:// URL",
                ));
            }
            config.registry_url = url.into_inner();
        }
        if let Some(dir) = raw.trace_dir {
            if !Path::new(dir.get_ref()).is_absolute() {
                let msg = format!("must be an absolute path, got {:?}", dir.get_ref());
                return Err(at(dir.span(), "trace_dir", &msg));
            }
            config.trace_dir = Some(PathBuf::from(dir.into_inner()));
        }
        if let Some(addr) = raw.metrics_listen {
            config.metrics_listen = Some(
                metrics_address(addr.get_ref())
                    .map_err(|m| at(addr.span(), "metrics_listen", &m))?,
            );
        }
        if let Some(wait) = raw.detach_timeout {
            let d = parse_duration(&wait, "detach_timeout", &at)?;
            config.detach_timeout = (!d.is_zero()).then_some(d);
        }
        if let Some(group) = raw.allow_group {
            if group.get_ref().is_empty() {
                return Err(at(group.span(), "allow_group", "must name a group"));
            }
            config.allow_group = Some(group.into_inner());
        }
        for (name, raw_provider) in raw.providers {
            let provider = build_provider(&name, raw_provider, presets, &at)?;
            config
                .providers
                .insert(provider.name.clone(), Arc::new(provider));
        }
        if let Some(default) = raw.default_provider {
            if !config.providers.contains_key(default.get_ref()) {
                let msg = format!(
                    "no provider named {:?}; {}",
                    default.get_ref(),
                    super::suggest::unknown_provider(&config, default.get_ref())
                );
                return Err(at(default.span(), "default_provider", &msg));
            }
            config.default_provider = default.into_inner();
        }
        Ok(config)
    }
}

/// `metrics_listen`: an IP address and a port, never a host name (nothing is resolved).
fn metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!(
            "must be an IP address and port like \"127.0.0.1:9464\" or \"[::1]:9464\", got {text:?}"
        )
    })
}
