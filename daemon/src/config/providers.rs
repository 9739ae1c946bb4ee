//! One `[providers.NAME]` table checked into a [`ProviderConfig`]: its preset or registry
//! source, its command, then every other key over it.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use toml::Spanned;

use super::config_error::key_segment;
use super::env_file::EnvFile;
use super::presets::{self, PresetContext};
use super::schema::RawProvider;
use super::validate::{
    At, at_least_one, byte_size, check_env_name, is_provider_name, parse_duration,
};
use super::{ConfigError, ProviderConfig, hosts};

pub(super) fn build_provider(
    name: &Spanned<String>,
    mut raw: RawProvider,
    presets: &PresetContext,
    at: &At<'_>,
) -> Result<ProviderConfig, ConfigError> {
    let prefix = format!("providers.{}", key_segment(name.get_ref()));
    let key = |k: &str| format!("{prefix}.{k}");
    if !is_provider_name(name.get_ref()) {
        let msg = "provider names may only contain A-Z, a-z, 0-9, '_', '.' and '-'";
        return Err(at(name.span(), &prefix, msg));
    }
    // The preset first, so every key of the table (the command too) is applied over it.
    let mut provider = match raw.preset.take() {
        Some(preset) => {
            let Some(found) = presets::find(preset.get_ref()) else {
                let hint = super::suggest::did_you_mean(preset.get_ref(), presets::names())
                    .map_or_else(String::new, |h| format!("{h} "));
                let msg = format!(
                    "unknown preset {:?}; {hint}(valid: {})",
                    preset.get_ref(),
                    presets::names().join(", ")
                );
                return Err(at(preset.span(), &key("preset"), &msg));
            };
            if let Some(id) = &raw.registry {
                return Err(at(
                    id.span(),
                    &key("registry"),
                    "cannot be combined with `preset`",
                ));
            }
            found.provider(name.get_ref(), presets)
        }
        None => ProviderConfig::with_defaults(name.get_ref(), Vec::new()),
    };
    let Some(command) = raw.command.take() else {
        if let Some(id) = &raw.registry {
            if id.get_ref().is_empty() {
                return Err(at(id.span(), &key("registry"), "must name an agent id"));
            }
            provider.registry = Some(id.get_ref().clone());
        }
        if provider.preset.is_none() && provider.registry.is_none() {
            return Err(at(
                name.span(),
                &key("command"),
                "is required (or a `preset` or `registry` to fill it)",
            ));
        }
        return finish_provider(name, provider, raw, at);
    };
    let argv_err = match command.get_ref().first() {
        None => Some("must be a non-empty array of strings"),
        Some(program) if program.get_ref().is_empty() => {
            Some("the program (first element) must not be empty")
        }
        _ => None,
    };
    if let Some(msg) = argv_err {
        return Err(at(command.span(), &key("command"), msg));
    }
    if let Some(arg) = command
        .get_ref()
        .iter()
        .find(|a| a.get_ref().contains('\0'))
    {
        return Err(at(
            arg.span(),
            &key("command"),
            "arguments must not contain NUL",
        ));
    }
    provider.command = command
        .into_inner()
        .into_iter()
        .map(Spanned::into_inner)
        .collect();
    finish_provider(name, provider, raw, at)
}

