//! `acpd serve`: the long-lived daemon. One ACP connection per accepted peer (each with all of
//! `acpd stdio`), sd_notify, SIGHUP reload, and a graceful SIGTERM that cancels every run and
//! runs every teardown ladder before exiting; a second signal SIGKILLs the children at once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::unistd::Uid;
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{notify, socket};
use crate::config::{Config, ConfigError};
use crate::registry::{DepthContext, Registry};
use crate::server::{self, DaemonInfo, ServerContext};
use crate::supervise;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("XDG_RUNTIME_DIR is not set; pass --socket PATH")]
    NoRuntimeDir,
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another acpd is already serving on {}; stop it first (acpd status --socket {0})", path.display())]
    AlreadyRunning { path: PathBuf },
    #[error("the socket systemd passed cannot be used: {0}")]
    Activation(std::io::Error),
    #[error("cannot set up signal handling: {0}")]
    Signals(std::io::Error),
}

/// How `acpd serve` was started.
pub struct ServeOptions {
    /// The listener systemd passed (socket activation), taken in `main` before the runtime.
    pub activated: Option<std::os::unix::net::UnixListener>,
    /// Where to bind when not activated.
    pub socket: Option<PathBuf>,
    /// Reads the config again (SIGHUP), from the same place as at start.
    pub load: Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>,
}

/// Margin on top of the largest cancel + EOF + TERM grace before shutdown gives up waiting.
const SHUTDOWN_MARGIN: Duration = Duration::from_secs(2);

pub async fn serve(opts: ServeOptions, config: Config) -> Result<(), ServeError> {
    supervise::init();
    supervise::keep_records();
    let (std_listener, bound_path) = match opts.activated {
        Some(l) => (l, None),
        None => {
            let path = match opts.socket {
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
    let mut hup = signal(SignalKind::hangup()).map_err(ServeError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Signals)?;

    let registry = Registry::new(config, DepthContext::from_env());
    let shutdown = CancellationToken::new();
    let ctx = ServerContext {
        registry: registry.clone(),
        caller_cwd: None,
        daemon: Arc::new(DaemonInfo::default()),
        shutdown: shutdown.clone(),
    };
    let tracker = TaskTracker::new();
    let own_uid = Uid::effective();
    notify::ready();
    // Pinged from the supervisor loop itself, so a wedged loop stops the pings.
    let mut watchdog = notify::watchdog_period().map(tokio::time::interval);
    match &bound_path {
        Some(path) => tracing::info!(socket = %path.display(), "acpd serving"),
        None => tracing::info!("acpd serving on the socket systemd passed"),
    }
    let mut status_tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let allow = allow_gid(&registry.config());
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
                    continue;
                }
                let (reader, writer) = stream.into_split();
                tracker.spawn(server::serve(reader, writer, ctx.clone()));
                report_status(&ctx);
            }
            _ = status_tick.tick() => report_status(&ctx),
            _ = async { watchdog.as_mut()?.tick().await; Some(()) }, if watchdog.is_some() => notify::watchdog(),
            _ = hup.recv() => reload(&registry, &opts.load),
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }

    notify::stopping();
    drop(listener);
    if let Some(path) = &bound_path {
        let _ = std::fs::remove_file(path);
    }
    let bound = registry
        .config()
        .providers
        .values()
        .map(|p| p.cancel_grace + p.eof_grace + p.term_grace)
        .max()
        .unwrap_or_default()
        + SHUTDOWN_MARGIN;
    tracing::info!(?bound, "shutting down: cancelling every run");
    shutdown.cancel();
    tracker.close();
    tokio::select! {
        _ = tracker.wait() => {}
        _ = term.recv() => emergency(&tracker).await,
        _ = int.recv() => emergency(&tracker).await,
        _ = tokio::time::sleep(bound) => {
            tracing::warn!("shutdown took longer than {bound:?}; killing what is left");
            emergency(&tracker).await;
        }
    }
    supervise::forget_records();
    Ok(())
}

/// The second signal: no more grace, SIGKILL every child group and wait for the reaping.
async fn emergency(tracker: &TaskTracker) {
    tracing::warn!("killing every child now");
    supervise::kill_all();
    let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
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

/// New runs use the new providers; running ones finish on the old. A bad file is rejected and
/// the old config stays. READY=1 follows either way (systemd waits for it).
fn reload(registry: &Registry, load: &(dyn Fn() -> Result<Config, ConfigError> + Send + Sync)) {
    notify::reloading();
    match load() {
        Ok(config) => {
            let source = config.source.clone();
            registry.reload(config);
            tracing::info!(source = ?source, "config reloaded");
        }
        Err(e) => tracing::error!("config reload rejected, keeping the previous config: {e}"),
    }
    notify::ready();
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
