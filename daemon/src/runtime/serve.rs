//! `acpd serve`: the long-lived daemon. One ACP connection per accepted peer (each with all of
//! `acpd stdio`), sd_notify, SIGHUP reload, and a graceful SIGTERM that cancels every run and
//! runs every teardown ladder before exiting; a second signal SIGKILLs the children at once.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::unistd::Uid;
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::shutdown::{self, Shutdown};
use super::{notify, socket};
use crate::config::{Config, ConfigError};
use crate::registry::{DepthContext, Registry};
use crate::server::{self, DaemonInfo, ServerContext, Sessions};
use crate::supervise;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("XDG_RUNTIME_DIR is not set; pass --socket PATH")]
    NoRuntimeDir,
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another acpd is already serving on {}; stop it first (acpd status --socket {0})", path.display())]
    AlreadyRunning { path: PathBuf },
    #[error(
        "cannot listen on {}: it exists and is {what}, not a socket; acpd replaces only a stale \
         socket of its own (remove it yourself or pick another --socket)",
        path.display()
    )]
    NotASocket { path: PathBuf, what: &'static str },
    #[error(
        "cannot listen on {}: it is a socket owned by uid {owner}, not this acpd's; acpd replaces \
         only a stale socket of its own (pick another --socket)",
        path.display()
    )]
    ForeignSocket { path: PathBuf, owner: u32 },
    #[error("the socket systemd passed cannot be used: {0}")]
    Activation(std::io::Error),
    #[error("cannot set up signal handling: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Face(#[from] super::http::FaceError),
    #[error(
        "cannot serve metrics on {addr} (metrics_listen): {source}; pick a free port, or remove \
         metrics_listen from the config"
    )]
    MetricsBind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// How `acpd serve` was started.
pub(crate) struct ServeOptions {
    /// The listener systemd passed (socket activation), taken in `main` before the runtime.
    pub activated: Option<std::os::unix::net::UnixListener>,
    /// The TCP listeners systemd passed (acpd-https.socket), by their `FileDescriptorName=`.
    pub activated_tcp: Vec<(String, std::net::TcpListener)>,
    /// Where to bind when not activated.
    pub socket: Option<PathBuf>,
    /// Reads the config again (SIGHUP), from the same place as at start.
    pub load: Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>,
}

/// How long a refused connection is read (and its input dropped) before it is closed.
const REFUSED_LINGER: Duration = Duration::from_secs(2);
/// Refused connections lingering at once, at most: past it a refused connection gets its
/// LIMIT line and is closed at once (a client that writes first may see EPIPE, and can still
/// read the line), so a flood of them cannot hold acpd's descriptors. Far above a burst an
/// honest client makes.
const MAX_LINGERING: usize = 256;
/// Refused connections lingering now.
static LINGERING: AtomicUsize = AtomicUsize::new(0);