/// Every key but `command`, over a provider that has its command (or its source).
pub(super) fn finish_provider(
    name: &Spanned<String>,
    mut provider: ProviderConfig,
    raw: RawProvider,
    at: &At<'_>,
) -> Result<ProviderConfig, ConfigError> {
    let prefix = format!("providers.{}", key_segment(name.get_ref()));
    let key = |k: &str| format!("{prefix}.{k}");
    if let Some(method) = raw.auth_method {
        provider.auth_method = Some(method.into_inner());
    }
    if let Some(offer) = raw.offer_delegation {
        provider.offer_delegation = offer;
    }
    if let Some(description) = raw.description {
        provider.description = description;
    }
    if let Some(cwd) = raw.cwd {
        // Relative paths would silently depend on wherever acpd happened to start.
        if !Path::new(cwd.get_ref()).is_absolute() || cwd.get_ref().contains('\0') {
            let msg = format!("must be an absolute path, got {:?}", cwd.get_ref());
            return Err(at(cwd.span(), &key("cwd"), &msg));
        }
        provider.cwd = Some(PathBuf::from(cwd.into_inner()));
    }
    for (k, v) in raw.env {
        let env_key = key(&format!("env.{}", key_segment(k.get_ref())));
        if let Err(msg) = check_env_name(k.get_ref()) {
            return Err(at(k.span(), &env_key, &msg));
        }
        if v.get_ref().contains('\0') {
            return Err(at(v.span(), &env_key, "values must not contain NUL"));
        }
        provider.env.insert(k.into_inner(), v.into_inner());
    }
    for name in raw.env_passthrough {
        if let Err(msg) = check_env_name(name.get_ref()) {
            return Err(at(name.span(), &key("env_passthrough"), &msg));
        }
        // Adds to a preset's names; a name listed twice is passed once.
        if !provider.env_passthrough.contains(name.get_ref()) {
            provider.env_passthrough.push(name.into_inner());
        }
    }
    if let Some(file) = raw.env_file {
        let parsed = EnvFile::parse(file.get_ref());
        provider.env_file = Some(parsed.map_err(|msg| at(file.span(), &key("env_file"), &msg))?);
    }
    if let Some(permission) = raw.permission {
        provider.permission = permission;
    }
    provider.remote = hosts::remote(
        &provider,
        raw.host,
        raw.ssh_options,
        raw.remote_acpd,
        raw.launcher,
        &key,
        at,
    )?;
    if provider.remote.is_some() && provider.env_file.is_some() {
        let msg = "is read on this host, and a host/launcher provider's agent runs on another: \
                   give the far side its own credentials (or pass them with env_passthrough)";
        return Err(at(name.span(), &key("env_file"), msg));
    }
    let dur = |value: Option<Spanned<String>>, k: &str, default: Duration| {
        value.map_or(Ok(default), |v| parse_duration(&v, &key(k), at))
    };
    let handshake = provider.handshake_timeout;
    provider.handshake_timeout = dur(raw.handshake_timeout, "handshake_timeout", handshake)?;
    let none_if_zero = |d: Duration| (!d.is_zero()).then_some(d);
    let idle = provider.idle_timeout.unwrap_or_default();
    provider.idle_timeout = none_if_zero(dur(raw.idle_timeout, "idle_timeout", idle)?);
    provider.run_timeout = none_if_zero(dur(raw.run_timeout, "run_timeout", Duration::ZERO)?);
    provider.cancel_grace = dur(raw.cancel_grace, "cancel_grace", provider.cancel_grace)?;
    provider.keep_alive = dur(raw.keep_alive, "keep_alive", provider.keep_alive)?;
    provider.eof_grace = dur(raw.eof_grace, "eof_grace", provider.eof_grace)?;
    provider.term_grace = dur(raw.term_grace, "term_grace", provider.term_grace)?;
    if let Some(max) = raw.max_concurrent {
        provider.max_concurrent = at_least_one(max, &key("max_concurrent"), at)?;
    }
    if let Some(warm) = raw.warm {
        if *warm.get_ref() > provider.max_concurrent {
            let msg = format!(
                "must not exceed max_concurrent ({}), got {}",
                provider.max_concurrent,
                warm.get_ref()
            );
            return Err(at(warm.span(), &key("warm"), &msg));
        }
        provider.warm = warm.into_inner();
    }
    if let Some(age) = raw.warm_max_age {
        let d = parse_duration(&age, &key("warm_max_age"), at)?;
        if d.is_zero() {
            return Err(at(
                age.span(),
                &key("warm_max_age"),
                "must be longer than 0s",
            ));
        }
        provider.warm_max_age = d;
    }
    if let Some(value) = raw.memory_max {
        let bytes = byte_size(&value).map_err(|msg| at(value.span(), &key("memory_max"), &msg))?;
        provider.memory_max = Some(bytes as u64);
    }
    if let Some(max) = raw.pids_max {
        provider.pids_max = Some(at_least_one(max, &key("pids_max"), at)? as u64);
    }
    if let Some(workspace) = raw.workspace {
        provider.workspace = workspace;
    }
    if let Some(sandbox) = raw.sandbox {
        provider.sandbox = sandbox;
    }
    if provider.remote.is_some() && provider.sandbox != super::SandboxMode::None {
        // The local process is only ssh or the launcher; the far side is not this kernel's.
        return Err(at(
            name.span(),
            &key("sandbox"),
            "cannot sandbox a remote provider (`host`/`launcher`): its agent runs on another kernel",
        ));
    }
    if let Some(mode) = raw.tool_filter {
        provider.tool_filter = mode;
    }
    if let Some(network) = raw.network {
        if !*network.get_ref() && provider.sandbox == super::SandboxMode::None {
            return Err(at(
                network.span(),
                &key("network"),
                "`network = false` needs `sandbox = \"landlock\"` or `\"auto\"` to enforce it",
            ));
        }
        provider.network = network.into_inner();
    }
    if let Some(budget) = raw.budget {
        if let Some(tokens) = budget.tokens {
            if *tokens.get_ref() == 0 {
                let msg = "must be at least 1 (leave `tokens` out for no token budget)";
                return Err(at(tokens.span(), &key("budget.tokens"), msg));
            }
            provider.budget.tokens = Some(tokens.into_inner());
        }
        if let Some(wall) = budget.wall {
            let d = parse_duration(&wall, &key("budget.wall"), at)?;
            if d.is_zero() {
                let msg = "must be longer than 0s (leave `wall` out for no time budget)";
                return Err(at(wall.span(), &key("budget.wall"), msg));
            }
            provider.budget.wall = Some(d);
        }
    }
    Ok(provider)
}
