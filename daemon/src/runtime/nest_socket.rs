//! The socket `acpd stdio`, `acpd run` and `acpd mcp --in-process` open for their own children
//! when a provider offers delegation: the `acpd mcp` an agent starts connects back here, so its
//! runs are this acpd's (nested under the session or run that made them, announced to the
//! editor, counted against the budget above them, reaped with it). `acpd serve` offers its own
//! socket instead.
//!
//! Private like the daemon's: a fresh directory of mode 0700 with the socket 0600 inside,
//! every peer checked to be acpd's own uid, both removed when the connection ends.

use std::path::PathBuf;

use nix::unistd::Uid;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::server::{self, ServerContext};

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
            peer_uid: None,
            origin: None,
        };
        Self::open(&ctx)
    }

    fn bind(ctx: &ServerContext) -> std::io::Result<NestSocket> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_absolute() && d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let template = base.join("acpd-nest-XXXXXX");
        let dir = nix::unistd::mkdtemp(&template).map_err(std::io::Error::from)?;
        let path = dir.join("s");
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
            peer_uid: cred.map(|c| c.uid()),
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
