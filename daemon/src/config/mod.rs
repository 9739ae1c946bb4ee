//! Daemon configuration: discovery, parsing and validation of `config.toml`.
//!
//! Every field is deserialized wrapped in [`toml::Spanned`] so that validation
//! errors found after parsing (relative `cwd`, bad names, bad sizes…) can still
//! point at the exact line of the file, just like TOML's own syntax errors.
//! Providers are kept in a [`BTreeMap`], so iteration order is sorted by name.

use std::{
    collections::BTreeMap,
    io,
    ops::Range,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::Deserialize;
use toml::Spanned;

pub use crate::durations;
mod hosts;
pub use hosts::{Remote, SshHost, Via};
pub mod presets;

use presets::PresetContext;

const ECHO: &str = "echo";
const ECHO_DESCRIPTION: &str = "Built-in scripted ACP agent (acpd agent echo)";
const ETC_CONFIG: &str = "/etc/acpd/config.toml";
/// The official ACP Registry's aggregate document.
pub const DEFAULT_REGISTRY_URL: &str =
    "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json";

/// What acpd does with a child's `session/request_permission` calls (`forward`, `allow`,
/// `reject`): the pure policy of `acpd_protocol::permission`.
pub use acpd_protocol::permission::Policy as PermissionPolicy;

/// One child agent acpd knows how to start, fully resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub name: String,
    /// argv, executed directly (never through a shell) so arguments need no quoting.
    pub command: Vec<String>,
    pub description: String,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub env_passthrough: Vec<String>,
    pub permission: PermissionPolicy,
    pub handshake_timeout: Duration,
    /// `None` when configured as `"0s"`: no idle limit.
    pub idle_timeout: Option<Duration>,
    /// `None` when configured as `"0s"`: no wall-clock limit.
    pub run_timeout: Option<Duration>,
    pub cancel_grace: Duration,
    pub keep_alive: Duration,
    pub eof_grace: Duration,
    pub term_grace: Duration,
    pub max_concurrent: usize,
    /// Children kept spawned and initialized ahead of bridge sessions (`warm`).
    pub warm: usize,
    /// A spare older than this is replaced by a fresh one.
    pub warm_max_age: Duration,
    /// The preset this provider was filled from (`preset = "codex"`), if any.
    pub preset: Option<String>,
    /// An agent id in the ACP Registry (`registry = "ID"`): its command is resolved from the
    /// registry document when the provider is started, `command` is then empty.
    pub registry: Option<String>,
    /// The advertised auth method acpd calls `authenticate` with after `initialize`.
    pub auth_method: Option<String>,
    /// Offer acpd itself to this provider's sessions as the MCP server `acpd` (`acpd mcp`), so
    /// the agent can delegate in turn; its runs are nested under the session that made them.
    pub offer_delegation: bool,
    /// Where the command runs when not on this host (`host` / `launcher`, `ssh_options`,
    /// `remote_acpd`): behind ssh or a launcher, under `acpd supervise` on the far side.
    pub remote: Option<Remote>,
    /// `memory_max` in bytes: the child's cgroup `memory.max` (cgroup containment with the
    /// memory controller enabled; otherwise a warning at start).
    pub memory_max: Option<u64>,
    /// `pids_max`: the child's cgroup `pids.max` (likewise, with the pids controller).
    pub pids_max: Option<u64>,
    /// True only for the built-in echo provider, so callers can tell it was not configured.
    pub builtin: bool,
}

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
            builtin: false,
        }
    }
}

