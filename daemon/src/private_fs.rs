//! Directories and files that are acpd's user's alone (the state dir, the session map, child
//! records): made private however they came to exist, never reached through a symlink.
//!
//! A directory is created 0700 (missing parents too). One that already exists is opened with
//! `O_NOFOLLOW|O_DIRECTORY` and checked on the open descriptor (`fstat`): it must be owned by
//! acpd's effective uid, and any other mode (an older acpd made the state dir 0755, systemd's
//! `StateDirectory=` defaults to 0755) is tightened to 0700 with `fchmod`, not refused — the
//! owner is acpd's user, so the directory is already theirs to narrow, and refusing would stop
//! every upgraded install. A symlink there, or a directory another uid owns, is refused: a
//! planted link is how another user would make acpd (possibly root) write where they choose.
//!
//! A file inside such a directory is opened (created 0600) with `O_NOFOLLOW`, and must be a
//! regular file with one link, owned by acpd's uid; any other mode is tightened to 0600.
//! Only the last component of a path is guarded: the parents are the user's own home or
//! `STATE_DIRECTORY`, and whoever can rename those can already act as that user.

use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt,
};
use std::path::{Path, PathBuf};

/// Why a private directory or file cannot be used. Every message names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum PrivateError {
    #[error("{} is a symlink; acpd never opens its state through a link: remove it (or point acpd at the real directory)", path.display())]
    Symlink { path: PathBuf },
    #[error("{} is owned by uid {owner}, not by acpd's uid {me}; acpd keeps its state only in its own files: remove it or fix its owner", path.display())]
    NotOwned { path: PathBuf, owner: u32, me: u32 },
    #[error("{} is not a {expected}; move it aside", path.display())]
    WrongKind {
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{} is a shared directory (mode {mode:o}: world-writable or sticky); acpd's state needs a directory of its own: point STATE_DIRECTORY or XDG_STATE_HOME elsewhere", path.display())]
    Shared { path: PathBuf, mode: u32 },
    #[error("{} has {links} hard links; acpd keeps its state only in a file of its own: move it aside", path.display())]
    Linked { path: PathBuf, links: u64 },
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl PrivateError {
    fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PrivateError + 'a {
        move |source| {
            // ELOOP from O_NOFOLLOW: the last component is a symlink.
            if source.raw_os_error() == Some(nix::libc::ELOOP) {
                PrivateError::Symlink {
                    path: path.to_path_buf(),
                }
            } else {
                PrivateError::Io {
                    what,
                    path: path.to_path_buf(),
                    source,
                }
            }
        }
    }
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Makes `dir` a private directory (see the module doc) and returns it open.
pub(crate) fn private_dir(dir: &Path) -> Result<File, PrivateError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(PrivateError::io("create", parent))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        // Whatever is there (a directory, a symlink, a file) is judged on the open below.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(PrivateError::io("create", dir)(e)),
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| {
            // With O_DIRECTORY a trailing symlink may be ENOTDIR rather than ELOOP.
            let link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            if link {
                PrivateError::Symlink {
                    path: dir.to_path_buf(),
                }
            } else if e.raw_os_error() == Some(nix::libc::ENOTDIR) {
                PrivateError::WrongKind {
                    path: dir.to_path_buf(),
                    expected: "directory",
                }
            } else {
                PrivateError::io("open", dir)(e)
            }
        })?;
    // A shared directory (`/tmp` named as the state dir) is never narrowed: that would take
    // it from everyone else.
    let mode = file
        .metadata()
        .map_err(PrivateError::io("stat", dir))?
        .mode()
        & 0o7777;
    if mode & 0o1002 != 0 {
        return Err(PrivateError::Shared {
            path: dir.to_path_buf(),
            mode,
        });
    }
    own_with_mode(&file, dir, 0o700)?;
    Ok(file)
}