/// The first pause after a failed accept; it doubles up to [`ACCEPT_BACKOFF_MAX`] while accepts
/// keep failing (EMFILE: the backlog stays readable, so retrying at once would spin a core).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves until `shutdown` is requested, then stops accepting, cancels every run, runs every
/// teardown ladder and returns within the largest cancel + EOF + TERM grace plus a margin; a
/// second request SIGKILLs the children at once.
pub(crate) async fn serve(
    opts: ServeOptions,
    config: Config,
    shutdown: Shutdown,
) -> Result<(), ServeError> {
    supervise::init();
    // Sweep what dead acpd processes left before listening; a failure to listen (another
    // daemon serving) takes this process's record with it.
    supervise::keep_records();
    let (listener, bound_path, mut hup) = match listen(opts.activated, opts.socket) {
        Ok(l) => l,
        Err(e) => {
            supervise::forget_records();
            return Err(e);
        }
    };

    let bound = async {
        let metrics = bind_metrics(config.metrics_listen).await?;
        Ok((metrics, bind_face(&config, opts.activated_tcp).await?))
    };
    let (metrics, face_listeners) = match bound.await {
        Ok(b) => b,
        Err(e) => {
            // The socket was bound by this process a moment ago: nobody else's to keep.
            drop(listener);
            if let Some(path) = &bound_path {
                let _ = std::fs::remove_file(path);
            }
            supervise::forget_records();
            return Err(e);
        }
    };
    let detach = config.detach_timeout;
    let registry = Registry::new(config, DepthContext::from_env());
    let offered = bound_path.clone().or_else(|| {
        let addr = listener.local_addr().ok()?;
        addr.as_pathname().map(std::path::Path::to_path_buf)
    });
    if let Some(path) = &offered {
        registry.offer_socket(path);
    }
    let cancel_all = CancellationToken::new();
    let sessions = Sessions::new(crate::server::open_store(), detach);
    let tokens = crate::store::tokens::TokenBook::new(sessions.store.clone());
    if let Err(e) = tokens.reload().await {
        tracing::warn!(
            "{e}; no network token is accepted until `acpd token create` or `acpd token revoke` reloads them"
        );
    }
    let face: Arc<std::sync::OnceLock<Arc<super::http::Face>>> = Arc::default();
    let reload = reloader(registry.clone(), opts.load, face.clone());
    let ctx = ServerContext {
        registry: registry.clone(),
        caller_cwd: None,
        daemon: Arc::new(DaemonInfo {
            reload: Some(reload.clone()),
            tokens: Some(tokens.clone()),
            ..DaemonInfo::default()
        }),
        shutdown: cancel_all.clone(),
        sessions: sessions.clone(),
        principal: None,
        origin: None,
    };
    registry.keep_warm(cancel_all.clone());
    if let Some(listener) = metrics {
        let scraped = ctx.clone();
        let render: crate::metrics::http::Render = Arc::new(move || server::metrics_text(&scraped));
        tokio::spawn(crate::metrics::http::serve(
            listener,
            render,
            cancel_all.clone(),
        ));
    }
    let tracker = TaskTracker::new();
    if let Some(listeners) = face_listeners {
        let urls: Vec<String> = listeners
            .urls()
            .iter()
            .map(|u| format!("{u}/acp"))
            .collect();
        let _ = ctx.daemon.listening.set(urls);
        let auth: Arc<dyn super::http::guard::Authenticator> = Arc::new(tokens.clone());
        let _ = face.set(listeners.serve(ctx.clone(), auth, tracker.clone(), cancel_all.clone()));
    }
    let own_uid = Uid::effective();
    // Connections being served, counted here (not in the connection task) so a burst of
    // accepts cannot overshoot max_connections before the tasks start.
    let open = Arc::new(AtomicUsize::new(0));
    // Connections from inside each child's tree, under `max_connections_per_child`.
    let trees = Arc::new(super::per_child::PerChild::default());
    notify::ready();
    // Pinged from the supervisor loop itself, so a wedged loop stops the pings.
    let mut watchdog = notify::watchdog_period().map(tokio::time::interval);
    match &bound_path {
        Some(path) => tracing::info!(socket = %path.display(),
            "acpd serving on {}: editors run `acpd connect`", path.display()),
        None => {
            tracing::info!("acpd serving on the socket systemd passed: editors run `acpd connect`")
        }
    }
    let mut status_tick = tokio::time::interval(Duration::from_secs(5));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut paused_until: Option<Instant> = None;
    loop {
        let resume = paused_until.unwrap_or_else(Instant::now);
        tokio::select! {
            accepted = listener.accept(), if paused_until.is_none() => {
                let stream = match accepted {
                    Ok((stream, _)) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        stream
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}; pausing accepts for {backoff:?}");
                        paused_until = Some(Instant::now() + backoff);
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                };
                let config = registry.config();
                if !admitted(&stream, own_uid, allow_gid(&config)) {
                    continue;
                }
                let cred = stream.peer_cred().ok();
                let principal = cred.map(|c| server::Principal::Uid(c.uid()));
                let origin = cred
                    .and_then(|c| c.pid())
                    .map(|pid| Arc::new(crate::registry::Origin::of(pid)));
                // Checked first: a child at its own limit is told so, whatever the total.
                let tree = origin.as_ref().map_or(crate::registry::Tree::Unplaced, |o| o.tree());
                let per_child = config.max_connections_per_child;
                let Ok(tree_slot) = trees.take(tree, per_child) else {
                    tracing::warn!(?tree, "refused a child's connection over max_connections_per_child");
                    refuse_over_limit(stream, "max_connections_per_child", per_child);
                    continue;
                };
                if open.load(Ordering::Acquire) >= config.max_connections {
                    refuse_over_limit(stream, "max_connections", config.max_connections);
                    continue;
                }
                let slot = Slot::take(&open);
                let (reader, writer) = stream.into_split();
                let conn_ctx = ServerContext { principal, origin, ..ctx.clone() };
                tracker.spawn(async move {
                    let _slots = (slot, tree_slot);
                    server::serve(reader, writer, conn_ctx).await;
                });
                report_status(&ctx);
            }
            () = tokio::time::sleep_until(resume), if paused_until.is_some() => paused_until = None,
            _ = status_tick.tick() => report_status(&ctx),
            _ = async { watchdog.as_mut()?.tick().await; Some(()) }, if watchdog.is_some() => notify::watchdog(),
            // Off the loop: a file that blocks the read (a FIFO, a hung mount) must not stop
            // accepts or the watchdog pings. Logged inside; SIGHUP has nobody to answer.
            // Coalesced: a flood of SIGHUPs is one read running and one pending.
            _ = hup.recv() => drop(reload.request()),
            () = shutdown.requested() => break,
        }
    }

    notify::stopping();
    drop(listener);
    if let Some(path) = &bound_path {
        let _ = std::fs::remove_file(path);
    }
    let bound = shutdown::bound(&registry.config());
    tracing::info!(?bound, "shutting down: cancelling every run");
    cancel_all.cancel();
    tracker.close();
    // Detached sessions belong to no connection: they end with acpd.
    let all = async {
        futures::join!(tracker.wait(), sessions.shut_all(), registry.drain_spares());
    };
    shutdown::drain(all, &shutdown, bound).await;
    supervise::forget_records();
    Ok(())
}

