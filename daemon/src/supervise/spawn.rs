//! Spawning children from one dedicated thread.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. A
//! child forked from a tokio blocking-pool thread is killed when that thread idles out, so every
//! child is forked from a thread that lives as long as acpd.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::sync::mpsc as std_mpsc;

use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::oneshot;

use super::cgroup::{self, CgroupError};
use super::contain::{self, ChildLimits, Placement};
use super::reaper;
use super::sandbox::Sandbox;
use super::sched;
use super::tree::{Contained, ProcessTree};
use std::sync::Arc;

/// What to run: argv (never a shell), an absolute cwd, and the complete environment.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(OsString, OsString)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot start `{program}`: {source}")]
    Io {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the command is empty")]
    EmptyCommand,
    #[error("the spawner thread is not running (supervise::init was not called)")]
    NoSpawner,
    #[error("cannot contain the child: {0}")]
    Contain(#[from] CgroupError),
}

/// A started child: its process tree and its three pipes.
pub(crate) struct Spawned {
    pub tree: ProcessTree,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
}

type Job = Box<dyn FnOnce() + Send>;

static JOBS: OnceLock<std_mpsc::Sender<Job>> = OnceLock::new();

pub(super) fn start_thread() {
    let (tx, rx) = std_mpsc::channel::<Job>();
    let started = std::thread::Builder::new()
        .name("acpd-spawner".into())
        .spawn(move || {
            for job in rx {
                job();
            }
        });
    match started {
        Ok(_) => {
            let _ = JOBS.set(tx);
        }
        Err(e) => tracing::error!("cannot start the spawner thread: {e}"),
    }
}

/// The driver tests' stand-in process: [`spawn_sandboxed`] with no limits and no sandbox.
#[cfg(test)]
pub(crate) async fn spawn(spec: SpawnSpec) -> Result<Spawned, SpawnError> {
    spawn_sandboxed(spec, ChildLimits::default(), None).await
}

/// Spawns `spec` in a new process group, with PDEATHSIG=SIGKILL and acpd's original
/// `RLIMIT_NOFILE`, stdin/stdout/stderr piped, in its own cgroup when acpd contains by cgroups,
/// with a provider's `memory_max` / `pids_max` on that cgroup (ignored where the controllers are not enabled; acpd
/// warned at start), the child's whole tree under `sandbox` (applied last before exec); the
/// tree keeps the sandbox (and so its private tmp) until it is gone.
pub(crate) async fn spawn_sandboxed(
    spec: SpawnSpec,
    limits: ChildLimits,
    sandbox: Option<Arc<Sandbox>>,
) -> Result<Spawned, SpawnError> {
    if spec.argv.is_empty() {
        return Err(SpawnError::EmptyCommand);
    }
    spawn_placed(spec, contain::place(&limits)?, sandbox).await
}

/// Spawns the one command of `acpd supervise`, whose tree is every descendant of this process
/// ([`init`](super::init) makes it a subreaper), in its own cgroup beside ours where it can be
/// created. Its ladder is [`ProcessTree::teardown`], as for acpd's children.
pub(crate) async fn spawn_standalone(spec: SpawnSpec) -> Result<Spawned, SpawnError> {
    if spec.argv.is_empty() {
        return Err(SpawnError::EmptyCommand);
    }
    spawn_placed(spec, contain::place_standalone(), None).await
}

async fn spawn_placed(
    spec: SpawnSpec,
    placement: Placement,
    sandbox: Option<Arc<Sandbox>>,
) -> Result<Spawned, SpawnError> {
    let (program, args) = spec.argv.split_first().ok_or(SpawnError::EmptyCommand)?;
    let program = program.clone();
    let args = args.to_vec();
    let jobs = JOBS.get().ok_or(SpawnError::NoSpawner)?;
    let mut env = spec.env;
    // Whether the child must enter its cgroup (else the spawn fails).
    let mut must_enter = true;
    let (contained, procs) = match placement {
        Placement::Cgroup { group, procs } => (Contained::Cgroup(group), Some(procs)),
        Placement::Token(token) => {
            env.push((contain::TREE_VAR.into(), token.clone().into()));
            (Contained::Token(token), None)
        }
        Placement::Group => (Contained::Group, None),
        Placement::Standalone(placed) => {
            must_enter = false;
            let (group, procs) = placed.unzip();
            (Contained::Descendants(group), procs)
        }
    };
    let (tx, rx) = oneshot::channel();
    let job_program = program.clone();
    let landlock = sandbox.as_ref().map(|s| s.raw_fd());
    // The child is registered with the caller's runtime (its reaper and pipes live there).
    let runtime = tokio::runtime::Handle::current();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        // `procs` stays open until the fork is done; it is close-on-exec.
        let procs_fd = procs.as_ref().map(cgroup::raw);
        let _ = tx.send(spawn_here(
            &job_program,
            &args,
            spec.cwd,
            env,
            procs_fd,
            must_enter,
            landlock,
        ));
        drop(procs);
    });
    jobs.send(job).map_err(|_| SpawnError::NoSpawner)?;
    let spawned = match rx.await {
        Ok(result) => result.map_err(|source| SpawnError::Io {
            program: program.clone(),
            source,
        }),
        Err(_) => Err(SpawnError::NoSpawner),
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if let Contained::Cgroup(group) | Contained::Descendants(Some(group)) = &contained {
                let _ = group.remove();
            }
            return Err(e);
        }
    };
    let contained = match contained {
        // A group the child never entered stays empty, and an empty group must not be read
        // as "nothing of the tree is left".
        Contained::Descendants(Some(group))
            if !child
                .id()
                .is_some_and(|pid| group.members().contains(&(pid as i32))) =>
        {
            tracing::warn!("the command did not enter its cgroup; process groups only");
            let _ = group.remove();
            Contained::Descendants(None)
        }
        contained => contained,
    };
    if let Some(pid) = child.id() {
        super::records::add(pid as i32).landed().await;
    }
    reaper::churned();
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let tree = ProcessTree::adopt(child, contained, sandbox);
    match pipes {
        (Some(stdin), Some(stdout), Some(stderr)) => Ok(Spawned {
            tree,
            stdin,
            stdout,
            stderr,
        }),
        _ => {
            tree.kill_now();
            Err(SpawnError::Io {
                program,
                source: std::io::Error::other("child pipes missing"),
            })
        }
    }
}

