//! The trace directory: used only when it is acpd's uid's own and writable by nobody else,
//! held open, and every trace file created through it without following a link.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// Why a trace directory is not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DirError {
    #[error("cannot create or open it: {0}")]
    Open(std::io::Error),
    #[error("it is not a directory")]
    NotADir,
    #[error(
        "it is owned by uid {owner}, not acpd's uid {own}; another user could read the traces or \
         plant links in it (use a directory of acpd's own, mode 0700)"
    )]
    Owner { owner: u32, own: u32 },
    #[error(
        "it is group- or world-writable (mode {mode:04o}); another user could plant links in it \
         (chmod 0700 it)"
    )]
    Writable { mode: u32 },
    #[error("it is readable by others (mode {0:04o}) and cannot be made 0700: {1}")]
    Private(u32, std::io::Error),
}

/// Opens `dir` (created 0700 when missing) when it is fit to hold traces: a directory owned by
/// acpd's effective uid, writable by no one else; one others can read is made 0700. A link at `dir` is followed only when acpd's
/// uid made it; the directory it reaches is then checked like any other.
pub(crate) fn open_dir(dir: &Path) -> Result<OwnedFd, DirError> {
    let own = nix::unistd::geteuid().as_raw();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(DirError::Open)?;
    let link = std::fs::symlink_metadata(dir).map_err(DirError::Open)?;
    if link.file_type().is_symlink() && link.uid() != own {
        return Err(DirError::Owner {
            owner: link.uid(),
            own,
        });
    }
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOTDIR => DirError::NotADir,
        e => DirError::Open(e.into()),
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| DirError::Open(e.into()))?;
    if st.st_uid != own {
        return Err(DirError::Owner {
            owner: st.st_uid,
            own,
        });
    }
    let mode = st.st_mode as u32 & 0o7777;
    if mode & 0o022 != 0 {
        return Err(DirError::Writable { mode });
    }
    // Readable or searchable by others (an existing 0755 dir): they would list the file names,
    // which are session and run ids. acpd's uid owns it, so it is made 0700 like the state
    // dir, through the descriptor (never a path someone could swap).
    if mode & 0o077 != 0 {
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))
            .map_err(|e| DirError::Private(mode, e.into()))?;
        tracing::info!(trace_dir = %dir.display(), "trace directory was mode {mode:04o}: made 0700");
    }
    Ok(fd)
}

/// A new file `name` in `dir`, 0600, never through a link nor over anything already there.
pub(super) fn create_in(dir: &OwnedFd, name: &str) -> std::io::Result<File> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| match e {
        nix::errno::Errno::EEXIST | nix::errno::Errno::ELOOP => std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{name} already exists (not written through)"),
        ),
        e => e.into(),
    })?;
    Ok(File::from(fd))
}

/// Trace directories already warned about: one warning per directory, not one per run.
static WARNED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

pub(super) fn warn_once(dir: &Path, e: &DirError) {
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if warned.iter().any(|d| d == dir) {
        return;
    }
    if warned.len() < 64 {
        warned.push(dir.to_path_buf());
    }
    tracing::warn!(trace_dir = %dir.display(), "tracing is off: the trace directory is refused: {e}");
}
