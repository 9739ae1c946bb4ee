//! The child's work onto its branch: each turn's commit and report ([`Worktree::settle`]),
//! what git will not take said as the report's `failure` (never dropped in silence), and the
//! last commit before the worktree goes ([`Worktree::dispose`]), which keeps a worktree whose
//! work git refuses unless forced.

use std::ffi::OsStr;

use acpd_protocol::subagent::{
    IGNORED_LISTED, WorkspaceFailure, WorkspaceFailureKind, WorkspaceReport,
};

use super::{WorkspaceError, Worktree};

/// How many paths git left off a commit an error names.
const NOT_ADDED_LISTED: usize = 20;

impl Worktree {
    /// Commits whatever the child left in the worktree (untracked files too, not ignored
    /// ones) on its branch, then reports the branch against the base. Never fails: work
    /// that could not be committed is the report's `failure`, naming git's message and the
    /// worktree that still holds it.
    pub async fn settle(&self, turn: u32) -> WorkspaceReport {
        let committed = self
            .commit_all(&format!("acpd: run {} turn {turn}", self.id))
            .await;
        let mut report = match self.report().await {
            Ok(r) => r,
            Err(e) => WorkspaceReport {
                branch: self.branch.clone(),
                path: self.path.clone(),
                base: self.base.clone(),
                changed: Vec::new(),
                diffstat: String::new(),
                ignored: Vec::new(),
                ignored_more: 0,
                failure: Some(WorkspaceFailure {
                    kind: WorkspaceFailureKind::Report,
                    path: self.path.clone(),
                    message: e.to_string(),
                }),
            },
        };
        if let Err(WorkspaceError::Uncommitted { kind, path, source }) = committed {
            report.failure = Some(WorkspaceFailure {
                kind,
                path,
                message: source.to_string(),
            });
        }
        report
    }

    /// Commits whatever the child left in the worktree (untracked files too, not ignored
    /// ones) on its branch as `message`; nothing when nothing changed. Any refusal is
    /// [`WorkspaceError::Uncommitted`]: the work is still only in the worktree.
    pub async fn commit_all(&self, message: &str) -> Result<(), WorkspaceError> {
        let uncommitted = |kind| {
            let path = self.path.clone();
            move |e: WorkspaceError| WorkspaceError::Uncommitted {
                kind,
                path,
                source: Box::new(e),
            }
        };
        let a = |s: &'static str| OsStr::new(s);
        self.git(&[a("add"), a("--all")], "stage the child's changes")
            .await
            .map_err(uncommitted(WorkspaceFailureKind::Stage))?;
        let staged = self
            .git(
                &[
                    a("diff"),
                    a("--cached"),
                    a("--raw"),
                    a("-z"),
                    a("--no-abbrev"),
                ],
                "read staged changes",
            )
            .await
            .map_err(uncommitted(WorkspaceFailureKind::Stage))?;
        let nested = gitlinks(&staged.stdout);
        if !nested.is_empty() {
            // Unstaged again, so a later commit (of a later turn) never records the gitlink.
            let mut reset = vec![a("reset"), a("--quiet"), a("--")];
            reset.extend(nested.iter().map(OsStr::new));
            let _ = self.git(&reset, "unstage a nested repository").await;
        }
        // What `add --all` passed over without a word (a directory with a `.git` file of
        // its own), neither staged nor ignored: work the commit would silently drop.
        let left = self
            .git(
                &[
                    a("ls-files"),
                    a("--others"),
                    a("--exclude-standard"),
                    a("--directory"),
                    a("--no-empty-directory"),
                    a("-z"),
                ],
                "list what git left unstaged",
            )
            .await
            .map_err(uncommitted(WorkspaceFailureKind::Stage))?;
        let left: Vec<String> = left
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .take(NOT_ADDED_LISTED)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        let mut left_off = left;
        for n in nested {
            if !left_off.contains(&format!("{n}/")) {
                left_off.push(n);
            }
        }
        let staged = self
            .git(
                &[a("diff"), a("--cached"), a("--name-only"), a("-z")],
                "read staged changes",
            )
            .await
            .map_err(uncommitted(WorkspaceFailureKind::Stage))?;
        if !staged.stdout.is_empty() {
            self.git(
                &[
                    a("-c"),
                    a("user.name=acpd"),
                    a("-c"),
                    a("user.email=acpd@localhost"),
                    a("commit"),
                    a("--quiet"),
                    a("--no-verify"),
                    a("-m"),
                    OsStr::new(message),
                ],
                "commit the child's changes",
            )
            .await
            .map_err(uncommitted(WorkspaceFailureKind::Commit))?;
        }
        // The rest is committed; what git left off is still only in the worktree.
        if !left_off.is_empty() {
            return Err(uncommitted(WorkspaceFailureKind::NotAdded)(
                WorkspaceError::NotAdded { paths: left_off },
            ));
        }
        Ok(())
    }

