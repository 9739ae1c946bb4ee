//! Daemon configuration: discovery, parsing and validation of `config.toml`.
//!
//! Every field is deserialized wrapped in [`toml::Spanned`] so that validation
//! errors found after parsing (relative `cwd`, bad names, bad sizes…) can still
//! point at the exact line of the file, just like TOML's own syntax errors.
//! Providers are kept in a [`BTreeMap`], so iteration order is sorted by name.
//!
//! - [`types`]: the resolved [`Config`] and [`ProviderConfig`] the rest of acpd reads.
//! - [`defaults`]: the built-in config (only the echo provider) and each key's default.
//! - [`load`]: where the file is looked for and how it is read.
//! - [`schema`]: the raw TOML shape, every value still spanned.
//! - [`parse`]: the top-level keys, checked into a [`Config`].
//! - [`providers`]: one `[providers.NAME]` table, checked into a [`ProviderConfig`].
//! - [`validate`]: the value checks both share (sizes, durations, names).
//! - [`config_error`]: [`ConfigError`] and how a TOML error is pointed at its key and line.
//! - `hosts`, [`presets`], [`durations`]: remote providers, presets, duration bounds.
//! - [`network`]: the network face's keys (`listen`, TLS, origins, remote limits).
//! - [`suggest`]: did-you-mean for keys, presets and providers.

mod config_error;
mod defaults;
pub(crate) mod env_file;
pub(crate) use crate::durations;
mod hosts;
pub(crate) use hosts::{Remote, Via};
mod load;
pub(crate) mod network;
pub(crate) mod presets;
mod providers;
mod schema;
pub(crate) mod suggest;
mod top_level;
pub(crate) mod types;
mod validate;

pub(crate) use config_error::ConfigError;
pub(crate) use types::{
    Budget, Config, ProviderConfig, SandboxMode, ToolFilterMode, WorkspaceMode,
};

/// What acpd does with a child's `session/request_permission` calls (`forward`, `allow`,
/// `reject`): the pure policy of `acpd_protocol::permission`.
pub(crate) use acpd_protocol::permission::Policy as PermissionPolicy;
#[cfg(test)]
pub(crate) use hosts::SshHost;

#[cfg(test)]
mod tests;