/// The listener (systemd's, else bound at `socket`), the path to remove at exit if acpd bound
/// it, and the SIGHUP (reload) stream.
fn listen(
    activated: Option<std::os::unix::net::UnixListener>,
    socket: Option<PathBuf>,
) -> Result<(UnixListener, Option<PathBuf>, tokio::signal::unix::Signal), ServeError> {
    // Before the socket answers: a SIGHUP sent as soon as a client can connect (a reload
    // right after a start) would otherwise find its default action, and end the daemon.
    let hup = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    let (std_listener, bound_path) = match activated {
        Some(l) => (l, None),
        None => {
            let path = match socket {
                Some(p) => p,
                None => socket::default_socket_path()?,
            };
            (socket::bind(&path)?, Some(path))
        }
    };
    std_listener
        .set_nonblocking(true)
        .map_err(ServeError::Activation)?;
    let listener = UnixListener::from_std(std_listener).map_err(ServeError::Activation)?;
    Ok((listener, bound_path, hup))
}

/// The network face's listeners (`listen`), when configured: bound before acpd reports ready,
/// so a taken port or an unreadable certificate is a start error.
async fn bind_face(
    config: &Config,
    activated: Vec<(String, std::net::TcpListener)>,
) -> Result<Option<super::http::Listeners>, ServeError> {
    if config.network.listen.is_empty() && activated.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        super::http::Listeners::bind(&config.network, activated).await?,
    ))
}

/// The `metrics_listen` listener, when configured; its address (the port the kernel chose,
/// for port 0) logged.
async fn bind_metrics(
    addr: Option<std::net::SocketAddr>,
) -> Result<Option<tokio::net::TcpListener>, ServeError> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::MetricsBind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!("metrics on http://{bound}/metrics");
    Ok(Some(listener))
}

