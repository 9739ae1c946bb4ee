//! `acpd supervise [--setup-stdin] -- CMD…`: the far side of a remote provider (see
//! `crate::remote`), and usable locally.
//!
//! It runs CMD under supervise/'s spawn and ladder, as acpd runs its children: CMD in its own
//! process group with PDEATHSIG, and where a cgroup v2 group can be created (root, or a
//! delegated subtree), in its own, `acpd-<pid>-<start>` beside supervise, which teardown ends
//! with `cgroup.kill`; a supervise that was SIGKILLed leaves that group behind, and the next
//! supervise or acpd started in the same parent group kills what is in it and removes it (the
//! name says whose it was). It is a child subreaper, so everything CMD starts stays its
//! descendant however it detaches (`setsid`, double fork), and the ladder (close CMD's stdin →
//! eof grace → SIGTERM → term grace → SIGKILL) ends all of them. This file relays stdin,
//! stdout and stderr byte for byte and starts the ladder when its own stdin closes, its stdout
//! breaks, it gets SIGHUP, SIGTERM or SIGINT, or its parent dies (its own PDEATHSIG is
//! SIGTERM); once CMD exits by itself, whatever is left of the tree gets the ladder from
//! SIGTERM on. It exits with CMD's status (128 + the signal when a signal ended it), 125 for
//! its own failures, 126/127 when CMD cannot be executed / found.

