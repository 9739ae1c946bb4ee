//! `acpd supervise -- CMD…`: the far side of a remote child (and usable locally).
//!
//! It runs CMD in its own process group with PDEATHSIG, relays stdin, stdout and stderr byte
//! for byte, and runs the ladder (close CMD's stdin → eof grace → SIGTERM the group → term
//! grace → SIGKILL the group) when its own stdin closes, its stdout breaks, it gets SIGHUP,
//! SIGTERM or SIGINT, or its parent dies (its own PDEATHSIG is SIGTERM). It is a child
//! subreaper, so everything CMD starts stays its descendant however it detaches (`setsid`,
//! double fork); once CMD is gone the rest of that tree is ended too. Where it can create a
//! cgroup v2 group (root, or a delegated subtree) CMD runs in its own, `acpd-<pid>-<start>`
//! beside supervise, and teardown ends with `cgroup.kill`; a supervise that was SIGKILLed
//! leaves that group behind, and the next supervise or acpd started in the same parent group
//! kills what is in it and removes it (the name says whose it was). It exits with CMD's
//! status (128 + the signal when a signal ended it), 125 for its own failures, 126/127 when
//! CMD cannot be executed / found.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use super::diagnose::SUPERVISE_MARK;
use super::setup::{MAX_SETUP_LINE, Setup};
use crate::supervise::cgroup::{self, Cgroup};
use crate::supervise::{DEPTH_VAR, MAX_DEPTH_VAR, child_env, procfs};

/// What `acpd supervise` was asked to run.
#[derive(Debug, Clone)]
pub struct SuperviseArgs {
    /// Read the [`Setup`] line from stdin before starting CMD.
    pub setup_stdin: bool,
    /// The ladder's graces when no setup line gives them.
    pub eof_grace: Duration,
    pub term_grace: Duration,
    /// argv, run directly.
    pub command: Vec<String>,
}

/// Exit code for supervise's own failures (as `env`, `timeout` and `docker run` use it).
const EXIT_OWN: u8 = 125;
/// How long the rest of the tree may take to die after SIGKILL; only zombies whose living
/// parent does not reap them can hold it up.
const KILL_WAIT: Duration = Duration::from_secs(5);
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
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot set up signal handling: {0}")]
    Signals(#[source] io::Error),
    #[error("{} while waiting for the setup line; nothing was started", .0.as_str())]
    Interrupted(Signal),
}

