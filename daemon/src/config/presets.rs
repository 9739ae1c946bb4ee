//! Presets: the agents people run, each one line of config (`preset = "claude"`).
//!
//! A preset fills a provider's command (a pinned package, run from acpd's data directory when
//! `acpd install PRESET` put it there, else through `npx`), the environment variable names the
//! agent reads (passed through by name, never by value), and its known quirks. It is applied
//! before the provider table's own keys, so anything set in the table wins.
//!
//! Every detail was checked against the agent's own code or a run of its pinned package (sources
//! in docs/src/agents.md): auth method ids, the variables that satisfy them, exit on stdin EOF
//! (all five do; codex-acp takes up to 2 s to stop its app-server, so its grace is longer).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ProviderConfig, ToolFilterMode};

/// Where a preset's program comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum Source {
    /// A pinned npm package: `acpd install` puts it in the data directory, `npx` is the fallback.
    Npm {
        package: &'static str,
        version: &'static str,
        /// The package's executable (`bin` in its package.json).
        bin: &'static str,
    },
    /// A program found on `PATH` (not published to npm).
    Path { program: &'static str },
}

/// Which environment variables satisfy one auth method of a preset (names only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct AuthHint {
    /// The preset whose agent advertises (or implies) this method.
    pub preset: &'static str,
    /// The advertised method id; `None`: the agent advertises no method to acpd and reads
    /// these variables on its own (claude-agent-acp offers its login methods only to clients
    /// that can run a terminal).
    pub method: Option<&'static str>,
    /// Variable names any one of which (or the combination `how` says) satisfies the method;
    /// empty when only an interactive login does.
    pub env: &'static [&'static str],
    /// One line for a person: what to set or run.
    pub how: &'static str,
}

/// One preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Preset {
    pub name: &'static str,
    pub description: &'static str,
    pub source: Source,
    /// Arguments after the program (`--acp`, `acp`).
    pub args: &'static [&'static str],
    /// Names passed through from acpd's environment.
    pub env_passthrough: &'static [&'static str],
    /// `None`: the provider default.
    #[serde(skip)]
    pub eof_grace: Option<Duration>,
    /// Set in the child's environment when acpd runs as root (claude's `IS_SANDBOX`).
    pub root_env: &'static [(&'static str, &'static str)],
    pub auth: &'static [AuthHint],
    /// Directories under `$HOME` the agent writes its own config, sessions and caches to: the
    /// only places outside its workspace and tmp a sandboxed child may write.
    pub sandbox_dirs: &'static [&'static str],
    /// How the agent takes a run's tool filter at session creation; `None` where its code has
    /// no such mechanism (codex-acp 2.6.0, Gemini CLI 0.61.0 and opencode 1.18.33 read no tool
    /// list from `session/new`; goose is not checked).
    pub tool_filter: ToolFilterMode,
}

const CODEX_AUTH: &[AuthHint] = &[
    AuthHint {
        preset: "codex",
        method: Some("api-key"),
        env: &["CODEX_API_KEY", "OPENAI_API_KEY"],
        how: "set CODEX_API_KEY or OPENAI_API_KEY (CODEX_API_KEY wins)",
    },
    AuthHint {
        preset: "codex",
        method: Some("chat-gpt"),
        env: &[],
        how: "log in with ChatGPT in a browser (`codex login`); NO_BROWSER=1 hides this method",
    },
];

const CLAUDE_AUTH: &[AuthHint] = &[
    AuthHint {
        preset: "claude",
        method: None,
        env: &[
            "ANTHROPIC_API_KEY",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "ANTHROPIC_AUTH_TOKEN",
        ],
        how: "set ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN), or log in once with \
              `claude-agent-acp --cli auth login` into CLAUDE_CONFIG_DIR",
    },
    AuthHint {
        preset: "claude",
        method: Some("claude-ai-login"),
        env: &["CLAUDE_CODE_OAUTH_TOKEN"],
        how: "log in with a Claude subscription (`claude-agent-acp --cli auth login --claudeai`) \
              or set CLAUDE_CODE_OAUTH_TOKEN",
    },
    AuthHint {
        preset: "claude",
        method: Some("console-login"),
        env: &["ANTHROPIC_API_KEY"],
        how: "set ANTHROPIC_API_KEY, or log in with `claude-agent-acp --cli auth login --console`",
    },
];

