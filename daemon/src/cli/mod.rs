//! The command line: `acpd [--config FILE] <command>`. Each command returns its exit code; a
//! config or usage error is 2 everywhere, and a stdout that cannot be written (a closed pipe)
//! is 74 everywhere, never a panic.

/// `println!` that returns the write's `io::Result` instead of panicking on a closed stdout.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics: with stderr closed the line is lost, nothing else.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod client;
mod credentials;
mod daemon;
mod init;
mod install;
mod registry;
mod reload;
mod run;
mod supervise;

use std::io::Write as _;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::agent::EchoArgs;
use crate::config::{Config, ConfigError};

pub const EXIT_USAGE: u8 = 2;
/// stdout could not be written (EX_IOERR from sysexits.h): a closed pipe, a full disk.
pub const EXIT_IO: u8 = 74;

/// Writes and flushes to stdout; the caller maps an error to [`EXIT_IO`].
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()
}

/// Writes to stderr, ignoring failure.
pub(crate) fn write_stderr(args: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args);
}

/// The exit code for a command whose output failed: [`EXIT_IO`] with a line on stderr.
pub(crate) fn stdout_failed(e: &std::io::Error) -> u8 {
    errln!("acpd: cannot write to stdout: {e}");
    EXIT_IO
}

#[derive(Debug, Parser)]
#[command(
    name = "acpd",
    version,
    about = "An ACP bridge daemon with a subagent registry"
)]
pub struct Cli {
    /// Config file (default: $ACPD_CONFIG, $XDG_CONFIG_HOME/acpd/config.toml,
    /// /etc/acpd/config.toml, else built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Trace every message of each run and bridge session, and its child's stderr, into DIR
    /// (one NDJSON file each; overrides `trace_dir`). Traces hold prompts and file contents.
    #[arg(long, global = true, value_name = "DIR")]
    pub trace: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one delegation through the registry and print its output.
    Run(run::RunArgs),
    /// Serve ACP on stdin/stdout: the agent command an editor or parent agent runs.
    Stdio(StdioArgs),
    /// Run the long-lived daemon on a Unix socket (systemd: Type=notify, socket activation).
    Serve(daemon::SocketArg),
    /// Bridge stdin/stdout to the daemon's socket: the agent command editors launch.
    Connect(daemon::ConnectArgs),
    /// Serve MCP on stdin/stdout: the registry as tools (delegate, subagent_*) for any agent.
    Mcp(crate::mcp::McpArgs),
    /// Show the daemon's status.
    Status(daemon::QueryArgs),
    /// List the daemon's runs.
    Runs(daemon::QueryArgs),
    /// Make the daemon re-read its config: exit 0 when the new one is in force, 2 when it was
    /// rejected (the old one stays; the error names file, line and key), 1 when no daemon
    /// answered.
    Reload(reload::ReloadArgs),
    /// Start each provider, run `initialize`, report what it says, and tear it down.
    Doctor {
        /// Only this provider.
        provider: Option<String>,
    },
    /// List the configured providers and their capabilities.
    Providers {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// List the presets (package, version, what each needs, whether installed) instead.
        #[arg(long)]
        presets: bool,
    },
    /// Write a first config (where acpd reads it), install the presets' agents, check them
    /// with doctor, and say what is still missing (e.g. an API key).
    Init(init::InitArgs),
    /// Install a preset's pinned package into acpd's data directory (runs `npm install`).
    Install(install::InstallArgs),
    /// The ACP Registry (`registry = "ID"` providers): what it offers.
    #[command(subcommand)]
    Registry(registry::RegistryCommand),
    /// Run CMD as a supervised tree: the far side of `host`/`launcher` providers.
    Supervise(supervise::SuperviseArgs),
    /// Built-in ACP agents.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Read traffic traces (`--trace DIR`, `trace_dir`).
    #[command(subcommand)]
    Trace(TraceCommand),
    /// (internal) Outlives one acpd and kills what it leaves running (supervise::sentinel).
    #[command(hide = true)]
    Sentinel,
}

#[derive(Debug, clap::Args)]
pub struct StdioArgs {
    /// Make provider NAME this connection's default: `initialize` mirrors its agent and
    /// `session/new` without `_meta.acpd.provider` opens it (one editor entry per agent).
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Print a trace file readably: time, hop, method and id, message.
    Show {
        /// A `.ndjson` file in the trace directory (its rotated `.1` is shown first).
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// A small scripted ACP agent on stdin/stdout: the default provider and the test child.
    Echo(EchoArgs),
    /// Sleeps forever ignoring SIGTERM (the grandchild of the echo agent's `:grandchild`).
    #[command(hide = true)]
    Sleeper {
        /// Exit after this many milliseconds instead of sleeping forever.
        #[arg(long, value_name = "MS")]
        exit_after: Option<u64>,
    },
}

/// The built-in echo provider's argv: this very binary.
pub fn echo_command() -> Vec<String> {
    let exe = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "acpd".into());
    vec![exe, "agent".into(), "echo".into()]
}

pub fn load_config(cli_path: Option<&std::path::Path>) -> Result<Config, ConfigError> {
    let mut config = Config::load(cli_path, echo_command())?;
    if let Some(dir) = TRACE_DIR.get() {
        config.trace_dir = Some(dir.clone());
    }
    Ok(config)
}

/// `--trace DIR`, set once before any config is loaded (reloads keep it).
static TRACE_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The config, or exit code 2 with the error (file, line, key) on stderr.
fn config_or_usage(cli_path: Option<&std::path::Path>) -> Result<Config, u8> {
    load_config(cli_path).map_err(|e| {
        errln!("acpd: {e}");
        EXIT_USAGE
    })
}

