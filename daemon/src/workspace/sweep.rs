//! Per-child directories outliving their acpd: worktrees (`<data dir>/worktrees/<id>`) and
//! sandboxed children's private tmps (`<data dir>/tmp/<id>`). Each has a marker beside it,
//! `<id>.owner`, naming the acpd that made it ([`Owner`]: pid, start time, boot id and pid
//! namespace) and, for a worktree, its repository; a starting acpd removes the
//! directories whose owner is gone (a worktree's branch stays, with every turn's work
//! committed on it, and what was left since the last turn committed by the sweep; a worktree
//! whose work git refuses stays, its marker gone). Several acpd processes share the directories: a live owner's are never
//! touched, and a pid reused by another process has another start time, or another boot.

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
    /// The repository's common git directory, when it was pinned at creation (a run from
    /// inside a sandboxed child's tree, whose `repo` that child may write): the sweep reads
    /// it, never a `.git` in `repo` the child could have rewritten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    common: Option<PathBuf>,
}

/// Writes the marker for worktree `id` of `repo`, owned by this process.
pub(super) fn mark(
    dir: &Path,
    id: &str,
    repo: &Path,
    common: Option<&Path>,
) -> Result<PathBuf, WorkspaceError> {
    write_marker(
        dir,
        id,
        &Marker {
            owner: Owner::me(),
            repo: repo.to_path_buf(),
            common: common.map(Path::to_path_buf),
        },
    )
}

/// Writes the marker for a child's private tmp `<dir>/<id>`, owned by this process; made
/// before the directory, so an acpd killed in between leaves it to be swept.
pub(crate) fn mark_tmp(dir: &Path, id: &str) -> Result<PathBuf, WorkspaceError> {
    if !super::safe_id(id) {
        return Err(WorkspaceError::BadRef(id.to_string()));
    }
    write_marker(dir, id, &Owner::me())
}

fn write_marker(dir: &Path, id: &str, marker: &impl Serialize) -> Result<PathBuf, WorkspaceError> {
    let path = dir.join(format!("{id}.owner"));
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
    let text = serde_json::to_vec(marker).map_err(|e| io("write", std::io::Error::other(e)))?;
    file.write_all(&text).map_err(|e| io("write", e))?;
    Ok(path)
}

/// The markers in `dir` (`<id>.owner`, regular files, ids acpd makes): the id, the marker's
/// path, and what it says. Unreadable markers are left alone.
fn markers<M: for<'de> Deserialize<'de>>(dir: &Path) -> Vec<(String, PathBuf, M)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".owner")) else {
            continue;
        };
        // The entry's own type (never followed): a symlink planted as a marker is no marker.
        if !super::safe_id(id) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(text) = std::fs::read(entry.path()) else {
            continue;
        };
        match serde_json::from_slice::<M>(&text) {
            Ok(m) => found.push((id.to_string(), entry.path(), m)),
            Err(_) => tracing::warn!(
                "{}: not an acpd owner marker; left alone",
                entry.path().display()
            ),
        }
    }
    found
}

/// Removes the worktrees in `dir` (default: [`super::worktrees_dir`]) whose acpd is gone,
/// keeping their branches, then the private tmps of children whose acpd is gone (in
/// `<data dir>/tmp`, or `tmp_dir`); returns how many directories went.
pub(crate) async fn sweep(dir: Option<&Path>, tmp_dir: Option<&Path>) -> usize {
    let mut swept = 0;
    if let Some(dir) = dir.map(Path::to_path_buf).or_else(super::worktrees_dir) {
        for (id, marker_path, marker) in markers::<Marker>(&dir) {
            if !marker.owner.gone() {
                continue;
            }
            let path = dir.join(&id);
            // What the child left since its last turn is committed first; a worktree whose
            // work git refuses stays for its user, without a marker, so no sweep takes it.
            // One its repository does not name (an acpd killed during `worktree add`, a
            // repository gone) holds no child's work and is removed as it is.
            if let Some(tree) =
                super::left_behind(&marker.repo, marker.common.as_deref(), &dir, &id).await
            {
                let message = format!("acpd: run {id}, left by a stopped acpd");
                if let Err(e) = tree.commit_all(&message).await {
                    tracing::warn!("{e}");
                    let _ = std::fs::remove_file(marker_path);
                    continue;
                }
            }
            tracing::info!(
                "removing the worktree {} of a stopped acpd (pid {}); its branch acpd/{id} stays",
                path.display(),
                marker.owner.pid
            );
            super::remove(&marker.repo, &path, &format!("acpd/{id}"), true).await;
            let _ = std::fs::remove_file(marker_path);
            swept += 1;
        }
    }
    let tmps = tmp_dir.map(Path::to_path_buf).or_else(tmps_dir);
    if let Some(dir) = tmps {
        for (id, marker_path, owner) in markers::<Owner>(&dir) {
            if !owner.gone() {
                continue;
            }
            let path = dir.join(&id);
            tracing::info!(
                "removing the tmp {} of a child of a stopped acpd (pid {})",
                path.display(),
                owner.pid
            );
            // Not followed: a symlink at the tmp's path is removed itself.
            match std::fs::remove_dir_all(&path) {
                Ok(()) => swept += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!("cannot remove the tmp {}: {e}", path.display());
                    continue;
                }
            }
            let _ = std::fs::remove_file(marker_path);
        }
    }
    // Said once the pass is over, so a reader knows what was left is a live acpd's.
    tracing::info!("startup sweep done: {swept} directories of stopped acpds removed");
    swept
}

/// Where sandboxed children's private tmps live: `<data dir>/tmp`.
pub(crate) fn tmps_dir() -> Option<PathBuf> {
    crate::config::presets::data_dir().map(|d| d.join("tmp"))
}
