//! The command line: `acpd <command> [--config FILE]`. Each command returns its exit code; a
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
mod help;
mod init;
mod install;
mod output;
mod progress;
mod prompt;
mod registry;
mod reload;
mod report;
mod run;
mod supervise;
mod token;

use std::io::Write as _;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::agent::EchoArgs;
use crate::config::{Config, ConfigError};

pub(crate) const EXIT_USAGE: u8 = 2;
/// stdout could not be written (EX_IOERR from sysexits.h): a closed pipe, a full disk.
pub(crate) const EXIT_IO: u8 = 74;

/// Writes and flushes to stdout; the caller maps an error to [`EXIT_IO`].
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.flush()
}

/// Writes to stderr, ignoring failure (with the status line, if any, out of the way).
pub(crate) fn write_stderr(args: std::fmt::Arguments<'_>) {
    progress::cleared_for(|| {
        let mut err = std::io::stderr().lock();
        let _ = err.write_fmt(args);
    });
}

/// Runs `write` (a log line to stderr) with the command's status line, if one is shown, taken
/// off the terminal for the moment.
pub fn with_status_line_cleared<R>(write: impl FnOnce() -> R) -> R {
    progress::cleared_for(write)
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
    about = "An ACP bridge daemon with a subagent registry",
    after_help = help::ACPD
)]
pub struct Cli {
    /// Config file, for the commands that read one (as their own --config).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Traffic trace directory, for the commands that start agents (as their own --trace).
    #[arg(long, value_name = "DIR")]
    pub trace: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// `--config`: only on the commands that read the config (also accepted before the command,
/// `acpd --config FILE <command>`, for every command, as it always was).
#[derive(Debug, Default, clap::Args)]
pub struct ConfigArg {
    /// Config file (default: $ACPD_CONFIG, $XDG_CONFIG_HOME/acpd/config.toml,
    /// /etc/acpd/config.toml, else built-in defaults).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// `--config` and `--trace`: the commands that start agents.
#[derive(Debug, Default, clap::Args)]
pub struct Setup {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Trace every message of each run and bridge session, and its child's stderr, into DIR
    /// (one NDJSON file each; overrides `trace_dir`). Traces hold prompts and file contents.
    #[arg(long, value_name = "DIR")]
    pub trace: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct McpCommand {
    #[command(flatten)]
    pub args: crate::mcp::McpArgs,
    #[command(flatten)]
    pub setup: Setup,
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Only this provider.
    pub provider: Option<String>,
    /// No status line on stderr while the checks run.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Debug, clap::Args)]
pub struct ProvidersArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// List the presets (package, version, what each needs, whether installed) instead.
    #[arg(long)]
    pub presets: bool,
    #[command(flatten)]
    pub config: ConfigArg,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one delegation through the registry and print its output.
    #[command(after_help = help::RUN)]
    Run(run::RunArgs),
    /// Serve ACP on stdin/stdout: the agent command an editor or parent agent runs.
    #[command(after_help = help::STDIO)]
    Stdio(StdioArgs),
    /// Run the long-lived daemon on a Unix socket (systemd: Type=notify, socket activation).
    #[command(after_help = help::SERVE)]
    Serve(daemon::ServeArgs),
    /// Bridge stdin/stdout to the daemon's socket: the agent command editors launch.
    #[command(after_help = help::CONNECT)]
    Connect(daemon::ConnectArgs),
    /// Serve MCP on stdin/stdout: the registry as tools (delegate, subagent_*) for any agent.
    #[command(after_help = help::MCP)]
    Mcp(McpCommand),
    /// Show the daemon's status.
    #[command(after_help = help::STATUS)]
    Status(daemon::StatusArgs),
    /// List the daemon's runs.
    #[command(after_help = help::RUNS)]
    Runs(daemon::QueryArgs),
    /// Make the daemon re-read its config: exit 0 when the new one is in force, 2 when it was
    /// rejected (the old one stays; the error names file, line and key), 1 when no daemon
    /// answered.
    #[command(after_help = help::RELOAD)]
    Reload(reload::ReloadArgs),
    /// Start each provider, run `initialize`, report what it says, and tear it down (all
    /// providers at once).
    #[command(after_help = help::DOCTOR)]
    Doctor(DoctorArgs),
    /// List the configured providers and their capabilities.
    #[command(after_help = help::PROVIDERS)]
    Providers(ProvidersArgs),
    /// Write a first config (where acpd reads it), install the presets' agents, check them
    /// with doctor, and say what is still missing (e.g. an API key).
    #[command(after_help = help::INIT)]
    Init(init::InitArgs),
    /// Install a preset's pinned package into acpd's data directory (runs `npm install`).
    #[command(after_help = help::INSTALL)]
    Install(install::InstallArgs),
    /// The ACP Registry (`registry = "ID"` providers): what it offers.
    #[command(subcommand, after_help = help::REGISTRY)]
    Registry(registry::RegistryCommand),
    /// Run CMD as a supervised tree: the far side of `host`/`launcher` providers.
    #[command(after_help = help::SUPERVISE)]
    Supervise(supervise::SuperviseArgs),
    /// Network tokens: who may reach the daemon's network listeners (`listen`).
    #[command(subcommand, after_help = help::TOKEN)]
    Token(token::TokenCommand),
    /// Built-in ACP agents.
    #[command(subcommand, after_help = help::AGENT)]
    Agent(AgentCommand),
    /// Read traffic traces (`--trace DIR`, `trace_dir`).
    #[command(subcommand, after_help = help::TRACE)]
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
    #[command(flatten)]
    pub setup: Setup,
}

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Print a trace file readably: time, hop, method and id, message.
    #[command(after_help = help::TRACE_SHOW)]
    Show {
        /// A `.ndjson` file in the trace directory (its rotated `.1` is shown first).
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// A small scripted ACP agent on stdin/stdout: the default provider and the test child.
    #[command(after_help = help::AGENT_ECHO)]
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
pub(crate) fn echo_command() -> Vec<String> {
    let exe = std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "acpd".into());
    vec![exe, "agent".into(), "echo".into()]
}

pub(crate) fn load_config(cli_path: Option<&std::path::Path>) -> Result<Config, ConfigError> {
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

impl Command {
    /// The command's own `--config` and `--trace`, for the commands that take them.
    fn own_options(&self) -> (Option<&PathBuf>, Option<&PathBuf>) {
        fn setup(s: &Setup) -> (Option<&PathBuf>, Option<&PathBuf>) {
            (s.config.config.as_ref(), s.trace.as_ref())
        }
        match self {
            Command::Run(a) => setup(&a.setup),
            Command::Stdio(a) => setup(&a.setup),
            Command::Serve(a) => setup(&a.setup),
            Command::Connect(a) => setup(&a.setup),
            Command::Mcp(a) => setup(&a.setup),
            Command::Doctor(a) => (a.config.config.as_ref(), None),
            Command::Providers(a) => (a.config.config.as_ref(), None),
            Command::Init(a) => (a.config.config.as_ref(), None),
            Command::Registry(registry::RegistryCommand::List { config, .. }) => {
                (config.config.as_ref(), None)
            }
            _ => (None, None),
        }
    }
}

/// Runs a command that needs the runtime. `activated` is the listener systemd passed, taken
/// before the runtime started.
pub async fn dispatch(cli: Cli, activated: crate::runtime::Activated) -> u8 {
    // Spans are exported by the commands that serve, never by a child (`acpd agent echo`).
    let serves = matches!(
        cli.command,
        Command::Run(_) | Command::Stdio(_) | Command::Serve(_) | Command::Mcp(_)
    );
    if serves {
        crate::otel::init();
    }
    let code = command(cli, activated).await;
    if serves {
        crate::otel::shutdown().await;
    }
    code
}

async fn command(cli: Cli, activated: crate::runtime::Activated) -> u8 {
    let (own_config, own_trace) = cli.command.own_options();
    // After the command wins over before it.
    let config_path: Option<PathBuf> = own_config.or(cli.config.as_ref()).cloned();
    if let Some(dir) = own_trace.or(cli.trace.as_ref()) {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        let _ = TRACE_DIR.set(dir);
    }
    let config = config_path.as_deref();
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
        Command::Run(args) => run::run(config, args).await,
        Command::Providers(ProvidersArgs {
            json,
            presets: true,
            ..
        }) => install::list_presets(json),
        Command::Providers(args) => providers(config, args.json),
        Command::Install(args) => install::install(args),
        Command::Init(args) => init::init(config, args).await,
        Command::Stdio(args) => stdio(config, args.provider.as_deref()).await,
        Command::Serve(args) => daemon::serve(config, args, activated).await,
        Command::Connect(args) => daemon::connect(config, args).await,
        Command::Mcp(McpCommand { args, .. }) => {
            // Only for runs in this process (no daemon answering).
            let local_config = || {
                let config = config_or_usage(config)?;
                daemon::contain(&config)?;
                Ok(config)
            };
            crate::mcp::run(args, local_config).await
        }
        Command::Status(args) => daemon::status(args).await,
        Command::Runs(args) => daemon::runs(args).await,
        Command::Reload(args) => reload::reload(args).await,
        Command::Doctor(args) => daemon::doctor(config, args.provider, args.quiet).await,
        Command::Registry(command) => registry::registry(config, command).await,
        Command::Supervise(args) => supervise::supervise(args).await,
        Command::Token(command) => token::token(command).await,
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
        principal: None,
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
        let mut grid = output::Grid::new(&[
            ("NAME", output::Col::Whole),
            ("DEFAULT", output::Col::Whole),
            ("CAPABILITIES", output::Col::Text(40)),
            ("DESCRIPTION", output::Col::Text(60)),
        ]);
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
            let caps = if caps.is_empty() {
                "none".to_string()
            } else {
                caps.join(", ")
            };
            let default = if p.default { "yes" } else { "" };
            grid.row([p.name.as_str(), default, &caps, &p.description]);
        }
        grid.print()
    };
    match printed {
        Ok(()) => 0,
        Err(e) => stdout_failed(&e),
    }
}