const GEMINI_AUTH: &[AuthHint] = &[
    AuthHint {
        preset: "gemini",
        method: Some("gemini-api-key"),
        env: &["GEMINI_API_KEY"],
        how: "set GEMINI_API_KEY",
    },
    AuthHint {
        preset: "gemini",
        method: Some("vertex-ai"),
        env: &[
            "GOOGLE_CLOUD_PROJECT",
            "GOOGLE_CLOUD_LOCATION",
            "GOOGLE_API_KEY",
        ],
        how: "set GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION, or GOOGLE_API_KEY (express mode)",
    },
    AuthHint {
        preset: "gemini",
        method: Some("oauth-personal"),
        env: &[],
        how: "log in with Google once by running `gemini` in a terminal (needs a browser)",
    },
    AuthHint {
        preset: "gemini",
        method: Some("gateway"),
        env: &[],
        how: "a client-provided AI API gateway (authenticate `_meta.gateway`)",
    },
];

const OPENCODE_AUTH: &[AuthHint] = &[AuthHint {
    preset: "opencode",
    method: Some("opencode-login"),
    env: &[],
    how: "run `opencode auth login` in a terminal (or configure a provider in OPENCODE_CONFIG)",
}];

const GOOSE_AUTH: &[AuthHint] = &[AuthHint {
    preset: "goose",
    method: Some("goose-provider"),
    env: &["GOOSE_PROVIDER"],
    how: "run `goose configure`, or set GOOSE_PROVIDER (and GOOSE_MODEL) with that provider's key",
}];

/// Every preset, in the order `acpd providers --presets` lists them.
pub(crate) const PRESETS: &[Preset] = &[
    Preset {
        name: "claude",
        description: "Claude Code through claude-agent-acp",
        source: Source::Npm {
            package: "@agentclientprotocol/claude-agent-acp",
            version: "0.101.0",
            bin: "claude-agent-acp",
        },
        args: &[],
        env_passthrough: &[
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "ANTHROPIC_BASE_URL",
            "CLAUDE_CONFIG_DIR",
        ],
        eof_grace: None,
        // Claude Code refuses bypassPermissions as root unless told it runs sandboxed.
        root_env: &[("IS_SANDBOX", "1")],
        auth: CLAUDE_AUTH,
        sandbox_dirs: &[".claude", ".cache", ".npm"],
        tool_filter: ToolFilterMode::ClaudeMeta,
    },
    Preset {
        name: "codex",
        description: "OpenAI Codex through codex-acp",
        source: Source::Npm {
            package: "@agentclientprotocol/codex-acp",
            version: "2.6.0",
            bin: "codex-acp",
        },
        args: &[],
        env_passthrough: &[
            "CODEX_API_KEY",
            "OPENAI_API_KEY",
            "CODEX_HOME",
            "CODEX_CONFIG",
            "MODEL_PROVIDER",
            "NO_BROWSER",
        ],
        // On stdin EOF it closes its app-server and kills it after 2 s, then exits.
        eof_grace: Some(Duration::from_secs(5)),
        root_env: &[],
        auth: CODEX_AUTH,
        sandbox_dirs: &[".codex", ".cache", ".npm"],
        tool_filter: ToolFilterMode::None,
    },
    Preset {
        name: "gemini",
        description: "Gemini CLI in ACP mode (gemini --acp)",
        source: Source::Npm {
            package: "@google/gemini-cli",
            version: "0.61.0",
            bin: "gemini",
        },
        args: &["--acp"],
        env_passthrough: &[
            "GEMINI_API_KEY",
            "GOOGLE_API_KEY",
            "GOOGLE_CLOUD_PROJECT",
            "GOOGLE_CLOUD_LOCATION",
            "GOOGLE_GENAI_USE_VERTEXAI",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GOOGLE_GEMINI_BASE_URL",
            "NO_BROWSER",
        ],
        eof_grace: None,
        root_env: &[],
        auth: GEMINI_AUTH,
        sandbox_dirs: &[".gemini", ".cache", ".npm"],
        tool_filter: ToolFilterMode::None,
    },
    Preset {
        name: "goose",
        description: "goose in ACP mode (goose acp; its release binary on PATH)",
        source: Source::Path { program: "goose" },
        args: &["acp"],
        env_passthrough: &["GOOSE_PROVIDER", "GOOSE_MODEL"],
        eof_grace: None,
        root_env: &[],
        auth: GOOSE_AUTH,
        sandbox_dirs: &[
            ".config/goose",
            ".local/share/goose",
            ".local/state/goose",
            ".cache",
        ],
        tool_filter: ToolFilterMode::None,
    },
    Preset {
        name: "opencode",
        description: "opencode in ACP mode (opencode acp)",
        source: Source::Npm {
            package: "opencode-ai",
            version: "1.18.33",
            bin: "opencode",
        },
        args: &["acp"],
        env_passthrough: &["OPENCODE_CONFIG", "OPENCODE_CONFIG_CONTENT"],
        eof_grace: None,
        root_env: &[],
        auth: OPENCODE_AUTH,
        sandbox_dirs: &[
            ".config/opencode",
            ".local/share/opencode",
            ".local/state/opencode",
            ".cache",
            ".npm",
        ],
        tool_filter: ToolFilterMode::None,
    },
];