/// Opens (creating 0600) the private file `path`, whose directory must already be private
/// ([`private_dir`]), for reading and writing; see the module doc.
pub(crate) fn private_file(path: &Path) -> Result<File, PrivateError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(PrivateError::io("open", path))?;
    let meta = file.metadata().map_err(PrivateError::io("stat", path))?;
    if !meta.file_type().is_file() {
        return Err(PrivateError::WrongKind {
            path: path.to_path_buf(),
            expected: "regular file",
        });
    }
    if meta.nlink() > 1 {
        return Err(PrivateError::Linked {
            path: path.to_path_buf(),
            links: meta.nlink(),
        });
    }
    own_with_mode(&file, path, 0o600)?;
    Ok(file)
}

/// Creates a new private file (0600) at `path` that must not exist yet (`O_EXCL`: a name
/// planted there, a symlink included, is an error, never followed).
pub(crate) fn create_new_private(path: &Path) -> Result<File, PrivateError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(PrivateError::io("create", path))
}

/// Checks that the open `file` is owned by acpd's uid and sets its mode to `mode` if it is
/// anything else (on the descriptor, so nothing renamed meanwhile is touched).
fn own_with_mode(file: &File, path: &Path, mode: u32) -> Result<(), PrivateError> {
    let meta = file.metadata().map_err(PrivateError::io("stat", path))?;
    let me = euid();
    if meta.uid() != me {
        return Err(PrivateError::NotOwned {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    if meta.mode() & 0o7777 != mode {
        tracing::info!(
            "{}: mode {:o} tightened to {mode:o} (acpd's state is private)",
            path.display(),
            meta.mode() & 0o7777
        );
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(PrivateError::io("chmod", path))?;
    }
    Ok(())
}

/// Whether `path` exists as anything but a private file acpd may open: a symlink or another
/// uid's entry there is refused, nothing is created (for companion files another library
/// opens by name, such as SQLite's `-wal` and `-shm`).
pub(crate) fn check_absent_or_private(path: &Path) -> Result<(), PrivateError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(PrivateError::io("stat", path)(e)),
        Ok(meta) if meta.file_type().is_symlink() => Err(PrivateError::Symlink {
            path: path.to_path_buf(),
        }),
        Ok(_) => private_file(path).map(drop),
    }
}

/// Whether [`open_regular`] follows a link at the path's last component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Links {
    /// A path the user named (a config file, a `file://` URL, a trace): only the file it
    /// reaches is read.
    Follow,
    /// One of acpd's own files: a link there was planted, and is refused (`ELOOP`).
    Refuse,
}

/// Why [`open_regular`] gave no file. Callers name the path in their own error.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The open, or the `fstat` of what was opened, failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// Something other than a regular file is there: what it is, in words ("a FIFO").
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
}

impl From<OpenError> for io::Error {
    fn from(e: OpenError) -> io::Error {
        match e {
            OpenError::Io(e) => e,
            e @ OpenError::NotRegular(_) => {
                io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
            }
        }
    }
}