/// The whole daemon configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file loaded, `None` for built-in defaults.
    pub source: Option<PathBuf>,
    pub default_provider: String,
    pub max_depth: u32,
    /// Per-turn output cap in bytes.
    pub max_output: usize,
    pub max_children: usize,
    /// (`acpd serve`) Connections served at once; the next one gets one LIMIT error line.
    pub max_connections: usize,
    /// Connections from inside one child's process tree at once (its delegating `acpd mcp`s),
    /// so one child cannot take every `max_connections` slot and lock editors out.
    pub max_connections_per_child: usize,
    /// How long a start waits for a free slot when a limit is reached; `None` fails at once.
    pub queue_timeout: Option<Duration>,
    /// A group whose members may connect to a system-wide daemon's socket besides its own user.
    pub allow_group: Option<String>,
    /// The longest line acpd reads from a parent or a child, in bytes.
    pub max_line: usize,
    /// How long an unterminated line may wait for the rest of it before it is dropped.
    pub line_timeout: Duration,
    /// How long one write to a parent or a child may wait before that peer counts as gone.
    pub write_timeout: Duration,
    /// Bridge sessions and live runs one parent connection may hold at once.
    pub max_sessions_per_connection: usize,
    /// Rows of one provider's agent listing the session map keeps (the newest); more are
    /// neither read nor kept, so an agent listing without end cannot grow the map.
    pub max_listed_sessions: usize,
    /// Unanswered requests one parent connection may have outstanding.
    pub max_pending_requests: usize,
    /// (`acpd serve`) How long a bridge session outlives the editor connection that held it,
    /// waiting to be loaded again; `None` (`"0s"`): it ends with the connection.
    pub detach_timeout: Option<Duration>,
    /// Where the ACP Registry document is fetched from (`registry = "ID"` providers).
    pub registry_url: String,
    /// Where traffic traces are written (`trace_dir`, `--trace DIR`); `None`: no traces.
    pub trace_dir: Option<PathBuf>,
    /// How children are contained (`containment`): cgroups, process groups, or `auto`. Read
    /// at start only; a reload that changes it takes effect at the next start.
    pub containment: crate::supervise::ContainmentSetting,
    /// Where children's stderr goes (`child_stderr`); `None`: the command's default (`acpd
    /// stdio` forwards it to its own stderr, `acpd serve` only logs it). Read at start.
    pub child_stderr: Option<crate::supervise::ChildStderrMode>,
    /// Sorted by name (the built-in echo is just the entry named `echo`).
    pub providers: BTreeMap<String, Arc<ProviderConfig>>,
}

/// Everything that can go wrong finding, reading or validating the config.
///
/// Each variant carries the file path so the operator knows which file to fix
/// even when several candidate locations exist.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file was named explicitly (flag or `ACPD_CONFIG`) but is absent;
    /// silently falling back to defaults would hide a typo.
    #[error("{}: config file named by {origin} does not exist", path.display())]
    Missing { path: PathBuf, origin: &'static str },
    #[error("{}: cannot read config file: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// `line` is 1-based; `None` only if TOML reported no position at all.
    #[error("{}:{}: {key}: {message}", path.display(), line.map_or_else(|| "?".to_owned(), |l| l.to_string()))]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        key: String,
        message: String,
    },
}

impl ConfigError {
    /// The config file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Missing { path, .. }
            | ConfigError::Read { path, .. }
            | ConfigError::Invalid { path, .. } => path,
        }
    }
}

