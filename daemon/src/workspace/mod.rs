//! A workspace per child: a git worktree of the cwd's repository on a branch of its own
//! (`acpd/<run id>`), in acpd's data directory, so that children started on one repository
//! never edit the same files or the parent's checkout. At the end of each turn the child's
//! work is committed on its branch and reported (`changed`, `diffstat` against the base);
//! dispose removes the worktree and keeps the branch. Work git refuses to commit (a locked
//! index, a nested repository, a file it cannot read) is reported as the turn's
//! `workspace.failure`, and its worktree is never removed unless the disposer forces it. A
//! marker beside each worktree names the acpd that owns it, so the next acpd removes the
//! worktrees of one that was SIGKILLed ([`sweep`]), committing what they hold first.

mod commit;
mod git;
mod sweep;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use acpd_protocol::subagent::WorkspaceFailureKind;

use git::git;
pub(crate) use sweep::{mark_tmp, sweep, tmps_dir};

/// Why a workspace could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "{} is not in a git repository, so it cannot have a worktree (workspace = \"worktree\"): {message}; use workspace = \"shared\" or a cwd inside a repository",
        cwd.display()
    )]
    NotARepository { cwd: PathBuf, message: String },
    #[error("git could not {what}: {message}")]
    Git { what: &'static str, message: String },
    #[error("cannot run git to {what}: {source}; is git installed and on PATH?")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the ref {0:?} is not a ref name or commit acpd passes to git (it may not start with '-' or contain control characters)"
    )]
    BadRef(String),
    #[error(
        "the ref {wanted:?} names no commit of the repository at {}: {message}; give a branch, tag or commit it has",
        repo.display()
    )]
    UnknownRef {
        wanted: String,
        repo: PathBuf,
        message: String,
    },
    #[error(
        "git leaves {} off the branch: a directory holding a `.git` of its own (a nested repository, or a `.git` file) is not the worktree's to commit; move its files out of it and remove that `.git`",
        paths.join(", ")
    )]
    NotAdded { paths: Vec<String> },
    #[error(
        "the work in the worktree {} is not committed on its branch ({source}); the worktree stays: commit or copy the work there, then `git worktree remove --force {}`",
        path.display(), path.display()
    )]
    Uncommitted {
        kind: WorkspaceFailureKind,
        path: PathBuf,
        #[source]
        source: Box<WorkspaceError>,
    },
    #[error("acpd has no data directory for worktrees (set XDG_DATA_HOME or HOME)")]
    NoDataDir,
    #[error("cannot prepare {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: crate::private_fs::PrivateError,
    },
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The directory worktrees live in: `<data dir>/worktrees`.
pub(crate) fn worktrees_dir() -> Option<PathBuf> {
    crate::config::presets::data_dir().map(|d| d.join("worktrees"))
}

/// One child's worktree.
#[derive(Debug)]
pub struct Worktree {
    /// The run or session id it was made for (its directory's and branch's name).
    pub id: String,
    pub branch: String,
    pub path: PathBuf,
    /// The commit it started from.
    pub base: String,
    /// The repository's top level (the main worktree).
    pub repo: PathBuf,
    /// The worktree's own git directory, read once at creation: acpd's later git commands
    /// name it explicitly, never trusting the `.git` file the child can rewrite.
    git_dir: PathBuf,
    /// Where the child starts: the worktree plus the requested cwd's subdirectory.
    pub cwd: PathBuf,
    marker: PathBuf,
}

