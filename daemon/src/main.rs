use std::process::ExitCode;

use clap::Parser;

use acpd::cli::{self, AgentCommand, Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Agent(AgentCommand::Sleeper) = cli.command {
        acpd::agent::run_sleeper();
    }
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("acpd: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(cli::dispatch(cli));
    // Children are torn down by the commands themselves; don't wait on blocking reads.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

/// Logs go to stderr only (stdout carries ACP or the run's output). `ACPD_LOG` takes an
/// env-filter directive; the default shows warnings.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ACPD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
