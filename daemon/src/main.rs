use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

use acpd::{AgentCommand, Cli, Command};

fn main() -> ExitCode {
    // Before any other thread allocates, so the arena limit holds for all of them.
    acpd::tune_allocator();
    let cli = Cli::parse();
    if let Command::Agent(AgentCommand::Sleeper { exit_after }) = cli.command {
        acpd::run_sleeper(exit_after);
    }
    // No runtime, no logging: the sentinel stays one small single-threaded process.
    if let Command::Sentinel = cli.command {
        return ExitCode::from(acpd::run_sentinel());
    }
    // Before any thread exists, so every thread of acpd's inherits it (see supervise::sched).
    if matches!(
        cli.command,
        Command::Run(_)
            | Command::Stdio(_)
            | Command::Serve(_)
            | Command::Connect(_)
            | Command::Mcp(_)
            | Command::Supervise(_)
    ) {
        acpd::favour_throughput();
    }
    // LISTEN_FDS is read (and the environment cleaned) before any thread exists.
    let activated = match cli.command {
        Command::Serve(_) => take_activated(),
        _ => acpd::Activated::default(),
    };
    init_logging(matches!(cli.command, Command::Run(_)));
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
    let code = runtime.block_on(acpd::dispatch(cli, activated));
    // Children are torn down by the commands themselves; don't wait on blocking reads.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    ExitCode::from(code)
}

/// The listeners systemd passed through socket activation, if any: found by their type, as
/// systemd passes acpd.socket's and acpd-https.socket's in either order.
fn take_activated() -> acpd::Activated {
    let activated = acpd::activated_listeners();
    for why in &activated.ignored {
        let _ = writeln!(std::io::stderr(), "acpd: ignoring: {why}");
    }
    activated
}

/// Logs go to stderr only (stdout carries ACP or the run's output): journald-native with
/// structured fields (PROVIDER, RUN, SESSION…) when stderr is systemd's journal stream, plain
/// text otherwise. `ACPD_LOG` takes an env-filter directive; the default shows warnings and the
/// daemon's own few lifecycle lines (where it serves, reloads, shutting down), less a failed
/// start's or turn's for `acpd run` (`run`), which prints that cause as its own error.
fn init_logging(run: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("ACPD_LOG").unwrap_or_else(|_| match run {
            // `acpd::failure` is child::FAILURE_LOG, the target of those lines.
            true => tracing_subscriber::EnvFilter::new("warn,acpd::failure=off"),
            false => tracing_subscriber::EnvFilter::new("warn,acpd::runtime::serve=info"),
        })
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
        .with_writer(|| EscapedStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// stderr for plain-text log lines, each control character a child or an editor could have put
/// in one (an agent's error message, its stderr tail, a method name) escaped: the formatter
/// escapes only ESC, BEL, BS, FF, DEL and C1 in what it is given, so a CR from an agent would
/// return the terminal's cursor and let the agent overwrite the line. Left as they are: the
/// event's final newline, tab, and ESC (the formatter's own colours on a terminal; it escapes
/// an ESC in the text itself). The formatter writes one event per `write`.
struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        let mut out = Vec::with_capacity(buf.len() + 16);
        let mut bytes = body.iter().copied().peekable();
        while let Some(b) = bytes.next() {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' | 0x1b => out.push(b),
                0x00..=0x1f | 0x7f => out.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes()),
                // U+0080..U+009F (C1) in UTF-8.
                0xc2 if bytes.peek().is_some_and(|n| (0x80..=0x9f).contains(n)) => {
                    let n = bytes.next().unwrap_or_default();
                    out.extend_from_slice(format!("\\u{{{n:x}}}").as_bytes());
                }
                b => out.push(b),
            }
        }
        out.extend_from_slice(end);
        acpd::with_status_line_cleared(|| {
            std::io::Write::write_all(&mut std::io::stderr().lock(), &out)
        })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
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