/// Runs a command that needs the runtime. `activated` is the listener systemd passed, taken
/// before the runtime started.
pub async fn dispatch(cli: Cli, activated: Option<std::os::unix::net::UnixListener>) -> u8 {
    if let Some(dir) = &cli.trace {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        let _ = TRACE_DIR.set(dir);
    }
    match cli.command {
        Command::Trace(TraceCommand::Show { file }) => {
            let mut out = std::io::stdout().lock();
            match crate::trace::show(&file, &mut out) {
                Ok(()) => 0,
                Err(crate::trace::ShowError::Stdout(e)) => stdout_failed(&e),
                Err(e @ crate::trace::ShowError::NoSuchTrace(_)) => {
                    errln!("acpd: {e}");
                    EXIT_USAGE
                }
                Err(e) => {
                    errln!("acpd: {e}");
                    EXIT_IO
                }
            }
        }
        Command::Run(args) => run::run(cli.config.as_deref(), args).await,
        Command::Providers {
            json,
            presets: true,
        } => install::list_presets(json),
        Command::Providers { json, .. } => providers(cli.config.as_deref(), json),
        Command::Install(args) => install::install(args),
        Command::Init(args) => init::init(cli.config.as_deref(), args).await,
        Command::Stdio(args) => stdio(cli.config.as_deref(), args.provider.as_deref()).await,
        Command::Serve(socket) => daemon::serve(cli.config.as_deref(), socket, activated).await,
        Command::Connect(args) => daemon::connect(cli.config.as_deref(), args).await,
        Command::Mcp(args) => {
            // Only for runs in this process (no daemon answering).
            let local_config = || {
                let config = config_or_usage(cli.config.as_deref())?;
                daemon::contain(&config)?;
                Ok(config)
            };
            crate::mcp::run(args, local_config).await
        }
        Command::Status(args) => daemon::status(args).await,
        Command::Runs(args) => daemon::runs(args).await,
        Command::Reload(args) => reload::reload(args).await,
        Command::Doctor { provider } => daemon::doctor(cli.config.as_deref(), provider).await,
        Command::Registry(command) => registry::registry(cli.config.as_deref(), command).await,
        Command::Supervise(args) => supervise::supervise(args).await,
        Command::Agent(AgentCommand::Echo(args)) => {
            let (stdin, stdout) = crate::runtime::stdio();
            crate::agent::run_echo(args, stdin, stdout)
                .await
                .clamp(0, 255) as u8
        }
        Command::Agent(AgentCommand::Sleeper { exit_after }) => {
            crate::agent::run_sleeper(exit_after)
        }
        Command::Sentinel => crate::supervise::run_sentinel(),
    }
}

/// `acpd stdio`: one parent on stdin/stdout; exits 0 when it disconnects, or on SIGTERM,
/// SIGINT or SIGHUP, after every child it started is torn down and reaped.
pub(crate) async fn stdio(config: Option<&std::path::Path>, provider: Option<&str>) -> u8 {
    use tokio::signal::unix::SignalKind;
    // First, so a signal that comes while the config loads is already a graceful one.
    let shutdown = match crate::runtime::Shutdown::on_signals(&[
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
    ]) {
        Ok(s) => s,
        Err(e) => {
            errln!("acpd: cannot set up signal handling: {e}");
            return 1;
        }
    };
    let mut config = match config_or_usage(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(name) = provider {
        // One process per editor: the connection's default is the process's.
        if let Err(why) = daemon::known_provider(&config, name) {
            errln!("acpd: --provider: {why}");
            return EXIT_USAGE;
        }
        config.default_provider = name.to_owned();
    }
    if let Err(code) = daemon::contain(&config) {
        return code;
    }
    crate::supervise::init();
    crate::supervise::keep_records();
    // An editor shows the stderr of the agent it launched in its log: acpd's, here.
    if config.child_stderr != Some(crate::supervise::ChildStderrMode::Log) {
        crate::supervise::forward_child_stderr();
    }
    let ctx = crate::server::ServerContext {
        registry: crate::registry::Registry::new(config, crate::registry::DepthContext::from_env()),
        caller_cwd: std::env::current_dir().ok(),
        daemon: Default::default(),
        shutdown: Default::default(),
        // One editor per process: its sessions end with it (and are loaded again later).
        sessions: crate::server::Sessions::new(crate::server::open_store(), None),
        peer_uid: None,
        origin: None,
    };
    crate::runtime::serve_stdio(ctx, shutdown).await;
    crate::supervise::forget_records();
    crate::supervise::flush_child_stderr(std::time::Duration::from_millis(200));
    0
}

fn providers(config: Option<&std::path::Path>, json: bool) -> u8 {
    let config = match config_or_usage(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let registry = crate::registry::Registry::new(config, Default::default());
    let providers = registry.providers();
    let printed = if json {
        outln!("{}", serde_json::json!({ "providers": providers }))
    } else {
        let print = || -> std::io::Result<()> {
            for p in providers {
                let c = p.capabilities;
                let caps: Vec<&str> = [
                    (c.output_schema, "outputSchema"),
                    (c.depth_limit, "depthLimit"),
                    (c.tool_filter, "toolFilter"),
                    (c.persona, "persona"),
                ]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
                outln!(
                    "{}{}\t{}\tcapabilities: {}",
                    p.name,
                    if p.default { " (default)" } else { "" },
                    // The config's text: escaped like every text printed to a terminal.
                    crate::trace::escape_controls(&p.description),
                    if caps.is_empty() {
                        "none".to_string()
                    } else {
                        caps.join(", ")
                    }
                )?;
            }
            Ok(())
        };
        print()
    };
    match printed {
        Ok(()) => 0,
        Err(e) => stdout_failed(&e),
    }
}
