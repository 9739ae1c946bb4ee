use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use acpd::cli::{self, AgentCommand, Cli, Command};

fn main() -> ExitCode {
    // Before any other thread allocates, so the arena limit holds for all of them.
    acpd::supervise::tune_allocator();
    let cli = Cli::parse();
    if let Command::Agent(AgentCommand::Sleeper { exit_after }) = cli.command {
        acpd::agent::run_sleeper(exit_after);
    }
    // No runtime, no logging: the sentinel stays one small single-threaded process.
    if let Command::Sentinel = cli.command {
        return ExitCode::from(acpd::supervise::run_sentinel());
    }
    // LISTEN_FDS is read (and the environment cleaned) before any thread exists.
    let activated = match cli.command {
        Command::Serve(_) => take_activated(),
        _ => None,
    };
    init_logging();
    // One connection's pipeline (reader → router → writer) runs best on one thread: a message
    // moves between tasks without waking another thread, which is most of a hop's latency.
    // The daemon and `acpd run` (which writes to a terminal with blocking calls) use workers.
    let mut builder = match cli.command {
        Command::Stdio(_) | Command::Connect(_) | Command::Agent(_) | Command::Supervise(_) => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "acpd: cannot start the async runtime: {e}"
            );
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(cli::dispatch(cli, activated));
    // Children are torn down by the commands themselves; don't wait on blocking reads.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

/// The Unix listener systemd passed through socket activation, if any.
fn take_activated() -> Option<std::os::unix::net::UnixListener> {
    let mut fds = listenfd::ListenFd::from_env();
    match fds.take_unix_listener(0) {
        Ok(listener) => listener,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "acpd: ignoring the socket systemd passed: {e}"
            );
            None
        }
    }
}

/// Logs go to stderr only (stdout carries ACP or the run's output): journald-native with
/// structured fields (PROVIDER, RUN, SESSION…) when stderr is systemd's journal stream, plain
/// text otherwise. `ACPD_LOG` takes an env-filter directive; the default shows warnings.
fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("ACPD_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
    };
    if stderr_is_journal()
        && let Ok(journal) = tracing_journald::layer().map(|l| l.with_field_prefix(None))
    {
        tracing_subscriber::registry()
            .with(filter())
            .with(journal)
            .init();
        return;
    }
    // A log line that cannot be written (stderr a closed pipe) is lost quietly: by default
    // tracing-subscriber reports it with `eprintln!`, which panics on that same stderr.
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// systemd's "automatic protocol upgrade": `JOURNAL_STREAM` names stderr's device and inode.
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| {
        let (d, i) = v.split_once(':')?;
        Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    nix::sys::stat::fstat(std::io::stderr().as_fd())
        .is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}