/// Raw file shape; unknown keys are rejected so typos do not silently become defaults.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "the acpd config table")]
struct RawConfig {
    default_provider: Option<Spanned<String>>,
    max_depth: Option<u32>,
    /// A `Value` because both `8388608` and `"8MiB"` are accepted.
    max_output: Option<Spanned<toml::Value>>,
    max_children: Option<Spanned<usize>>,
    max_connections: Option<Spanned<usize>>,
    max_connections_per_child: Option<Spanned<usize>>,
    queue_timeout: Option<Spanned<String>>,
    allow_group: Option<Spanned<String>>,
    max_line: Option<Spanned<toml::Value>>,
    line_timeout: Option<Spanned<String>>,
    write_timeout: Option<Spanned<String>>,
    max_sessions_per_connection: Option<Spanned<usize>>,
    max_listed_sessions: Option<Spanned<usize>>,
    max_pending_requests: Option<Spanned<usize>>,
    detach_timeout: Option<Spanned<String>>,
    registry_url: Option<Spanned<String>>,
    trace_dir: Option<Spanned<String>>,
    containment: Option<crate::supervise::ContainmentSetting>,
    child_stderr: Option<crate::supervise::ChildStderrMode>,
    #[serde(default)]
    providers: BTreeMap<Spanned<String>, RawProvider>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a provider table")]
struct RawProvider {
    command: Option<Spanned<Vec<Spanned<String>>>>,
    description: Option<String>,
    cwd: Option<Spanned<String>>,
    #[serde(default)]
    env: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    env_passthrough: Vec<Spanned<String>>,
    permission: Option<PermissionPolicy>,
    handshake_timeout: Option<Spanned<String>>,
    idle_timeout: Option<Spanned<String>>,
    run_timeout: Option<Spanned<String>>,
    cancel_grace: Option<Spanned<String>>,
    keep_alive: Option<Spanned<String>>,
    eof_grace: Option<Spanned<String>>,
    term_grace: Option<Spanned<String>>,
    max_concurrent: Option<Spanned<usize>>,
    warm: Option<Spanned<usize>>,
    warm_max_age: Option<Spanned<String>>,
    preset: Option<Spanned<String>>,
    registry: Option<Spanned<String>>,
    auth_method: Option<Spanned<String>>,
    offer_delegation: Option<bool>,
    host: Option<Spanned<String>>,
    ssh_options: Option<Spanned<Vec<Spanned<String>>>>,
    remote_acpd: Option<Spanned<String>>,
    launcher: Option<Spanned<Vec<Spanned<String>>>>,
    /// A `Value` because both `268435456` and `"256MiB"` are accepted.
    memory_max: Option<Spanned<toml::Value>>,
    pids_max: Option<Spanned<usize>>,
}

/// A byte size: an integer, or a string like `"8MiB"`; at least 1.
fn byte_size(value: &Spanned<toml::Value>) -> Result<usize, String> {
    let size = match value.get_ref() {
        toml::Value::Integer(n) => {
            usize::try_from(*n).map_err(|_| format!("must not be negative, got {n}"))
        }
        toml::Value::String(s) => parse_size(s),
        other => Err(format!(
            "expected a byte size like \"8MiB\", got a {}",
            other.type_str()
        )),
    };
    size.and_then(|n| {
        if n == 0 {
            Err("must be at least 1 byte".to_owned())
        } else {
            Ok(n)
        }
    })
}

impl Config {
    /// The wire limits every connection and child of this config uses.
    pub fn wire_limits(&self) -> crate::wire::WireLimits {
        crate::wire::WireLimits {
            max_line: self.max_line,
            line_timeout: self.line_timeout,
            write_timeout: self.write_timeout,
        }
    }

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
            containment: Default::default(),
            child_stderr: None,
            providers: BTreeMap::from([(ECHO.to_owned(), Arc::new(echo))]),
        }
    }

    /// Finds the file per the discovery order (reads env vars `ACPD_CONFIG`,
    /// `XDG_CONFIG_HOME`, `HOME`) and loads it, or returns [`Config::builtin`].
    pub fn load(explicit: Option<&Path>, echo_command: Vec<String>) -> Result<Config, ConfigError> {
        // A path whose existence cannot be determined (e.g. permission denied on
        // a parent) counts as existing, so the read reports the real cause.
        let exists = |p: &Path| p.try_exists().unwrap_or(true);
        match Self::discover(explicit, |k| std::env::var(k).ok(), exists)? {
            None => Ok(Self::builtin(echo_command)),
            Some(path) => {
                let text = read_regular(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Self::parse(&text, &path, echo_command)
            }
        }
    }

    /// The discovery order, as a pure function of the given env lookups, for testing.
    ///
    /// Empty variables count as unset. A relative `XDG_CONFIG_HOME` is ignored,
    /// as the XDG Base Directory spec requires, and `$HOME/.config` is used instead.
    pub fn discover(
        explicit: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        exists: impl Fn(&Path) -> bool,
    ) -> Result<Option<PathBuf>, ConfigError> {
        let var = |k: &str| env(k).filter(|v| !v.is_empty());
        let named = explicit
            .map(|p| (p.to_path_buf(), "--config"))
            .or_else(|| var("ACPD_CONFIG").map(|v| (PathBuf::from(v), "ACPD_CONFIG")));
        if let Some((path, origin)) = named {
            return if exists(&path) {
                Ok(Some(path))
            } else {
                Err(ConfigError::Missing { path, origin })
            };
        }
        let user_dir = var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".config")));
        let user = user_dir.map(|d| d.join("acpd").join("config.toml"));
        let mut candidates = user.into_iter().chain([PathBuf::from(ETC_CONFIG)]);
        Ok(candidates.find(|p| exists(p)))
    }

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
        let raw: RawConfig = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
        let at = |span: Range<usize>, key: &str, message: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: Some(line_of(text, span.start)),
            key: key.to_owned(),
            message: message.to_owned(),
        };
        let mut config = Self::builtin(echo_command);
        config.source = Some(path.to_path_buf());
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
                let known: Vec<&str> = config.providers.keys().map(String::as_str).collect();
                let msg = format!(
                    "no provider named {:?} (known: {})",
                    default.get_ref(),
                    known.join(", ")
                );
                return Err(at(default.span(), "default_provider", &msg));
            }
            config.default_provider = default.into_inner();
        }
        Ok(config)
    }

    /// Looks a provider up by its configured name.
    pub fn provider(&self, name: &str) -> Option<&Arc<ProviderConfig>> {
        self.providers.get(name)
    }
}