    /// Commits what the worktree holds as `message`, then removes it (and, unless
    /// `keep_branch`, its branch). Work that cannot be committed keeps the worktree, and its
    /// marker goes so no sweep removes it either, unless `force`.
    pub async fn dispose(
        &self,
        message: &str,
        keep_branch: bool,
        force: bool,
    ) -> Result<(), WorkspaceError> {
        if let Err(e) = self.commit_all(message).await {
            if !force {
                let _ = std::fs::remove_file(&self.marker);
                tracing::warn!("{e}");
                return Err(e);
            }
            tracing::warn!("{e}; removed all the same (force)");
        }
        self.remove(keep_branch).await;
        Ok(())
    }

    /// The branch against the base: every path changed, and git's diffstat.
    async fn report(&self) -> Result<WorkspaceReport, WorkspaceError> {
        let a = |s: &'static str| OsStr::new(s);
        let range = format!("{}..HEAD", self.base);
        let names = self
            .git(
                &[
                    a("diff"),
                    a("--no-ext-diff"),
                    a("--no-textconv"),
                    a("--name-only"),
                    a("-z"),
                    OsStr::new(&range),
                ],
                "list changed paths",
            )
            .await?;
        let changed = names
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        let stat = self
            .git(
                &[
                    a("diff"),
                    a("--no-ext-diff"),
                    a("--no-textconv"),
                    a("--stat"),
                    OsStr::new(&range),
                ],
                "summarise the changes",
            )
            .await?;
        let ignored = self
            .git(
                &[
                    a("ls-files"),
                    a("--others"),
                    a("--ignored"),
                    a("--exclude-standard"),
                    a("--directory"),
                    a("-z"),
                ],
                "list ignored files",
            )
            .await?;
        let mut ignored_paths = ignored.stdout.split(|b| *b == 0).filter(|p| !p.is_empty());
        let listed = ignored_paths
            .by_ref()
            .take(IGNORED_LISTED)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        Ok(WorkspaceReport {
            branch: self.branch.clone(),
            path: self.path.clone(),
            base: self.base.clone(),
            changed,
            diffstat: String::from_utf8_lossy(&stat.stdout).trim_end().to_string(),
            ignored: listed,
            ignored_more: ignored_paths.count() as u64,
            failure: None,
        })
    }
}

/// The paths of `git diff --raw -z` entries whose new mode is a gitlink (160000): a
/// repository inside the worktree, whose content would not be on the branch.
fn gitlinks(raw: &[u8]) -> Vec<String> {
    let mut fields = raw.split(|b| *b == 0);
    let mut found = Vec::new();
    while let Some(head) = fields.next() {
        if head.is_empty() {
            continue;
        }
        // `:old new oldsha newsha STATUS`, then one path (two for a rename or copy).
        let text = String::from_utf8_lossy(head);
        let mut parts = text.trim_start_matches(':').split(' ');
        let new_mode = parts.nth(1).unwrap_or_default();
        let status = parts.nth(2).unwrap_or_default();
        let two_paths = status.starts_with(['R', 'C']);
        let mut path = fields.next();
        if two_paths {
            path = fields.next();
        }
        if new_mode == "160000"
            && let Some(p) = path
        {
            found.push(String::from_utf8_lossy(p).into_owned());
        }
    }
    found
}