/// The preset named `name`.
pub(crate) fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The valid preset names, for error messages.
pub(crate) fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// The auth hints for a preset name (all of its methods) or, failing that, for an auth method
/// id (that method across presets). Empty when neither is known.
pub(crate) fn auth_hints(preset_or_method: &str) -> Vec<&'static AuthHint> {
    if let Some(preset) = find(preset_or_method) {
        return preset.auth.iter().collect();
    }
    PRESETS
        .iter()
        .flat_map(|p| p.auth.iter())
        .filter(|h| h.method == Some(preset_or_method))
        .collect()
}

/// The hints that apply to an agent's auth failure: for a provider with a preset, its hints for
/// the methods the agent advertised plus those it implies without advertising (an agent such as
/// claude-agent-acp advertises none, yet reads `ANTHROPIC_API_KEY`); without a preset, the
/// hints for each advertised method id.
pub(crate) fn hints_for(preset: Option<&str>, method_ids: &[String]) -> Vec<&'static AuthHint> {
    match preset {
        Some(preset) => auth_hints(preset)
            .into_iter()
            .filter(|h| h.method.is_none_or(|m| method_ids.iter().any(|id| id == m)))
            .collect(),
        None => method_ids.iter().flat_map(|id| auth_hints(id)).collect(),
    }
}

/// Where a credential goes when acpd runs as a daemon, which never sees the shell's variables:
/// said with every auth failure.
pub(crate) const DAEMON_CREDENTIALS: &str = "for a daemon (acpd serve), which does not see your \
     shell's variables, put the variable in the file named by env_file in the provider's config";

/// Said with an auth failure no preset hint covers.
pub(crate) const UNKNOWN_CREDENTIALS: &str =
    "the agent wants credentials acpd knows nothing about: see the agent's own documentation";

/// Where a preset's agent keeps a login made once in a terminal: `dir_var` if set (from the
/// child's environment), else `home_dir` under HOME, then `file`. Checked against the agents'
/// code: Claude Code reads `$CLAUDE_CONFIG_DIR` or `~/.claude`, then `.credentials.json`;
/// codex `$CODEX_HOME` or `~/.codex`, then `auth.json`; Gemini CLI `~/.gemini/oauth_creds.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredLogin {
    pub dir_var: Option<&'static str>,
    pub home_dir: &'static str,
    pub file: &'static str,
}

/// The stored login a preset's agent reads, if acpd knows where it is.
pub(crate) fn stored_login(preset: &str) -> Option<StoredLogin> {
    let (dir_var, home_dir, file) = match preset {
        "claude" => (Some("CLAUDE_CONFIG_DIR"), ".claude", ".credentials.json"),
        "codex" => (Some("CODEX_HOME"), ".codex", "auth.json"),
        "gemini" => (None, ".gemini", "oauth_creds.json"),
        _ => return None,
    };
    Some(StoredLogin {
        dir_var,
        home_dir,
        file,
    })
}

impl StoredLogin {
    /// The login file's path under the given environment lookup (`None` without HOME).
    pub(crate) fn path(&self, env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
        let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let dir = self
            .dir_var
            .and_then(var)
            .or_else(|| var("HOME").map(|h| h.join(self.home_dir)))?;
        Some(dir.join(self.file))
    }
}