impl SuperviseError {
    fn exit_code(&self) -> u8 {
        match self {
            SuperviseError::Spawn { source, .. } => match source.kind() {
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

pub async fn supervise(args: SuperviseArgs) -> u8 {
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
    let mut chld = signal(SignalKind::child()).map_err(SuperviseError::Signals)?;
    adopt_the_tree();
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
    let (eof_grace, term_grace) = setup.graces().unwrap_or((args.eof_grace, args.term_grace));
    let contained = own_group();
    let started = start(&args.command, setup, contained.as_ref().map(|(_, fd)| fd));
    let group = contained.map(|(group, _)| group);
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            if let Some(Err(e)) = group.as_ref().map(Cgroup::remove) {
                tracing::warn!("acpd supervise: {e}");
            }
            return Err(e);
        }
    };
    let leader = child.id().map_or(-1, |p| p as i32);
    // CMD enters its group before exec, or not at all (not fatal): a group it never entered
    // stays empty, and an empty group must not be read as "nothing of the tree is left".
    let group = match group {
        Some(g) if !g.members().contains(&leader) => {
            tracing::warn!(
                "acpd supervise: the command did not enter its cgroup; process groups only"
            );
            let _ = g.remove();
            None
        }
        g => g,
    };
    let (tx, mut triggers) = mpsc::channel::<Trigger>(4);
    let (Some(child_in), Some(child_out), Some(child_err)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = killpg(Pid::from_raw(leader), Signal::SIGKILL);
        let _ = child.wait().await;
        end_the_rest(leader, Duration::ZERO, group.as_ref()).await;
        return Err(SuperviseError::Spawn {
            program: args.command.first().cloned().unwrap_or_default(),
            source: io::Error::other("pipes missing"),
        });
    };
    let stdin_pump = tokio::spawn(pump_stdin(stdin, child_in, tx.clone()));
    let stdout_pump = tokio::spawn(relay(child_out, tokio::io::stdout(), Some(tx.clone())));
    let stderr_pump = tokio::spawn(relay(child_err, tokio::io::stderr(), None));
    drop(tx);
    let mut stdin_pump = Some(stdin_pump);
    let exited = loop {
        let trigger = tokio::select! {
            status = child.wait() => break status.ok(),
            Some(t) = triggers.recv() => t,
            _ = hup.recv() => Trigger::Signal("SIGHUP"),
            _ = term.recv() => Trigger::Signal("SIGTERM"),
            _ = int.recv() => Trigger::Signal("SIGINT"),
            _ = chld.recv() => {
                reap_strays(leader);
                continue;
            }
        };
        tracing::debug!(
            trigger = trigger.describe(),
            "acpd supervise: tearing the tree down"
        );
        // Closing CMD's stdin is the ladder's first rung.
        if let Some(pump) = stdin_pump.take() {
            pump.abort();
        }
        break ladder(&mut child, leader, eof_grace, term_grace).await;
    };
    end_the_rest(leader, term_grace, group.as_ref()).await;
    for pump in [stdout_pump, stderr_pump] {
        let _ = timeout(DRAIN, pump).await;
    }
    Ok(exited.map_or(EXIT_OWN, exit_code))
}

/// A subreaper keeps every orphan of the tree a descendant of ours, however it detached; our
/// own PDEATHSIG turns the death of whoever started us (sshd's session process, a local acpd)
/// into the same graceful teardown as a signal.
fn adopt_the_tree() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(
            "acpd supervise: cannot become a subreaper ({e}); detached descendants may escape"
        );
    }
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
}

/// CMD's cgroup, `acpd-<pid>-<start>` beside us (the name acpd's sweep knows), with its
/// `cgroup.procs` open for the child to enter before exec; `None` where we cannot create one
/// (no cgroup2, no permission, no `cgroup.kill`). Sweeps the groups of dead supervisors and
/// acpds in the same parent first.
fn own_group() -> Option<(Cgroup, OwnedFd)> {
    let own = cgroup::own_dir().ok()?;
    let me = std::process::id() as i32;
    let start = procfs::stat(me)?.start;
    let group = Cgroup::create(&own, &cgroup::base_name(me, start)).ok()?;
    let usable = group.path().join("cgroup.kill").exists();
    let procs = group.procs_fd().ok().filter(|_| usable);
    let Some(procs) = procs else {
        let _ = group.remove();
        return None;
    };
    cgroup::sweep(&own, Some(group.path()));
    Some((group, procs))
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

/// Spawns CMD in its own process group, with PDEATHSIG=SIGKILL and an empty signal mask.
/// Called on the runtime's one thread, which lives as long as we do (PDEATHSIG follows the
/// forking thread).
fn start(
    command: &[String],
    setup: Setup,
    group: Option<&OwnedFd>,
) -> Result<Child, SuperviseError> {
    let (program, args) = command.split_first().ok_or_else(|| SuperviseError::Spawn {
        program: String::new(),
        source: io::Error::new(io::ErrorKind::NotFound, "empty command"),
    })?;
    let cwd = match setup.cwd {
        Some(cwd) => cwd,
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
    };
    if !cwd.is_dir() {
        return Err(SuperviseError::Cwd(cwd));
    }
    let parent = nix::unistd::getpid();
    let procs = group.map(cgroup::raw);
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(environment(setup.env))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: between fork and exec only async-signal-safe syscalls (write, prctl, getppid,
    // sigprocmask); nothing allocates.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(procs) = procs {
                // Not fatal: without its group CMD is still in our tree and process group.
                let _ = cgroup::enter_in_child(procs);
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            Ok(())
        });
    }
    cmd.spawn().map_err(|source| SuperviseError::Spawn {
        program: program.clone(),
        source,
    })
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