/// Runs on the spawner thread. Holds the leader set's lock across fork and registration so the
/// stray reaper can never mistake a fresh leader for a stray.
fn spawn_here(
    program: &str,
    args: &[String],
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
    cgroup_procs: Option<std::os::fd::RawFd>,
    must_enter: bool,
    landlock: Option<std::os::fd::RawFd>,
) -> std::io::Result<Child> {
    let parent = nix::unistd::getpid();
    let nofile = reaper::original_nofile();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe syscalls
    // (write, close_range, prctl, getppid, setrlimit, sigprocmask, sched_setscheduler, landlock_restrict_self on a ruleset
    // built before the fork); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // First: nothing the child does, not even a failed exec, happens outside its group.
            if let Some(fd) = cgroup_procs {
                match cgroup::enter_in_child(fd) {
                    Err(e) if must_enter => return Err(e),
                    // Without its group it is still in our tree and its process group.
                    _ => {}
                }
            }
            // No descriptor but its stdio reaches the child: one that acpd's launcher left
            // open across exec would otherwise be the child's to write through, sandbox or
            // not (Landlock checks opens, not descriptors). Marked close-on-exec rather than
            // closed: the Landlock ruleset's is still used below. Every kernel with Landlock
            // has the flag (5.11); without it, only an unsandboxed child starts.
            let marked = nix::libc::syscall(
                nix::libc::SYS_close_range,
                3u32,
                u32::MAX,
                nix::libc::CLOSE_RANGE_CLOEXEC,
            );
            if marked != 0 && landlock.is_some() {
                return Err(std::io::Error::last_os_error());
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            if let Some((soft, hard)) = nofile {
                setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
            }
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            sched::restore_in_child()?;
            // Last: the rules bind the exec and everything the child starts.
            if let Some(fd) = landlock {
                Sandbox::restrict_in_child(fd)?;
            }
            Ok(())
        });
    }
    let mut leaders = reaper::leaders();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        leaders.insert(pid as i32);
    }
    Ok(child)
}