/// A peer of acpd's own user, or of `allow_group`; others are logged and dropped.
fn admitted(stream: &UnixStream, own_uid: Uid, allow: Option<nix::unistd::Gid>) -> bool {
    let admitted = stream.peer_cred().is_ok_and(|c| {
        socket::admit(
            Uid::from_raw(c.uid()),
            nix::unistd::Gid::from_raw(c.gid()),
            own_uid,
            allow,
            socket::groups_of,
        )
    });
    if !admitted {
        let who = stream.peer_cred().map(|c| (c.uid(), c.pid())).ok();
        tracing::warn!(peer = ?who, "refused a connection from another user");
    }
    admitted
}

/// One connection's place under `max_connections`, given back when the connection ends.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(open: &Arc<AtomicUsize>) -> Slot {
        open.fetch_add(1, Ordering::AcqRel);
        Slot(open.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection over `limit` (`max_connections`, `max_connections_per_child`) gets one LIMIT
/// error line and is closed. The write
/// never waits: a fresh socket's buffer holds one line, and a peer that cannot take it loses it.
/// What the peer already sent is read and dropped before the close (for a short while at most):
/// a Unix socket closed with unread input resets the connection, and the peer would lose the
/// line.
pub(super) fn refuse_over_limit(stream: UnixStream, limit: &'static str, max: usize) {
    tracing::warn!(limit, max, "refused a connection over {limit}");
    crate::metrics::get().limit_hit(crate::metrics::Limit::of_connection(limit));
    let error = acpd_protocol::envelope::RpcError::limit(limit, max as u64);
    let mut line = acpd_protocol::envelope::encode_error(None, &error);
    line.push(b'\n');
    let _ = stream.try_write(&line);
    let room = LINGERING.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < MAX_LINGERING).then_some(n + 1)
    });
    if room.is_err() {
        return;
    }
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let drain = async {
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(REFUSED_LINGER, drain).await;
        LINGERING.fetch_sub(1, Ordering::AcqRel);
    });
}

fn allow_gid(config: &Config) -> Option<nix::unistd::Gid> {
    let name = config.allow_group.as_ref()?;
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Some(g.gid),
        _ => {
            tracing::warn!("allow_group {name:?} names no group; only acpd's own user may connect");
            None
        }
    }
}

/// The daemon's reload (SIGHUP and `_acpd/reload`). New runs use the new providers; running
/// ones finish on the old. A bad file is rejected and the old config stays. READY=1 follows
/// either way (systemd waits for it). Reloads run one at a time (the [`server::Reload`]
/// coalesces them), so an older read of the file can never replace a newer one.
fn reloader(
    registry: Registry,
    load: Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>,
    face: Arc<std::sync::OnceLock<Arc<super::http::Face>>>,
) -> server::Reload {
    crate::server::Reloader::new(Box::new(move || {
        notify::reloading();
        let outcome = match load() {
            Ok(config) => {
                let source = config.source.clone();
                if config.detach_timeout != registry.config().detach_timeout {
                    tracing::warn!("detach_timeout changed: it takes effect at the next restart");
                }
                if config.metrics_listen != registry.config().metrics_listen {
                    tracing::warn!("metrics_listen changed: it takes effect at the next restart");
                }
                if config.network.listen != registry.config().network.listen {
                    tracing::warn!("listen changed: it takes effect at the next restart");
                }
                registry.reload(config);
                if let Some(face) = face.get() {
                    face.reload();
                }
                tracing::info!(source = ?source, "config reloaded");
                Ok(registry.config())
            }
            Err(e) => {
                tracing::error!("config reload rejected, keeping the previous config: {e}");
                Err(e)
            }
        };
        notify::ready();
        outcome
    }))
}

fn report_status(ctx: &ServerContext) {
    let connections = ctx
        .daemon
        .connections
        .load(std::sync::atomic::Ordering::Relaxed);
    let runs = ctx.registry.runs().len();
    let children = ctx.registry.live_children();
    notify::status(&format!(
        "{connections} connections, {runs} runs, {children} live children"
    ));
}
