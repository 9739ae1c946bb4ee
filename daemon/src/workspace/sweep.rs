//! Worktrees outliving their acpd. Each worktree has a marker beside it, `<id>.owner`, naming
//! the acpd that made it ([`Owner`]: pid, start time and boot) and its repository; a
//! starting acpd removes the worktrees whose owner is gone (their branches stay, with every
//! turn's work committed on them). Several acpd processes share the directory: a live owner's
//! worktrees are never touched, and a pid reused by another process has another start time.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::WorkspaceError;
use crate::supervise::Owner;

#[derive(Serialize, Deserialize)]
struct Marker {
    #[serde(flatten)]
    owner: Owner,
    repo: PathBuf,
}

/// Writes the marker for worktree `id` of `repo`, owned by this process.
pub(super) fn mark(dir: &Path, id: &str, repo: &Path) -> Result<PathBuf, WorkspaceError> {
    let path = dir.join(format!("{id}.owner"));
    let marker = Marker {
        owner: Owner::me(),
        repo: repo.to_path_buf(),
    };
    let io = |what, source| WorkspaceError::Io {
        what,
        path: path.clone(),
        source,
    };
    let mut file =
        crate::private_fs::create_new_private(&path).map_err(|source| WorkspaceError::Dir {
            path: path.clone(),
            source,
        })?;
    let text = serde_json::to_vec(&marker).map_err(|e| io("write", std::io::Error::other(e)))?;
    file.write_all(&text).map_err(|e| io("write", e))?;
    Ok(path)
}

/// Removes the worktrees in `dir` (default: [`super::worktrees_dir`]) whose acpd is gone,
/// keeping their branches; returns how many. Unreadable markers are left alone.
pub(crate) async fn sweep(dir: Option<&Path>) -> usize {
    let Some(dir) = dir.map(Path::to_path_buf).or_else(super::worktrees_dir) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".owner")) else {
            continue;
        };
        if !super::safe_id(id) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(text) = std::fs::read(entry.path()) else {
            continue;
        };
        let Ok(marker) = serde_json::from_slice::<Marker>(&text) else {
            tracing::warn!(
                "{}: not an acpd worktree marker; left alone",
                entry.path().display()
            );
            continue;
        };
        if !marker.owner.gone() {
            continue;
        }
        let path = dir.join(id);
        tracing::info!(
            "removing the worktree {} of a stopped acpd (pid {}); its branch acpd/{id} stays",
            path.display(),
            marker.owner.pid
        );
        super::remove(&marker.repo, &path, &format!("acpd/{id}"), true).await;
        let _ = std::fs::remove_file(entry.path());
        swept += 1;
    }
    swept
}