/// Builds an [`ConfigError::Invalid`] from a span, key and message.
type At<'a> = dyn Fn(Range<usize>, &str, &str) -> ConfigError + 'a;

fn build_provider(
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
                let msg = format!(
                    "unknown preset {:?} (valid: {})",
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
fn finish_provider(
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
    Ok(provider)
}

impl ProviderConfig {
    /// The provider's cgroup limits for each child it starts.
    pub fn child_limits(&self) -> crate::supervise::ChildLimits {
        crate::supervise::ChildLimits {
            memory_max: self.memory_max,
            pids_max: self.pids_max,
        }
    }
}

impl Config {
    /// True when any provider sets `memory_max` or `pids_max`.
    pub fn wants_limits(&self) -> bool {
        self.providers
            .values()
            .any(|p| p.memory_max.is_some() || p.pids_max.is_some())
    }
}

fn parse_duration(
    value: &Spanned<String>,
    key: &str,
    at: &At<'_>,
) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.get_ref())
        .map_err(|e| {
            format!(
                "invalid duration {:?} (like \"90s\" or \"10m\"): {e}",
                value.get_ref()
            )
        })
        .and_then(|d| durations::check(d, value.get_ref()))
        .map_err(|msg| at(value.span(), key, &msg))
}

/// The most a config file may hold; a larger one is refused rather than read into memory.
const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Reads the config file, refusing anything but a regular file: a FIFO nobody writes (or a
/// device) would block the read forever or never end. Opened with `O_NONBLOCK` so the open
/// itself cannot block on a FIFO, then checked with `fstat` on what was opened.
fn read_regular(path: &Path) -> io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (it is {what}); point acpd at a regular file"),
        ));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    Ok(text)
}

/// Zero would make the limit unusable (nothing could ever start), so it is rejected.
fn at_least_one(value: Spanned<usize>, key: &str, at: &At<'_>) -> Result<usize, ConfigError> {
    match *value.get_ref() {
        0 => Err(at(value.span(), key, "must be at least 1")),
        n => Ok(n),
    }
}

