//! The socket `acpd stdio`, `acpd run` and `acpd mcp --in-process` open for their own children
//! when a provider offers delegation: the `acpd mcp` an agent starts connects back here, so its
//! runs are this acpd's (nested under the session or run that made them, announced to the
//! editor, counted against the budget above them, reaped with it). `acpd serve` offers its own
//! socket instead.
//!
//! Private like the daemon's: a fresh directory of mode 0700 with the socket 0600 inside,
//! every peer checked to be acpd's own uid, both removed when the connection ends.
//!
//! An acpd that is SIGKILLed removes nothing, so the directory holds a marker, `owner`, naming
//! the acpd that made it ([`Owner`]), and every acpd that may open such a socket first removes
//! the directories whose owner is gone ([`sweep`]).

use std::io::{Read as _, Write as _};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use nix::unistd::Uid;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::server::{self, ServerContext};
use crate::supervise::Owner;

/// How every such directory's name starts (`mkdtemp` fills in six characters).
const PREFIX: &str = "acpd-nest-";
/// The socket inside it.
const SOCKET: &str = "s";
/// The owner marker inside it.
const MARKER: &str = "owner";

/// The listening socket; its directory goes when this drops.
pub(crate) struct NestSocket {
    dir: PathBuf,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl NestSocket {
    /// Listens when some provider offers delegation; `None` (and a warning) when the socket
    /// cannot be made — the offered `acpd mcp` then runs its children itself.
    pub(super) fn open(ctx: &ServerContext) -> Option<NestSocket> {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(|| {
                for base in bases() {
                    let swept = sweep(&base);
                    if swept > 0 {
                        tracing::info!(
                            "delegation socket directories of stopped acpd processes: \
                             {swept} removed from {}",
                            base.display()
                        );
                    }
                }
            });
        }
        let config = ctx.registry.config();
        if !config.providers.values().any(|p| p.offer_delegation) {
            return None;
        }
        match Self::bind(ctx) {
            Ok(socket) => Some(socket),
            Err(e) => {
                tracing::warn!("cannot open a socket for delegating children: {e}");
                None
            }
        }
    }

    /// [`NestSocket::open`] for a process that serves no editor (`acpd run`, `acpd mcp
    /// --in-process`): its children's connections share `registry`, and none of them may
    /// open a bridge session, so no session is stored.
    pub(crate) fn open_for(registry: &crate::registry::Registry) -> Option<NestSocket> {
        let ctx = ServerContext {
            registry: registry.clone(),
            caller_cwd: None,
            daemon: Default::default(),
            shutdown: CancellationToken::new(),
            sessions: crate::server::Sessions::new(crate::store::Store::in_memory(), None),
            principal: None,
            origin: None,
        };
        Self::open(&ctx)
    }

    fn bind(ctx: &ServerContext) -> std::io::Result<NestSocket> {
        let base = runtime_dir().unwrap_or_else(std::env::temp_dir);
        let template = base.join(format!("{PREFIX}XXXXXX"));
        let dir = nix::unistd::mkdtemp(&template).map_err(std::io::Error::from)?;
        // Before the socket: a directory without its marker is never swept, so another acpd
        // cannot take it while it is being made.
        if let Err(e) = mark(&dir) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let path = dir.join(SOCKET);
        let listener = super::socket::bind(&path)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|l| {
                l.set_nonblocking(true)?;
                UnixListener::from_std(l)
            });
        let listener = match listener {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        ctx.registry.offer_socket(&path);
        let socket = NestSocket {
            dir,
            stop: ctx.shutdown.child_token(),
            tasks: TaskTracker::new(),
        };
        socket.tasks.spawn(accept(
            listener,
            ctx.clone(),
            socket.stop.clone(),
            socket.tasks.clone(),
        ));
        Ok(socket)
    }