/// What a file of type `kind` is, in words, for an error that says why it was refused.
pub(crate) fn kind_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if kind.is_file() {
        "a regular file"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading when it is a regular file. A FIFO nobody writes would block the
/// read forever and a device never end, so anything else is refused, saying what it is:
/// `O_NONBLOCK` keeps a FIFO from blocking the open itself (it means nothing for the regular
/// file then read), and the kind is checked with `fstat` on what was opened, never by name.
pub(crate) fn open_regular(path: &Path, links: Links) -> Result<File, OpenError> {
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;
    if links == Links::Refuse {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        Err(OpenError::NotRegular(kind_name(kind)))
    }
}

/// `path` with its longest existing ancestor resolved (symlinks, `..`) and the rest appended:
/// where a file made there later would land. A `..` in the part that does not exist is kept
/// as written: callers refuse paths with one.
pub(crate) fn resolved_as_far_as_it_exists(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = std::fs::canonicalize(at) {
            return rest.iter().rev().fold(real, |p, name| p.join(name));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_new_dir_and_file_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/state");
        private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("a")), 0o700);
        let file = dir.join("f");
        private_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn an_existing_open_dir_and_file_are_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::set_permissions(&file, Permissions::from_mode(0o644)).unwrap();
        private_dir(&dir).unwrap();
        private_file(&file).unwrap();
        assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600));
        assert_eq!(std::fs::read(&file).unwrap(), b"x", "never truncated");
    }

    #[test]
    fn symlinks_are_refused_and_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let target_dir = tmp.path().join("elsewhere");
        std::fs::create_dir(&target_dir).unwrap();
        std::fs::set_permissions(&target_dir, Permissions::from_mode(0o755)).unwrap();
        let link = tmp.path().join("state");
        std::os::unix::fs::symlink(&target_dir, &link).unwrap();
        let e = private_dir(&link).unwrap_err();
        assert!(matches!(e, PrivateError::Symlink { .. }), "{e}");
        assert!(e.to_string().contains(&link.display().to_string()), "{e}");
        assert_eq!(
            mode(&target_dir),
            0o755,
            "the link's target was not touched"
        );

        let dir = tmp.path().join("real");
        private_dir(&dir).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::set_permissions(&victim, Permissions::from_mode(0o644)).unwrap();
        let planted = dir.join("f");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let e = private_file(&planted).unwrap_err();
        assert!(matches!(e, PrivateError::Symlink { .. }), "{e}");
        assert!(matches!(
            check_absent_or_private(&planted),
            Err(PrivateError::Symlink { .. })
        ));
        assert!(matches!(
            create_new_private(&planted),
            Err(PrivateError::Io { .. })
        ));
        // A dangling link is refused too, and nothing is created at its target.
        let dangling = dir.join("g");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        assert!(matches!(
            private_file(&dangling),
            Err(PrivateError::Symlink { .. })
        ));
        assert!(!tmp.path().join("nowhere").exists());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(mode(&victim), 0o644);
    }

    #[test]
    fn a_shared_dir_is_refused_not_narrowed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shared");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, Permissions::from_mode(0o1777)).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert!(
            matches!(e, PrivateError::Shared { mode: 0o1777, .. }),
            "{e}"
        );
        assert_eq!(mode(&dir), 0o1777);
    }

    #[test]
    fn hard_links_and_non_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        private_dir(&dir).unwrap();
        let other = tmp.path().join("other");
        std::fs::write(&other, b"x").unwrap();
        std::fs::hard_link(&other, dir.join("f")).unwrap();
        assert!(matches!(
            private_file(&dir.join("f")),
            Err(PrivateError::Linked { links: 2, .. })
        ));
        std::fs::create_dir(dir.join("d")).unwrap();
        assert!(private_file(&dir.join("d")).is_err());
        let file = tmp.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            private_dir(&file),
            Err(PrivateError::WrongKind { .. })
        ));
    }

    #[test]
    fn open_regular_refuses_what_would_block_or_never_end_and_planted_links() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(open_regular(&file, Links::Refuse).is_ok());
        assert!(open_regular(&link, Links::Follow).is_ok());
        let e = open_regular(&link, Links::Refuse).unwrap_err();
        assert_eq!(io::Error::from(e).raw_os_error(), Some(nix::libc::ELOOP));
        for (path, what) in [
            (fifo.as_path(), "it is a FIFO, not a regular file"),
            (Path::new("/dev/null"), "it is a device, not a regular file"),
            (tmp.path(), "it is a directory, not a regular file"),
        ] {
            let e = open_regular(path, Links::Follow).unwrap_err();
            assert_eq!(e.to_string(), what);
            assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidInput);
        }
    }

    /// Another uid's directory is refused (root only: it needs a chown).
    #[test]
    fn another_users_dir_is_refused() {
        if euid() != 0 {
            eprintln!("skipped: needs root to chown a directory to another uid");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert!(
            matches!(e, PrivateError::NotOwned { owner: 65534, .. }),
            "{e}"
        );
    }
}