use std::collections::BTreeMap;
use std::io::{self, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::remote::{MAX_SETUP_LINE, SUPERVISE_MARK, Setup};
use crate::supervise::{DEPTH_VAR, Graces, MAX_DEPTH_VAR, SpawnError, SpawnSpec, child_env};

#[derive(Debug, clap::Args)]
pub struct SuperviseArgs {
    /// Read one JSON line `{cwd, env, graces}` from stdin before starting CMD: how acpd passes
    /// a remote child's environment without putting it in an argv or through a shell.
    #[arg(long)]
    pub setup_stdin: bool,
    /// How long CMD may take to exit after its stdin closes (a setup line overrides it).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = crate::durations::parse_flag)]
    pub eof_grace: Duration,
    /// How long CMD's group may take to exit after SIGTERM, before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = crate::durations::parse_flag)]
    pub term_grace: Duration,
    /// The command and its arguments, after `--`; run directly, never through a shell.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Exit code for supervise's own failures (as `env`, `timeout` and `docker run` use it).
const EXIT_OWN: u8 = 125;
/// How long the relay waits for the last output once the whole tree is gone.
const DRAIN: Duration = Duration::from_secs(2);
const CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
enum SuperviseError {
    #[error("cannot read the setup line: {0}")]
    SetupRead(#[source] io::Error),
    #[error("stdin closed before the setup line")]
    NoSetup,
    #[error("the setup line has no end within {MAX_SETUP_LINE} bytes")]
    SetupTooLong,
    #[error("{0}")]
    Setup(String),
    #[error("the cwd {} is not an existing directory here", .0.display())]
    Cwd(PathBuf),
    #[error("{0}")]
    Spawn(#[source] SpawnError),
    #[error("cannot set up signal handling: {0}")]
    Signals(#[source] io::Error),
    #[error("{} while waiting for the setup line; nothing was started", .0.as_str())]
    Interrupted(Signal),
}

impl SuperviseError {
    fn exit_code(&self) -> u8 {
        match self {
            SuperviseError::Spawn(SpawnError::EmptyCommand) => 127,
            SuperviseError::Spawn(SpawnError::Io { source, .. }) => match source.kind() {
                io::ErrorKind::NotFound => 127,
                io::ErrorKind::PermissionDenied => 126,
                _ => EXIT_OWN,
            },
            // As a shell reports a death by that signal.
            SuperviseError::Interrupted(signal) => 128u8.saturating_add(*signal as u8),
            _ => EXIT_OWN,
        }
    }
}

/// Why the ladder started.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    StdinClosed,
    StdoutBroken,
    Signal(&'static str),
}

impl Trigger {
    fn describe(self) -> &'static str {
        match self {
            Trigger::StdinClosed => "stdin closed",
            Trigger::StdoutBroken => "stdout broken",
            Trigger::Signal(name) => name,
        }
    }
}

pub(super) async fn supervise(args: SuperviseArgs) -> u8 {
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(io::stderr(), "{SUPERVISE_MARK} {e}");
            e.exit_code()
        }
    }
}

async fn run(args: SuperviseArgs) -> Result<u8, SuperviseError> {
    // Signals first, so one that comes while CMD starts is already a graceful one.
    let mut hup = signal(SignalKind::hangup()).map_err(SuperviseError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(SuperviseError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SuperviseError::Signals)?;
    // A subreaper (everything CMD starts stays below us) with the stray reaper and the
    // spawner thread; our own PDEATHSIG turns the death of whoever started us (sshd's session
    // process, a local acpd) into the same graceful teardown as a signal.
    crate::supervise::init();
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    let mut stdin = BufReader::with_capacity(CHUNK, tokio::io::stdin());
    let setup = if args.setup_stdin {
        // A sender that never writes the line must not make us deaf to the signals that end us.
        tokio::select! {
            read = read_setup(&mut stdin) => read?,
            _ = term.recv() => return Err(SuperviseError::Interrupted(Signal::SIGTERM)),
            _ = int.recv() => return Err(SuperviseError::Interrupted(Signal::SIGINT)),
            _ = hup.recv() => return Err(SuperviseError::Interrupted(Signal::SIGHUP)),
        }
    } else {
        Setup::default()
    };
    let (eof, term_grace) = setup.graces().unwrap_or((args.eof_grace, args.term_grace));
    let cwd = match setup.cwd {
        Some(cwd) => cwd,
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
    };
    if !cwd.is_dir() {
        return Err(SuperviseError::Cwd(cwd));
    }
    let spec = SpawnSpec {
        argv: args.command,
        cwd,
        env: environment(setup.env),
    };
    let spawned = crate::supervise::spawn_standalone(spec)
        .await
        .map_err(SuperviseError::Spawn)?;
    let tree = spawned.tree;
    let (tx, mut triggers) = mpsc::channel::<Trigger>(4);
    let stdin_pump = tokio::spawn(pump_stdin(stdin, spawned.stdin, tx.clone()));
    let stdout_pump = tokio::spawn(relay(spawned.stdout, tokio::io::stdout(), Some(tx.clone())));
    let stderr_pump = tokio::spawn(relay(spawned.stderr, tokio::io::stderr(), None));
    drop(tx);
    let trigger = tokio::select! {
        _ = tree.exited() => None,
        Some(t) = triggers.recv() => Some(t),
        _ = hup.recv() => Some(Trigger::Signal("SIGHUP")),
        _ = term.recv() => Some(Trigger::Signal("SIGTERM")),
        _ = int.recv() => Some(Trigger::Signal("SIGINT")),
    };
    // Once CMD is gone by itself, what it left gets SIGTERM at once.
    let eof = match trigger {
        Some(trigger) => {
            tracing::debug!(
                trigger = trigger.describe(),
                "acpd supervise: tearing the tree down"
            );
            eof
        }
        None => Duration::ZERO,
    };
    // Closing CMD's stdin is the ladder's first rung.
    tree.teardown(
        || stdin_pump.abort(),
        Graces {
            eof,
            term: term_grace,
        },
    )
    .await;
    for pump in [stdout_pump, stderr_pump] {
        let _ = timeout(DRAIN, pump).await;
    }
    Ok(exit_code(tree.exited().await))
}

async fn read_setup(stdin: &mut BufReader<tokio::io::Stdin>) -> Result<Setup, SuperviseError> {
    let mut line = Vec::new();
    let limit = (MAX_SETUP_LINE + 1) as u64;
    (&mut *stdin)
        .take(limit)
        .read_until(b'\n', &mut line)
        .await
        .map_err(SuperviseError::SetupRead)?;
    if line.is_empty() {
        return Err(SuperviseError::NoSetup);
    }
    if line.last() != Some(&b'\n') {
        return Err(if line.len() > MAX_SETUP_LINE {
            SuperviseError::SetupTooLong
        } else {
            SuperviseError::NoSetup
        });
    }
    Setup::parse(&line).map_err(SuperviseError::Setup)
}

/// CMD's environment: the far side's own allowlist (never its other variables), then what
/// the setup carries, with the depth pair from the setup (else from our own environment).
fn environment(
    setup_env: BTreeMap<String, String>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let number = |name: &str, default: u32| {
        setup_env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(default)
    };
    let depth = number(DEPTH_VAR, 0);
    let max_depth = number(
        MAX_DEPTH_VAR,
        crate::config::Config::builtin(Vec::new()).max_depth,
    );
    let mut extra = setup_env;
    extra.remove(DEPTH_VAR);
    extra.remove(MAX_DEPTH_VAR);
    child_env(std::env::vars_os(), &[], &extra, depth, max_depth)
}

/// Our stdin (after the setup line) to CMD's. At our EOF, CMD's stdin is closed and the
/// ladder starts; if CMD stops reading, its stdin is dropped and ours is still read to its
/// end, which remains the signal that the connection is gone.
async fn pump_stdin(
    mut from: BufReader<tokio::io::Stdin>,
    to: ChildStdin,
    triggers: mpsc::Sender<Trigger>,
) {
    let mut to = Some(to);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(w) = to.as_mut()
            && (w.write_all(&buf[..n]).await.is_err() || w.flush().await.is_err())
        {
            to = None;
        }
    }
    drop(to);
    let _ = triggers.send(Trigger::StdinClosed).await;
}

/// CMD's output to ours, flushed after every read so nothing waits in a buffer. A write that
/// fails (`triggers` given: stdout) means nobody is listening any more.
async fn relay(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    triggers: Option<mpsc::Sender<Trigger>>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            if let Some(t) = triggers {
                let _ = t.send(Trigger::StdoutBroken).await;
            }
            return;
        }
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        _ => EXIT_OWN,
    }
}