    /// Stops accepting and ends the connections it serves (each disposes its runs first).
    pub(crate) async fn close(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for NestSocket {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn accept(
    listener: UnixListener,
    ctx: ServerContext,
    stop: CancellationToken,
    tasks: TaskTracker,
) {
    let own = Uid::effective().as_raw();
    // Counted like the daemon's own connections, against the same `max_connections`.
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let trees = std::sync::Arc::new(super::per_child::PerChild::default());
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("accept on the delegation socket failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let cred = stream.peer_cred().ok();
        if cred.map(|c| c.uid()) != Some(own) {
            tracing::warn!(peer = ?cred.map(|c| c.uid()), "refused a connection from another user");
            continue;
        }
        let origin = cred
            .and_then(|c| c.pid())
            .map(|pid| std::sync::Arc::new(crate::registry::Origin::of(pid)));
        let config = ctx.registry.config();
        let tree = origin
            .as_ref()
            .map_or(crate::registry::Tree::Unplaced, |o| o.tree());
        let per_child = config.max_connections_per_child;
        let Ok(tree_slot) = trees.take(tree, per_child) else {
            super::serve::refuse_over_limit(stream, "max_connections_per_child", per_child);
            continue;
        };
        let max = config.max_connections;
        if open.load(std::sync::atomic::Ordering::Acquire) >= max {
            super::serve::refuse_over_limit(stream, "max_connections", max);
            continue;
        }
        let conn_ctx = ServerContext {
            principal: cred.map(|c| server::Principal::Uid(c.uid())),
            origin,
            caller_cwd: None,
            // Ends with the editor's connection too (see `close`), disposing what it started.
            shutdown: stop.clone(),
            ..ctx.clone()
        };
        open.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let (reader, writer) = stream.into_split();
        let open = open.clone();
        tasks.spawn(async move {
            let _tree_slot = tree_slot;
            server::serve(reader, writer, conn_ctx).await;
            open.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        });
    }
}

/// `$XDG_RUNTIME_DIR` when it names a directory: where the socket's directory goes first.
fn runtime_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute() && d.is_dir())
}

/// Every directory an acpd may have made its socket's directory in: the runtime dir, and the
/// tmp dir (where an acpd without `XDG_RUNTIME_DIR`, a service's or a cron job's, makes it).
fn bases() -> Vec<PathBuf> {
    let mut bases: Vec<PathBuf> = runtime_dir().into_iter().collect();
    let tmp = std::env::temp_dir();
    if !bases.contains(&tmp) {
        bases.push(tmp);
    }
    bases
}

/// Writes `dir`'s owner marker: this process.
fn mark(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(MARKER);
    let mut file = crate::private_fs::create_new_private(&path)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let text = serde_json::to_vec(&Owner::me()).map_err(std::io::Error::other)?;
    file.write_all(&text)
}

/// Removes the socket directories in `base` left by an acpd that is gone; returns how many.
/// Only a directory that is certainly a nest socket's of this uid is touched: named
/// `acpd-nest-XXXXXX`, not a symlink (opened with `O_NOFOLLOW`, judged on the descriptor),
/// owned by acpd's uid with mode 0700, holding a regular `owner` file of that uid whose acpd
/// is gone, and nothing but that file and the socket. A live acpd's directory is left alone,
/// and so is one in the middle of being made (no marker yet).
pub(crate) fn sweep(base: &Path) -> usize {
    // The base itself may be reached through a link (a `TMPDIR` the user chose); what is in it
    // is listed and judged through the one descriptor.
    let Ok(base_dir) = open_dir(base, None) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(fd_path(&base_dir)) else {
        return 0;
    };
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| is_nest_name(n)) else {
            continue;
        };
        match sweep_one(&base_dir, name) {
            Ok(true) => {
                tracing::debug!(
                    "removed {}, the delegation socket of a stopped acpd",
                    base.join(name).display()
                );
                swept += 1;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "left {} alone: {e}; remove it by hand if no acpd uses it",
                base.join(name).display()
            ),
        }
    }
    swept
}

