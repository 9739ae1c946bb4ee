//! Short commands acpd runs for itself (git, for worktrees): argv, never a shell; an
//! environment acpd chooses; output capped; a deadline after which the command is killed. Each
//! is registered as a leader while it runs, so the stray reaper (acpd is a subreaper and reaps
//! every child that is not a leader) leaves its exit status to the waiter here.

use std::ffi::OsString;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::reaper;

/// What a helper command left: its status and its capped output.
#[derive(Debug)]
pub(crate) struct HelperOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The most of each stream kept; the rest is read and dropped so the command never blocks.
const CAP: u64 = 1 << 20;

/// Forgets the pid as a leader however the wait ends (a cancelled caller included).
struct Leader(Option<i32>);

impl Drop for Leader {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            reaper::leaders().remove(&pid);
        }
    }
}

/// Runs `argv` in `cwd` with exactly `env`, stdin closed; killed when `timeout` passes (an
/// `ErrorKind::TimedOut` error).
pub(crate) async fn run_helper(
    argv: &[OsString],
    cwd: &Path,
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
) -> std::io::Result<HelperOutput> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::other("empty helper command"));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: restore_in_child is one async-signal-safe syscall.
    unsafe {
        cmd.pre_exec(super::sched::restore_in_child);
    }
    let (mut child, _leader) = {
        let mut leaders = reaper::leaders();
        let child = cmd.spawn()?;
        let pid = child.id().map(|p| p as i32);
        if let Some(pid) = pid {
            leaders.insert(pid);
        }
        (child, Leader(pid))
    };
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("helper pipes missing"));
    };
    let work = async {
        let (stdout, stderr) = tokio::try_join!(capped(out), capped(err))?;
        let status = child.wait().await?;
        Ok(HelperOutput {
            status,
            stdout,
            stderr,
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("did not finish within {timeout:?}"),
        )),
    }
}

async fn capped(mut from: impl AsyncRead + Unpin) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    (&mut from).take(CAP).read_to_end(&mut kept).await?;
    tokio::io::copy(&mut from, &mut tokio::io::sink()).await?;
    Ok(kept)
}