/// The git directories of the repository holding `cwd`, absolute and resolved: its own and
/// the common one (where its config, `info/attributes` and hooks live). What git reads there
/// decides what programs it runs (a `filter` driver runs on every checkout and `add`).
pub(crate) async fn git_dirs(cwd: &Path) -> Result<[PathBuf; 2], WorkspaceError> {
    let a = |s: &'static str| OsStr::new(s);
    let out = git(
        cwd,
        None,
        &[
            a("rev-parse"),
            a("--path-format=absolute"),
            a("--git-dir"),
            a("--git-common-dir"),
        ],
        "find the repository",
    )
    .await
    .map_err(|e| not_a_repository(cwd, e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().map(|l| {
        let path = PathBuf::from(l);
        std::fs::canonicalize(&path).map_err(|source| WorkspaceError::Io {
            what: "resolve",
            path,
            source,
        })
    });
    match (lines.next(), lines.next()) {
        (Some(git_dir), Some(common)) => Ok([git_dir?, common?]),
        _ => Err(WorkspaceError::Git {
            what: "find the repository",
            message: format!(
                "git rev-parse printed no git directory for {}",
                cwd.display()
            ),
        }),
    }
}

/// Run ids and session ids are uuids (with a prefix); anything else is refused as a name.
fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 100
        && !id.starts_with(['.', '-'])
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// What a new worktree checks out.
#[derive(Debug, Clone, Copy)]
pub enum Base<'a> {
    /// A new branch `acpd/<id>` at this ref (`None`: the cwd's `HEAD`).
    Commit(Option<&'a str>),
    /// The branch `acpd/<id>` an earlier worktree of the same id left (a bridge session
    /// opened again after its worktree was removed): its work goes on where it stopped.
    OwnBranch,
}

/// Whether `cwd` is in a repository that has the branch `acpd/<id>` (false when it is not
/// in a repository at all).
pub(crate) async fn has_own_branch(cwd: &Path, id: &str) -> bool {
    if !safe_id(id) {
        return false;
    }
    let branch = format!("refs/heads/acpd/{id}");
    let a = |s: &'static str| OsStr::new(s);
    git(
        cwd,
        None,
        &[
            a("rev-parse"),
            a("--verify"),
            a("--quiet"),
            a("--end-of-options"),
            OsStr::new(&branch),
        ],
        "look for a session's branch",
    )
    .await
    .is_ok()
}

impl Worktree {
    /// Makes a worktree of `cwd`'s repository, as `base` says, on the branch `acpd/<id>`,
    /// under [`worktrees_dir`].
    pub async fn create(cwd: &Path, id: &str, base: Base<'_>) -> Result<Worktree, WorkspaceError> {
        let dir = worktrees_dir().ok_or(WorkspaceError::NoDataDir)?;
        Self::create_at(&dir, cwd, id, base).await
    }

    /// [`Worktree::create`] in `dir`, on a new branch at `base_ref` (else `HEAD`).
    pub async fn create_in(
        dir: &Path,
        cwd: &Path,
        id: &str,
        base_ref: Option<&str>,
    ) -> Result<Worktree, WorkspaceError> {
        Self::create_at(dir, cwd, id, Base::Commit(base_ref)).await
    }

    pub async fn create_at(
        dir: &Path,
        cwd: &Path,
        id: &str,
        base: Base<'_>,
    ) -> Result<Worktree, WorkspaceError> {
        Self::create_with(dir, cwd, id, base, None).await
    }

    /// [`Worktree::create`] of the repository whose git directory is `git_dir` (found by
    /// [`git_dirs`] and checked by the caller), named to git on every command that reads the
    /// repository: a `.git` in `cwd` swapped after the check redirects nothing.
    pub async fn create_pinned(
        cwd: &Path,
        id: &str,
        base: Base<'_>,
        git_dir: &Path,
    ) -> Result<Worktree, WorkspaceError> {
        let dir = worktrees_dir().ok_or(WorkspaceError::NoDataDir)?;
        Self::create_with(&dir, cwd, id, base, Some(git_dir)).await
    }

    async fn create_with(
        dir: &Path,
        cwd: &Path,
        id: &str,
        base: Base<'_>,
        pin: Option<&Path>,
    ) -> Result<Worktree, WorkspaceError> {
        if !safe_id(id) {
            return Err(WorkspaceError::BadRef(id.to_string()));
        }
        let arg = |s: &'static str| OsStr::new(s);
        let top = git(
            cwd,
            None,
            &[arg("rev-parse"), arg("--show-toplevel")],
            "find the repository",
        )
        .await
        .map_err(|e| not_a_repository(cwd, e))?;
        let repo = PathBuf::from(top.line());
        let prefix = git(
            cwd,
            None,
            &[arg("rev-parse"), arg("--show-prefix")],
            "read the cwd's place in its repository",
        )
        .await?
        .line();
        let branch = format!("acpd/{id}");
        let own_ref = format!("refs/heads/{branch}");
        let wanted = match base {
            Base::Commit(base_ref) => base_ref.unwrap_or("HEAD"),
            Base::OwnBranch => &own_ref,
        };
        if wanted.starts_with('-') || wanted.chars().any(char::is_control) || wanted.is_empty() {
            return Err(WorkspaceError::BadRef(wanted.to_string()));
        }
        let spec = format!("{wanted}^{{commit}}");
        let pin = pin.map(|g| (g, None));
        let base_commit = git(
            &repo,
            pin,
            &[
                arg("rev-parse"),
                arg("--verify"),
                arg("--end-of-options"),
                OsStr::new(&spec),
            ],
            "find the base commit",
        )
        .await
        .map_err(|e| match e {
            WorkspaceError::Git { message, .. } => WorkspaceError::UnknownRef {
                wanted: wanted.to_string(),
                repo: repo.clone(),
                message,
            },
            e => e,
        })?
        .line();
        crate::private_fs::private_dir(dir).map_err(|source| WorkspaceError::Dir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(id);
        // The marker first: an acpd killed during `worktree add` leaves it to be swept.
        // Pinned: the common git directory, asked of the pinned one, for the sweep.
        let common = match pin {
            Some(tree) => Some(PathBuf::from(
                git(
                    &repo,
                    Some(tree),
                    &[
                        arg("rev-parse"),
                        arg("--path-format=absolute"),
                        arg("--git-common-dir"),
                    ],
                    "find the repository's git directory",
                )
                .await?
                .line(),
            )),
            None => None,
        };
        let marker = sweep::mark(dir, id, &repo, common.as_deref())?;
        let mut add = vec![arg("worktree"), arg("add"), arg("--quiet")];
        match base {
            Base::Commit(_) => add.extend([arg("-b"), OsStr::new(&branch), path.as_os_str()]),
            Base::OwnBranch => add.extend([path.as_os_str(), OsStr::new(&branch)]),
        }
        if let Base::Commit(_) = base {
            add.push(OsStr::new(&base_commit));
        }
        let added = git(&repo, pin, &add, "add a worktree").await;
        if let Err(e) = added {
            let _ = std::fs::remove_file(&marker);
            return Err(e);
        }
        let git_dir = git(
            &path,
            None,
            &[arg("rev-parse"), arg("--absolute-git-dir")],
            "read the worktree's git directory",
        )
        .await
        .map(|o| PathBuf::from(o.line()));
        let mut tree = Worktree {
            id: id.to_string(),
            branch,
            cwd: path.join(&prefix),
            path,
            base: base_commit,
            repo,
            git_dir: PathBuf::new(),
            marker,
        };
        match git_dir {
            Ok(g) => tree.git_dir = g,
            Err(e) => {
                tree.remove(false).await;
                return Err(e);
            }
        }
        // A cwd in a directory the base commit does not have (untracked, ignored) still
        // starts at the same place in the worktree.
        if let Err(source) = std::fs::create_dir_all(&tree.cwd) {
            let path = tree.cwd.clone();
            tree.remove(false).await;
            return Err(WorkspaceError::Io {
                what: "create",
                path,
                source,
            });
        }
        Ok(tree)
    }

    /// git in the worktree, through the git directory read at creation.
    async fn git(&self, args: &[&OsStr], what: &'static str) -> Result<git::Out, WorkspaceError> {
        git(
            &self.path,
            Some((&self.git_dir, Some(&self.path))),
            args,
            what,
        )
        .await
    }

    /// Removes the worktree (whatever is in it) and, unless `keep_branch`, its branch; then
    /// its marker. Failures are logged: a worktree left behind is pruned by a later sweep.
    pub async fn remove(&self, keep_branch: bool) {
        remove(&self.repo, &self.path, &self.branch, keep_branch).await;
        let _ = std::fs::remove_file(&self.marker);
    }
}

/// The worktree `<dir>/<id>` of `repo` that a stopped acpd left, when it is one: its git
/// directory is the repository's `worktrees/<id>`, and that names this path back (a `.git`
/// file in the worktree, which its child could rewrite, is never read). `common`: the
/// repository's common git directory as its marker pinned it; without one, asked of `repo`.
pub(super) async fn left_behind(
    repo: &Path,
    common: Option<&Path>,
    dir: &Path,
    id: &str,
) -> Option<Worktree> {
    let a = |s: &'static str| OsStr::new(s);
    let common = match common {
        Some(c) => c.to_path_buf(),
        None => PathBuf::from(
            git(
                repo,
                None,
                &[
                    a("rev-parse"),
                    a("--path-format=absolute"),
                    a("--git-common-dir"),
                ],
                "find the repository's git directory",
            )
            .await
            .ok()?
            .line(),
        ),
    };
    let path = dir.join(id);
    if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    let git_dir = common.join("worktrees").join(id);
    let named = std::fs::read_to_string(git_dir.join("gitdir")).ok()?;
    if Path::new(named.trim()) != path.join(".git") {
        return None;
    }
    Some(Worktree {
        id: id.to_string(),
        branch: format!("acpd/{id}"),
        cwd: path.clone(),
        path,
        base: String::new(),
        repo: repo.to_path_buf(),
        git_dir,
        marker: dir.join(format!("{id}.owner")),
    })
}

/// The removal shared with the sweep: `git worktree remove --force`, else the directory and a
/// `git worktree prune`.
async fn remove(repo: &Path, path: &Path, branch: &str, keep_branch: bool) {
    let a = |s: &'static str| OsStr::new(s);
    let removed = git(
        repo,
        None,
        &[
            a("worktree"),
            a("remove"),
            a("--force"),
            a("--force"),
            path.as_os_str(),
        ],
        "remove a worktree",
    )
    .await;
    if let Err(e) = removed {
        tracing::debug!("{e}; removing {} by hand", path.display());
        if let Err(e) = std::fs::remove_dir_all(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove the worktree {}: {e}", path.display());
        }
        let _ = git(repo, None, &[a("worktree"), a("prune")], "prune worktrees").await;
    }
    if !keep_branch
        && let Err(e) = git(
            repo,
            None,
            &[
                a("branch"),
                a("--quiet"),
                a("-D"),
                a("--end-of-options"),
                OsStr::new(branch),
            ],
            "delete the branch",
        )
        .await
    {
        tracing::warn!("{e}");
    }
}

/// Git's refusal to find a repository at `cwd`, told as what it means for a start.
fn not_a_repository(cwd: &Path, e: WorkspaceError) -> WorkspaceError {
    match e {
        WorkspaceError::Git { message, .. } => WorkspaceError::NotARepository {
            cwd: cwd.to_path_buf(),
            message,
        },
        e => e,
    }
}

#[cfg(test)]
mod tests;
