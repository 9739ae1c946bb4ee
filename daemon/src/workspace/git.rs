//! git, run by argv from acpd itself: an environment of acpd's choosing (nothing such as
//! `GIT_DIR` from acpd's own environment redirects it), and configuration a child could have
//! planted made inert on every call (hooks, fsmonitor, external diff and textconv programs).

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::Duration;

use super::WorkspaceError;

/// How long one git command may take (a `worktree add` of a large checkout included).
const GIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Settings given on every command line: they win over every config file, including one a
/// child may have written into its worktree's git directory.
const SAFE_CONFIG: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "commit.gpgsign=false",
    "core.pager=cat",
    "protocol.allow=never",
];

/// The few variables git needs from acpd's environment (and none of `GIT_*`).
fn env() -> Vec<(OsString, OsString)> {
    let keep = ["PATH", "HOME", "XDG_CONFIG_HOME", "TMPDIR"];
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| keep.iter().any(|n| k == n))
        .collect();
    env.push(("LC_ALL".into(), "C".into()));
    env.push(("GIT_TERMINAL_PROMPT".into(), "0".into()));
    env.push(("GIT_CONFIG_NOSYSTEM".into(), "1".into()));
    env
}

/// What a git command printed, when it succeeded.
pub(super) struct Out {
    pub stdout: Vec<u8>,
}

impl Out {
    /// stdout as one trimmed line.
    pub(super) fn line(&self) -> String {
        String::from_utf8_lossy(&self.stdout).trim().to_string()
    }
}

/// Runs `git -C dir ARGS` (with `--git-dir` when `tree` is given, and `--work-tree` when it
/// names one); a non-zero exit is [`WorkspaceError::Git`] with git's own message.
pub(super) async fn git(
    dir: &Path,
    tree: Option<(&Path, Option<&Path>)>,
    args: &[&OsStr],
    what: &'static str,
) -> Result<Out, WorkspaceError> {
    let mut argv: Vec<OsString> = vec!["git".into()];
    for c in SAFE_CONFIG {
        argv.push("-c".into());
        argv.push((*c).into());
    }
    argv.push("-C".into());
    argv.push(dir.into());
    if let Some((git_dir, work_tree)) = tree {
        let mut g = OsString::from("--git-dir=");
        g.push(git_dir);
        argv.push(g);
        if let Some(work_tree) = work_tree {
            let mut w = OsString::from("--work-tree=");
            w.push(work_tree);
            argv.push(w);
        }
    }
    argv.extend(args.iter().map(|a| a.to_os_string()));
    let out = crate::supervise::run_helper(&argv, dir, env(), GIT_TIMEOUT)
        .await
        .map_err(|source| WorkspaceError::Spawn { what, source })?;
    if !out.status.success() {
        let message = String::from_utf8_lossy(&out.stderr);
        let message = message.trim();
        return Err(WorkspaceError::Git {
            what,
            message: if message.is_empty() {
                format!("git exited with {}", out.status)
            } else {
                message.chars().take(600).collect()
            },
        });
    }
    Ok(Out { stdout: out.stdout })
}
