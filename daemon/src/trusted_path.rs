//! Whether only acpd's user (or root) can change what a path leads to, as OpenSSH's
//! `StrictModes` asks of `authorized_keys`: the file and every directory above it must be
//! owned by the user or root and writable by nobody else. A file acpd executes from (its
//! config, an env file that sets `PATH`) in a directory another user can write is that
//! user's to swap: root's next `acpd run` would run their command.
//!
//! A sticky directory (`/tmp`, mode 1777) owned by root or the user is accepted although
//! others may write it: the sticky bit lets no one but an entry's owner (or the directory's)
//! rename or remove it, and the entry below it must itself be the user's or root's.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// Why a path is not the user's alone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Untrusted {
    #[error(
        "{} is owned by uid {owner}, neither acpd's user (uid {me}) nor root, so that user can replace what acpd reads beneath it: `chown {me} {}` it, or use a path in a directory of yours",
        path.display(), path.display()
    )]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error(
        "{} is writable by {who} (mode {mode:04o}), so they can replace what acpd reads beneath it: `chmod go-w {}`, or use a path in a directory of yours",
        path.display(), path.display()
    )]
    Writable {
        path: PathBuf,
        mode: u32,
        who: &'static str,
    },
    #[error("cannot check who may change {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Checks `path` (which must exist) and every directory above it, both as written (a
/// symlink's own directory) and as resolved (where it leads).
pub(crate) fn check(path: &Path) -> Result<(), Untrusted> {
    let me = nix::unistd::geteuid().as_raw();
    let io = |source| Untrusted::Io {
        path: path.to_path_buf(),
        source,
    };
    let written = std::path::absolute(path).map_err(io)?;
    chain(&written, me)?;
    let resolved = std::fs::canonicalize(path).map_err(io)?;
    if resolved != written {
        chain(&resolved, me)?;
    }
    Ok(())
}

/// `path` and each of its ancestors, each by what it leads to.
fn chain(path: &Path, me: u32) -> Result<(), Untrusted> {
    for p in path.ancestors() {
        let meta = std::fs::metadata(p).map_err(|source| Untrusted::Io {
            path: p.to_path_buf(),
            source,
        })?;
        let owner = meta.uid();
        if owner != me && owner != 0 {
            return Err(Untrusted::Owner {
                path: p.to_path_buf(),
                owner,
                me,
            });
        }
        let mode = meta.mode() & 0o7777;
        let sticky_dir = meta.is_dir() && mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky_dir {
            return Err(Untrusted::Writable {
                path: p.to_path_buf(),
                mode,
                who: if mode & 0o002 != 0 {
                    "every user"
                } else {
                    "its group"
                },
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_file_in_a_private_dir_under_tmp_passes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "").unwrap();
        chmod(dir.path(), 0o700);
        check(&file).unwrap();
    }

    #[test]
    fn a_group_or_world_writable_dir_above_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("acpd");
        std::fs::create_dir(&sub).unwrap();
        let file = sub.join("config.toml");
        std::fs::write(&file, "").unwrap();
        chmod(dir.path(), 0o770);
        let e = check(&file).unwrap_err().to_string();
        assert!(e.contains("writable by its group"), "{e}");
        assert!(
            e.contains(&format!("chmod go-w {}", dir.path().display())),
            "{e}"
        );
        chmod(dir.path(), 0o777);
        let e = check(&file).unwrap_err().to_string();
        assert!(e.contains("every user"), "{e}");
        // Sticky and the user's: the entries below it are safe from others.
        chmod(dir.path(), 0o1777);
        check(&file).unwrap();
    }

    #[test]
    fn a_writable_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "").unwrap();
        chmod(&file, 0o666);
        let e = check(&file).unwrap_err().to_string();
        assert!(e.contains("config.toml is writable by every user"), "{e}");
    }

    #[test]
    fn a_symlink_is_checked_where_it_leads() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::write(shared.join("config.toml"), "").unwrap();
        let mine = dir.path().join("mine");
        std::fs::create_dir(&mine).unwrap();
        std::os::unix::fs::symlink(shared.join("config.toml"), mine.join("config.toml")).unwrap();
        chmod(&shared, 0o777);
        let e = check(&mine.join("config.toml")).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} is writable", shared.display())),
            "{e}"
        );
    }
}
