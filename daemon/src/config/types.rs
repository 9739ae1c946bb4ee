//! The resolved configuration: what the rest of acpd reads once the file is checked.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use super::PermissionPolicy;

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
    /// `env_file`: a `KEY=VALUE` file read at each spawn, its variables added to the child's.
    pub env_file: Option<super::env_file::EnvFile>,
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
    pub remote: Option<super::Remote>,
    /// `memory_max` in bytes: the child's cgroup `memory.max` (cgroup containment with the
    /// memory controller enabled; otherwise a warning at start).
    pub memory_max: Option<u64>,
    /// `pids_max`: the child's cgroup `pids.max` (likewise, with the pids controller).
    pub pids_max: Option<u64>,
    /// Where the child works (`workspace`): the cwd itself, or a git worktree of it per child.
    pub workspace: WorkspaceMode,
    /// What the child may write and read (`sandbox`), enforced by the kernel (Landlock).
    pub sandbox: SandboxMode,
    /// `network = false`: a sandboxed child may neither bind nor connect TCP (Landlock ABI 4+).
    pub network: bool,
    /// `budget`: what one run of it (its nested runs included) may spend.
    pub budget: Budget,
    /// How this provider's agent takes a run's `toolFilter` (`tool_filter`); `none`: it does
    /// not, and a start that asks for one is refused.
    pub tool_filter: ToolFilterMode,
    /// True only for the built-in echo provider, so callers can tell it was not configured.
    pub builtin: bool,
}

/// `workspace = "shared" | "worktree"`: the default of each start, and whether a request may
/// ask for a worktree (only where the provider says `worktree`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// The child works in the cwd it is given, as everyone else does.
    #[default]
    Shared,
    /// Each child gets its own git worktree of the cwd's repository on a branch of its own.
    Worktree,
}

/// `budget = { tokens = N, wall = "30m" }`: the most a run may spend, and the most a start
/// request may ask for. `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    /// Tokens the agent reports, summed over the run's turns and its nested runs.
    pub tokens: Option<u64>,
    /// Wall-clock time from the run's start, across turns.
    pub wall: Option<Duration>,
}

/// `tool_filter = "none" | "claude-meta"`: the mechanism, checked in the agent's own code, by
/// which acpd hands a run's tool filter to the agent at session creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolFilterMode {
    #[default]
    None,
    /// claude-agent-acp: `session/new`'s `_meta.claudeCode.options` `tools` and
    /// `disallowedTools`, passed to the Claude Agent SDK.
    ClaudeMeta,
}

/// `sandbox = "none" | "landlock" | "auto"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    #[default]
    None,
    /// Landlock, or the start fails where the kernel cannot enforce it.
    Landlock,
    /// Landlock where the kernel can enforce it, else none (with a warning).
    Auto,
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
    /// (`acpd serve`) Where `/metrics` is served over HTTP (`metrics_listen`); `None`: nowhere.
    /// Read at start only.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How children are contained (`containment`): cgroups, process groups, or `auto`. Read
    /// at start only; a reload that changes it takes effect at the next start.
    pub containment: crate::supervise::ContainmentSetting,
    /// Where children's stderr goes (`child_stderr`); `None`: the command's default (`acpd
    /// stdio` forwards it to its own stderr, `acpd serve` only logs it). Read at start.
    pub child_stderr: Option<crate::supervise::ChildStderrMode>,
    /// (`acpd serve`) The network face: listeners, TLS files, origins and remote limits.
    pub network: super::network::NetworkConfig,
    /// Sorted by name (the built-in echo is just the entry named `echo`).
    pub providers: BTreeMap<String, Arc<ProviderConfig>>,
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
    /// Looks a provider up by its configured name.
    pub fn provider(&self, name: &str) -> Option<&Arc<ProviderConfig>> {
        self.providers.get(name)
    }
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