/// Byte size: a plain integer, or an integer followed by a unit
/// (B, KB, KiB, MB, MiB, GB, GiB; case-insensitive, optional space between).
/// Fractions are not accepted, so the result is always exact.
fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: usize = match number.parse() {
        Ok(n) => n,
        Err(_) if number.is_empty() => return Err(format!("{text:?} is not a byte size")),
        Err(_) => return Err(format!("{text:?} is too large")),
    };
    let multiplier: usize = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" => 1 << 10,
        "mb" => 1000 * 1000,
        "mib" => 1 << 20,
        "gb" => 1000 * 1000 * 1000,
        "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "unknown unit {unit:?}; use B, KB, KiB, MB, MiB, GB or GiB"
            ));
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// True when `s` is non-empty and made of ASCII alphanumerics and `extra`.
fn only(s: &str, extra: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
}

fn is_provider_name(name: &str) -> bool {
    only(name, "_.-")
}

/// Names that `setenv`/`Command::env` would reject or mangle.
fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['=', '\0']) {
        Err(format!(
            "invalid environment variable name {name:?}: must be non-empty without '=' or NUL"
        ))
    } else {
        Ok(())
    }
}

/// Renders one key of a dotted path, quoting it when TOML would need quotes.
fn key_segment(key: &str) -> String {
    let bare = only(key, "_-");
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Converts a TOML syntax or deserialization error, recovering the dotted key.
///
/// `toml` keeps the key path private but prints it as "in `a.b`" when no input
/// is attached, so it is read back from that rendering. Unknown-field errors
/// name the offending field only in the message. Syntax errors carry no path,
/// so the key is reconstructed from the source line as a best effort.
fn toml_error(path: &Path, text: &str, err: &toml::de::Error) -> ConfigError {
    let mut bare = err.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    let table = shown
        .strip_prefix(err.message())
        .and_then(|rest| rest.trim().strip_prefix("in `"))
        .and_then(|rest| rest.strip_suffix('`'))
        .map(str::to_owned);
    let unknown = err
        .message()
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next());
    let offset = err.span().map(|s| s.start);
    let key = match (table, unknown) {
        (Some(table), Some(field)) => format!("{table}.{field}"),
        (Some(table), None) => table,
        (None, Some(field)) => field.to_owned(),
        (None, None) => offset.map_or_else(|| "(document)".to_owned(), |o| key_near(text, o)),
    };
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line: offset.map(|o| line_of(text, o)),
        key,
        message: err.message().replace('\n', " "),
    }
}

/// Best-effort dotted key for a syntax error at `offset`: a table header on
/// that line, else the key left of `=` inside the enclosing table.
fn key_near(text: &str, offset: usize) -> String {
    let line_index = line_of(text, offset) - 1;
    let lines: Vec<&str> = text.lines().collect();
    let Some(line) = lines.get(line_index) else {
        return "(document)".to_owned();
    };
    if let Some(header) = table_header(line) {
        return header.to_owned();
    }
    let enclosing = lines[..line_index]
        .iter()
        .rev()
        .find_map(|l| table_header(l));
    let local = line
        .split('=')
        .next()
        .map(str::trim)
        .filter(|k| looks_like_key(k));
    match (enclosing, local) {
        (Some(table), Some(k)) => format!("{table}.{k}"),
        (None, Some(k)) => k.to_owned(),
        (Some(table), None) => table.to_owned(),
        (None, None) => "(document)".to_owned(),
    }
}

fn table_header(line: &str) -> Option<&str> {
    let line = line.split('#').next()?.trim();
    let inner = line.strip_prefix('[')?.strip_suffix(']')?;
    let inner = inner
        .strip_prefix('[')
        .and_then(|i| i.strip_suffix(']'))
        .unwrap_or(inner);
    let inner = inner.trim();
    looks_like_key(inner).then_some(inner)
}

fn looks_like_key(key: &str) -> bool {
    only(key, "_-.\"' ")
}

#[cfg(test)]
mod tests;
