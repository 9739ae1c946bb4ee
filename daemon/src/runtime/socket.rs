//! The daemon's socket: private to its user (directory 0700, socket 0600), a stale socket of
//! its own from a dead daemon replaced, a live server never displaced, nothing else ever
//! deleted, and every connecting peer checked by its kernel-reported credentials.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};

use super::ServeError;

/// `$XDG_RUNTIME_DIR/acpd/acpd.sock`.
pub(crate) fn default_socket_path() -> Result<PathBuf, ServeError> {
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join("acpd/acpd.sock"))
        .ok_or(ServeError::NoRuntimeDir)
}

/// Binds `path`, creating its directory with mode 0700 when missing.
pub(super) fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, ServeError> {
    let io = |source| ServeError::Bind {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
    }
    // lstat: a link at the path is never followed, and only a socket is ever removed.
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
        Ok(meta) => replace_stale(path, &meta)?,
    }
    // The socket is created 0600 from the start (no window where others could connect).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = std::os::unix::net::UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}

/// Removes the socket at `path` when it is a stale one of this uid's: a socket file, owned by
/// acpd's uid, that nobody answers on (`ECONNREFUSED`). Anything else is an error naming it:
/// a link, a file, a directory, another uid's socket, or a socket a live server answers on.
fn replace_stale(path: &Path, meta: &std::fs::Metadata) -> Result<(), ServeError> {
    let kind = meta.file_type();
    if !kind.is_socket() {
        return Err(ServeError::NotASocket {
            path: path.to_path_buf(),
            what: crate::private_fs::kind_name(kind),
        });
    }
    let own = nix::unistd::geteuid().as_raw();
    if meta.uid() != own {
        return Err(ServeError::ForeignSocket {
            path: path.to_path_buf(),
            owner: meta.uid(),
        });
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(ServeError::AlreadyRunning {
            path: path.to_path_buf(),
        }),
        // Gone since the lstat: nothing to remove.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::ECONNREFUSED) => {
            // Nobody listens: left over from a dead daemon.
            tracing::info!("replacing the stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|source| ServeError::Bind {
                path: path.to_path_buf(),
                source,
            })
        }
        // EACCES, EAGAIN (a full backlog: someone is listening) …: not provably stale.
        Err(source) => Err(ServeError::Bind {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Whether a peer may talk to this daemon: the same uid, or (for a system-wide daemon that
/// names one) a member of `allow_group`. `SO_PEERCRED` carries only the primary gid, so
/// supplementary groups come from the group database through `groups_of`.
pub(super) fn admit(
    peer_uid: Uid,
    peer_gid: Gid,
    own_uid: Uid,
    allow_group: Option<Gid>,
    groups_of: impl Fn(Uid, Gid) -> Vec<Gid>,
) -> bool {
    if peer_uid == own_uid {
        return true;
    }
    match allow_group {
        Some(gid) => peer_gid == gid || groups_of(peer_uid, peer_gid).contains(&gid),
        None => false,
    }
}

/// The groups of a uid's user, from the group database.
pub(super) fn groups_of(uid: Uid, gid: Gid) -> Vec<Gid> {
    let Ok(Some(user)) = nix::unistd::User::from_uid(uid) else {
        return vec![gid];
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return vec![gid];
    };
    nix::unistd::getgrouplist(&name, gid).unwrap_or_else(|_| vec![gid])
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Uid = Uid::from_raw(1000);
    const OTHER: Uid = Uid::from_raw(1001);

    #[test]
    fn only_the_same_uid_without_a_group() {
        let none = |_: Uid, _: Gid| vec![];
        assert!(admit(ME, Gid::from_raw(1000), ME, None, none));
        assert!(!admit(OTHER, Gid::from_raw(1001), ME, None, none));
        assert!(
            !admit(Uid::from_raw(0), Gid::from_raw(0), ME, None, none),
            "not even root"
        );
    }

    #[test]
    fn allow_group_admits_primary_and_supplementary_members() {
        let acpd = Gid::from_raw(990);
        assert!(admit(OTHER, acpd, ME, Some(acpd), |_, _| vec![]));
        assert!(admit(
            OTHER,
            Gid::from_raw(1001),
            ME,
            Some(acpd),
            |_, g| vec![g, acpd]
        ));
        assert!(!admit(
            OTHER,
            Gid::from_raw(1001),
            ME,
            Some(acpd),
            |_, g| vec![g]
        ));
    }

    #[test]
    fn bind_makes_a_private_socket_and_refuses_a_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/acpd.sock");
        let first = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert!(matches!(
            bind(&path),
            Err(ServeError::AlreadyRunning { .. })
        ));
        drop(first);
        // The file remains but nobody listens: stale, replaced.
        assert!(path.exists());
        bind(&path).unwrap();
    }

    #[test]
    fn bind_never_removes_what_is_not_a_stale_socket_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"keep me").unwrap();
        let err = bind(&file).unwrap_err();
        assert!(
            err.to_string().contains("is a regular file, not a socket"),
            "{err}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        // A link is refused, whether it leads to a file or to a stale socket.
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        for target in [&file, &stale] {
            let link = dir.path().join("link.sock");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).unwrap();
            let err = bind(&link).unwrap_err();
            assert!(err.to_string().contains("is a symbolic link"), "{err}");
            assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
            assert!(target.exists());
        }
        let err = bind(dir.path()).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        if nix::unistd::geteuid().is_root() {
            // Another uid's stale socket is theirs to remove.
            let theirs = dir.path().join("theirs.sock");
            drop(std::os::unix::net::UnixListener::bind(&theirs).unwrap());
            nix::unistd::chown(&theirs, Some(Uid::from_raw(65534)), None).unwrap();
            let err = bind(&theirs).unwrap_err();
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
            assert!(theirs.exists());
        }
    }
}