/// eof grace → SIGTERM the group → term grace → SIGKILL the group; CMD's stdin is already
/// closed. Returns CMD's status.
async fn ladder(
    child: &mut Child,
    leader: i32,
    eof: Duration,
    term: Duration,
) -> Option<ExitStatus> {
    if let Ok(status) = timeout(eof, child.wait()).await {
        return status.ok();
    }
    let _ = killpg(Pid::from_raw(leader), Signal::SIGTERM);
    if let Ok(status) = timeout(term, child.wait()).await {
        return status.ok();
    }
    let _ = killpg(Pid::from_raw(leader), Signal::SIGKILL);
    child.wait().await.ok()
}

/// Ends whatever of the tree outlived CMD — its group, every descendant that left it, and
/// everything in its cgroup — with SIGTERM, then after `term_grace` SIGKILL (and
/// `cgroup.kill`), reaping as it goes, and removes the cgroup. CMD is already reaped, so every
/// child left is ours to wait for.
async fn end_the_rest(leader: i32, term_grace: Duration, group: Option<&Cgroup>) {
    reap_all();
    let left = tree_left(group);
    if !left.is_empty() || group.is_some_and(Cgroup::populated) {
        let _ = killpg(Pid::from_raw(leader), Signal::SIGTERM);
        signal_each(&left, Signal::SIGTERM);
        if !gone_by(crate::config::durations::deadline(term_grace), group).await {
            if let Some(g) = group {
                let _ = g.kill();
            }
            let _ = killpg(Pid::from_raw(leader), Signal::SIGKILL);
            signal_each(&tree_left(group), Signal::SIGKILL);
            if !gone_by(Instant::now() + KILL_WAIT, group).await {
                tracing::warn!(left = ?descendants(), "acpd supervise: processes left after SIGKILL");
            }
        }
        // A cgroup empties before its last processes are zombies we can reap: wait for those.
        if group.is_some() {
            gone_by(Instant::now() + KILL_WAIT, None).await;
        }
    }
    if let Some(Err(e)) = group.map(Cgroup::remove) {
        tracing::warn!("acpd supervise: {e}");
    }
}

fn signal_each(pids: &[i32], sig: Signal) {
    for &pid in pids {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// Reaps every exited child; only once CMD is reaped (tokio owns its status until then).
fn reap_all() {
    while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Reaps until no descendant is left (and `group` is empty) or `deadline` passes; true when
/// none is left.
async fn gone_by(deadline: Instant, group: Option<&Cgroup>) -> bool {
    crate::supervise::poll_until(deadline, || {
        reap_all();
        tree_left(group).is_empty() && !group.is_some_and(Cgroup::populated)
    })
    .await
}

/// What is left of the tree: with a cgroup, nothing once it is empty (everything CMD started
/// was born in it; reading `cgroup.events` spares a `/proc` scan at every teardown), else
/// every descendant.
fn tree_left(group: Option<&Cgroup>) -> Vec<i32> {
    match group {
        Some(g) if !g.populated() => Vec::new(),
        _ => descendants(),
    }
}

/// Every live or zombie process below us, found through `/proc` parent links (one read of
/// each `stat`: this runs at every teardown, on hosts with many processes).
fn descendants() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    let mut buf = [0u8; 1024];
    for pid in procfs::pids() {
        let Ok(mut file) = std::fs::File::open(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Ok(n) = io::Read::read(&mut file, &mut buf) else {
            continue;
        };
        if let Some(stat) = std::str::from_utf8(&buf[..n]).ok().and_then(procfs::parse) {
            children.entry(stat.ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut queue = VecDeque::from([me]);
    while let Some(pid) = queue.pop_front() {
        for &kid in children.get(&pid).into_iter().flatten() {
            found.push(kid);
            queue.push_back(kid);
        }
    }
    found
}

/// Reaps zombies adopted as subreaper while CMD runs, never CMD itself (tokio owns its
/// status): `waitid(WNOWAIT)` shows an exited child without reaping it.
fn reap_strays(leader: i32) {
    use nix::sys::wait::{Id, waitid};
    let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    while let Ok(status) = waitid(Id::All, peek) {
        match status.pid() {
            Some(pid) if pid.as_raw() != leader => {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            }
            // None exited, or CMD did: the main loop gets its status.
            _ => return,
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