/// `acpd-nest-` and the six characters `mkdtemp` chose (letters and digits).
fn is_nest_name(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .is_some_and(|rest| rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// Opens a directory: `path` itself, or the entry `path` of the open directory `at` without
/// following a link there.
fn open_dir(path: &Path, at: Option<&std::fs::File>) -> nix::Result<std::fs::File> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mode = nix::sys::stat::Mode::empty();
    let fd = match at {
        Some(dir) => nix::fcntl::openat(dir.as_fd(), path, flags | OFlag::O_NOFOLLOW, mode)?,
        None => nix::fcntl::open(path, flags, mode)?,
    };
    Ok(std::fs::File::from(fd))
}

/// The path that names an open directory itself, whatever was renamed since it was opened.
fn fd_path(dir: &std::fs::File) -> PathBuf {
    use std::os::fd::AsRawFd as _;
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// Removes `base_dir`/`name` when it is a nest socket's directory whose acpd is gone: `Ok(true)`
/// removed, `Ok(false)` not ours to remove (a live owner, no marker yet, another uid's),
/// `Err` ours and dead but not removable as it is.
fn sweep_one(base_dir: &std::fs::File, name: &str) -> Result<bool, String> {
    use nix::unistd::{UnlinkatFlags, unlinkat};
    let Ok(dir) = open_dir(Path::new(name), Some(base_dir)) else {
        return Ok(false);
    };
    let own = nix::unistd::geteuid().as_raw();
    let meta = dir.metadata().map_err(|e| e.to_string())?;
    if meta.uid() != own || meta.mode() & 0o7777 != 0o700 {
        return Ok(false);
    }
    let Some(owner) = read_marker(&dir) else {
        return Ok(false);
    };
    if !owner.gone() {
        return Ok(false);
    }
    // Listed through the open descriptor, so a directory renamed meanwhile is not the one read.
    let listed = std::fs::read_dir(fd_path(&dir)).map_err(|e| format!("cannot list it: {e}"))?;
    for entry in listed {
        let entry = entry.map_err(|e| format!("cannot list it: {e}"))?;
        let other = entry.file_name();
        if other != SOCKET && other != MARKER {
            return Err(format!("it holds {other:?}, which acpd did not put there"));
        }
    }
    for inside in [SOCKET, MARKER] {
        match unlinkat(dir.as_fd(), inside, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(format!("cannot remove {inside}: {e}")),
        }
    }
    match unlinkat(base_dir.as_fd(), name, UnlinkatFlags::RemoveDir) {
        // Another acpd sweeping at the same time got there first.
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(true),
        Err(e) => Err(format!("cannot remove it: {e}")),
    }
}

/// The owner named by the marker in the open directory `dir`: a regular file of acpd's uid,
/// read without following a link; `None` when there is none or it is not one.
fn read_marker(dir: &std::fs::File) -> Option<Owner> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir.as_fd(), MARKER, flags, nix::sys::stat::Mode::empty()).ok()?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return None;
    }
    let mut text = Vec::new();
    file.take(4096).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A nest directory `name` in `base` holding a socket and a marker of `owner`.
    fn plant(base: &Path, name: &str, owner: &Owner) -> PathBuf {
        let dir = base.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::net::UnixListener::bind(dir.join(SOCKET)).unwrap();
        std::fs::write(dir.join(MARKER), serde_json::to_vec(owner).unwrap()).unwrap();
        dir
    }

    fn dead() -> Owner {
        let me = Owner::me();
        Owner {
            start: me.start + 1,
            ..me
        }
    }

    #[test]
    fn only_a_gone_owner_s_own_private_directory_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        let gone = plant(base, "acpd-nest-aaaaaa", &dead());
        let live = plant(base, "acpd-nest-bbbbbb", &Owner::me());
        // Dead owners, but not acpd's to remove as they are: opened up, holding something
        // else, without a marker, named otherwise, or reached through a link.
        let open = plant(base, "acpd-nest-cccccc", &dead());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let full = plant(base, "acpd-nest-dddddd", &dead());
        std::fs::write(full.join("keep.txt"), "mine").unwrap();
        let unmarked = plant(base, "acpd-nest-eeeeee", &dead());
        std::fs::remove_file(unmarked.join(MARKER)).unwrap();
        let other_name = plant(base, "acpd-nest-ffffff-x", &dead());
        let elsewhere = tempfile::tempdir().unwrap();
        let target = plant(elsewhere.path(), "acpd-nest-tttttt", &dead());
        let link = base.join("acpd-nest-gggggg");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let marker_link = plant(base, "acpd-nest-hhhhhh", &dead());
        std::fs::remove_file(marker_link.join(MARKER)).unwrap();
        std::os::unix::fs::symlink(gone.join(MARKER), marker_link.join(MARKER)).unwrap();

        assert_eq!(sweep(base), 1);
        assert!(!gone.exists());
        for kept in [
            &live,
            &open,
            &full,
            &unmarked,
            &other_name,
            &target,
            &marker_link,
        ] {
            assert!(kept.join(SOCKET).exists(), "{} was touched", kept.display());
        }
        assert!(full.join("keep.txt").exists() && full.join(MARKER).exists());
        assert!(link.is_symlink());
    }

    #[test]
    fn the_directory_is_marked_before_anyone_can_sweep_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("acpd-nest-iiiiii");
        std::fs::create_dir(&dir).unwrap();
        mark(&dir).unwrap();
        let text = std::fs::read(dir.join(MARKER)).unwrap();
        assert_eq!(serde_json::from_slice::<Owner>(&text).unwrap(), Owner::me());
        let mode = std::fs::metadata(dir.join(MARKER))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // A marker already there (planted) is an error, never overwritten.
        assert!(mark(&dir).is_err());
    }
}