/// acpd's data directory: `$XDG_DATA_HOME/acpd` (absolute only, per the XDG spec), else
/// `$HOME/.local/share/acpd`; `None` without either.
pub(crate) fn data_dir() -> Option<PathBuf> {
    data_dir_from(|k| std::env::var(k).ok())
}

/// [`data_dir`] as a pure function of the given env lookup, for testing.
pub(crate) fn data_dir_from(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("XDG_DATA_HOME")
        .filter(|p| p.is_absolute())
        .map(|d| d.join("acpd"))
        .or_else(|| var("HOME").map(|h| h.join(".local/share/acpd")))
}

/// What expanding a preset depends on besides the preset: read once per config load.
#[derive(Debug, Clone, Default)]
pub struct PresetContext {
    /// acpd's data directory, where `acpd install` puts packages.
    pub data_dir: Option<PathBuf>,
    /// acpd runs as root (claude's `IS_SANDBOX` rule).
    pub is_root: bool,
}

impl PresetContext {
    /// The context of this process: [`data_dir`] and the effective uid.
    pub fn from_env() -> Self {
        PresetContext {
            data_dir: data_dir(),
            is_root: nix::unistd::geteuid().is_root(),
        }
    }
}

impl Preset {
    /// Where `acpd install` puts this preset's package: `<data dir>/agents/<name>-<version>`.
    pub(crate) fn install_dir(&self, data_dir: &Path) -> Option<PathBuf> {
        match self.source {
            Source::Npm { version, .. } => Some(
                data_dir
                    .join("agents")
                    .join(format!("{}-{version}", self.name)),
            ),
            Source::Path { .. } => None,
        }
    }

    /// The installed executable, when `acpd install` put it there.
    pub(crate) fn installed_bin(&self, data_dir: &Path) -> Option<PathBuf> {
        let Source::Npm { bin, .. } = self.source else {
            return None;
        };
        let path = self
            .install_dir(data_dir)?
            .join("node_modules/.bin")
            .join(bin);
        path.exists().then_some(path)
    }

    /// `package@version` for npm presets.
    pub(crate) fn package_spec(&self) -> Option<String> {
        match self.source {
            Source::Npm {
                package, version, ..
            } => Some(format!("{package}@{version}")),
            Source::Path { .. } => None,
        }
    }

    /// The argv: the installed bin, else `npx -y package@version`, else the program on PATH.
    pub(crate) fn command(&self, data_dir: Option<&Path>) -> Vec<String> {
        let mut argv: Vec<String> =
            match (self.source, data_dir.and_then(|d| self.installed_bin(d))) {
                (_, Some(bin)) => vec![bin.to_string_lossy().into_owned()],
                (Source::Npm { .. }, None) => {
                    let spec = self.package_spec().unwrap_or_default();
                    vec!["npx".to_owned(), "-y".to_owned(), spec]
                }
                (Source::Path { program }, None) => vec![program.to_owned()],
            };
        argv.extend(self.args.iter().map(|a| (*a).to_owned()));
        argv
    }

    /// The environment the preset sets (not passes through) in this context.
    pub(crate) fn env(&self, ctx: &PresetContext) -> BTreeMap<String, String> {
        let root = if ctx.is_root { self.root_env } else { &[] };
        root.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A provider named `name` filled from this preset; the table's keys are applied on top.
    pub(crate) fn provider(&self, name: &str, ctx: &PresetContext) -> ProviderConfig {
        let mut p = ProviderConfig::with_defaults(name, self.command(ctx.data_dir.as_deref()));
        p.description = self.description.to_owned();
        p.env = self.env(ctx);
        p.env_passthrough = self
            .env_passthrough
            .iter()
            .map(|n| (*n).to_owned())
            .collect();
        if let Some(grace) = self.eof_grace {
            p.eof_grace = grace;
        }
        p.preset = Some(self.name.to_owned());
        p.tool_filter = self.tool_filter;
        p
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn ctx(data_dir: Option<&Path>, is_root: bool) -> PresetContext {
        PresetContext {
            data_dir: data_dir.map(Path::to_path_buf),
            is_root,
        }
    }

    #[test]
    fn each_npm_preset_falls_back_to_npx_with_its_pinned_package() {
        let want = [
            (
                "claude",
                vec!["npx", "-y", "@agentclientprotocol/claude-agent-acp@0.101.0"],
            ),
            (
                "codex",
                vec!["npx", "-y", "@agentclientprotocol/codex-acp@2.6.0"],
            ),
            (
                "gemini",
                vec!["npx", "-y", "@google/gemini-cli@0.61.0", "--acp"],
            ),
            ("opencode", vec!["npx", "-y", "opencode-ai@1.18.33", "acp"]),
            ("goose", vec!["goose", "acp"]),
        ];
        let empty = tempfile::tempdir().unwrap();
        for (name, argv) in want {
            let p = find(name).unwrap();
            assert_eq!(p.command(Some(empty.path())), argv, "{name}");
            assert_eq!(p.command(None), argv, "{name} without a data dir");
        }
        assert_eq!(names(), ["claude", "codex", "gemini", "goose", "opencode"]);
    }

    #[test]
    fn an_installed_package_runs_from_the_data_dir() {
        let data = tempfile::tempdir().unwrap();
        let p = find("gemini").unwrap();
        let dir = p.install_dir(data.path()).unwrap();
        assert_eq!(dir, data.path().join("agents/gemini-0.61.0"));
        let bin = dir.join("node_modules/.bin/gemini");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::write(&bin, "").unwrap();
        assert_eq!(
            p.command(Some(data.path())),
            [bin.to_string_lossy().as_ref(), "--acp"]
        );
        // Another version's install does not count.
        assert!(find("claude").unwrap().installed_bin(data.path()).is_none());
        assert!(find("goose").unwrap().install_dir(data.path()).is_none());
    }

    #[test]
    fn the_provider_carries_passthrough_quirks_and_the_root_rule() {
        let claude = find("claude").unwrap();
        let user = claude.provider("c", &ctx(None, false));
        assert_eq!(user.preset.as_deref(), Some("claude"));
        assert!(user.env.is_empty());
        assert!(
            user.env_passthrough
                .iter()
                .any(|n| n == "ANTHROPIC_API_KEY")
        );
        let root = claude.provider("c", &ctx(None, true));
        assert_eq!(root.env.get("IS_SANDBOX").map(String::as_str), Some("1"));
        let codex = find("codex").unwrap().provider("x", &ctx(None, true));
        assert!(codex.env.is_empty(), "IS_SANDBOX is claude's alone");
        assert_eq!(codex.eof_grace, Duration::from_secs(5));
        let gemini = find("gemini").unwrap().provider("g", &ctx(None, false));
        assert_eq!(
            gemini.eof_grace,
            ProviderConfig::with_defaults("d", vec![]).eof_grace
        );
    }

    #[test]
    fn auth_hints_by_preset_or_method_id() {
        let codex: Vec<_> = auth_hints("codex").iter().map(|h| h.method).collect();
        assert_eq!(codex, [Some("api-key"), Some("chat-gpt")]);
        let api = auth_hints("api-key");
        assert_eq!(api.len(), 1);
        assert_eq!(api[0].env, ["CODEX_API_KEY", "OPENAI_API_KEY"]);
        assert_eq!(auth_hints("gemini-api-key")[0].env, ["GEMINI_API_KEY"]);
        assert!(auth_hints("vertex-ai")[0].env.contains(&"GOOGLE_API_KEY"));
        assert!(auth_hints("opencode-login")[0].env.is_empty());
        assert!(auth_hints("claude")[0].env.contains(&"ANTHROPIC_API_KEY"));
        assert!(auth_hints("nope").is_empty());
        let hint = |preset: &str, method: &str| {
            find(preset)?.auth.iter().find(|h| h.method == Some(method))
        };
        assert_eq!(hint("gemini", "vertex-ai").unwrap().preset, "gemini");
        assert!(hint("codex", "vertex-ai").is_none());
        // Every hint names its own preset and every variable it names is passed through.
        for p in PRESETS {
            for h in p.auth {
                assert_eq!(h.preset, p.name);
                for var in h.env {
                    assert!(p.env_passthrough.contains(var), "{}: {var}", p.name);
                }
            }
        }
    }

    #[test]
    fn data_dir_follows_xdg_then_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            data_dir_from(env(&[("XDG_DATA_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/acpd"))
        );
        assert_eq!(
            data_dir_from(env(&[("XDG_DATA_HOME", "rel"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.local/share/acpd"))
        );
        assert_eq!(data_dir_from(env(&[("XDG_DATA_HOME", "")])), None);
    }
}
