//! The network face (`listen`): ACP over Streamable HTTP and WebSocket on `/acp`, over TLS
//! (rustls) with HTTP/1.1 and HTTP/2, behind bearer tokens. Each authenticated ACP connection
//! becomes the same `server::serve` a Unix-socket connection gets ([`bridge`]); what differs
//! is only who it is (its token's principal) and how its bytes travel.
//!
//! - [`endpoint`]: `/acp`'s requests, each checked first.
//! - [`guard`]: credentials only in `Authorization`, `Origin`, requests per second.
//! - [`live`]: connections counted per token and in all; closed when their token goes.
//! - [`streamable`]: POST/SSE/DELETE connections. [`websocket`]: upgraded ones.
//! - [`tls`]: the certificate, reloaded on SIGHUP.

mod bridge;
mod budgeted;
mod endpoint;
pub(crate) mod guard;
mod live;
mod streamable;
pub(crate) mod tls;
mod websocket;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::network::{ListenUrl, NetworkConfig};
use crate::server::ServerContext;
use guard::{Authenticator, RateLimits};
use live::Live;
use streamable::HttpConns;

/// Response bodies: whole texts, or an SSE stream.
pub(crate) type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FaceError {
    #[error("cannot listen on {url}: {source}; pick a free port, or change `listen`")]
    Bind {
        url: ListenUrl,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(
        "the TCP socket systemd passed is named {name:?}: acpd serves a passed port named \
         `https` (TLS) or `http` (loopback only); set FileDescriptorName=https in its socket unit"
    )]
    UnknownActivated { name: String },
    #[error(
        "the socket systemd passed as `http` listens on {addr}, beyond this machine, without TLS; \
         name it `https` (FileDescriptorName=https) and set tls_cert and tls_key"
    )]
    ActivatedPlain { addr: std::net::SocketAddr },
    #[error("the TCP socket systemd passed cannot be used: {0}")]
    Activation(std::io::Error),
}

/// What every network connection shares.
pub(crate) struct Face {
    ctx: ServerContext,
    auth: Arc<dyn Authenticator>,
    live: Arc<Live>,
    conns: HttpConns,
    rate: Arc<RateLimits>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    certs: Option<Arc<tls::Certificates>>,
}

/// The bound listeners, ready to serve.
pub(crate) struct Listeners {
    bound: Vec<(ListenUrl, TcpListener)>,
    certs: Option<Arc<tls::Certificates>>,
}

impl Listeners {
    /// Binds every `listen` URL (and reads the certificate if one is https), so a bad port or
    /// certificate is a start error, before acpd reports ready.
    pub(crate) async fn bind(
        net: &NetworkConfig,
        activated: Vec<(String, std::net::TcpListener)>,
    ) -> Result<Listeners, FaceError> {
        let mut bound = Vec::new();
        for (name, listener) in activated {
            let addr = listener.local_addr().map_err(FaceError::Activation)?;
            let tls = match name.as_str() {
                "https" => true,
                "http" if addr.ip().is_loopback() => false,
                "http" => return Err(FaceError::ActivatedPlain { addr }),
                _ => return Err(FaceError::UnknownActivated { name }),
            };
            listener
                .set_nonblocking(true)
                .map_err(FaceError::Activation)?;
            let listener = TcpListener::from_std(listener).map_err(FaceError::Activation)?;
            bound.push((ListenUrl { addr, tls }, listener));
        }
        for url in &net.listen {
            // A port systemd passed is served from its socket, not bound again.
            if bound.iter().any(|(b, _)| b.addr == url.addr) {
                continue;
            }
            let listener = TcpListener::bind(url.addr)
                .await
                .map_err(|source| FaceError::Bind { url: *url, source })?;
            let addr = listener.local_addr().unwrap_or(url.addr);
            bound.push((ListenUrl { addr, ..*url }, listener));
        }
        let certs = if bound.iter().any(|(l, _)| l.tls) {
            let (cert, key) = tls::files(net)?;
            Some(tls::Certificates::new(tls::load(&cert, &key)?))
        } else {
            None
        };
        Ok(Listeners { bound, certs })
    }

    /// The URLs served (with the port the kernel chose for port 0).
    pub(crate) fn urls(&self) -> Vec<ListenUrl> {
        self.bound.iter().map(|(u, _)| *u).collect()
    }

    /// Serves every listener until `cancel`; connections are tracked on `tracker`.
    pub(crate) fn serve(
        self,
        ctx: ServerContext,
        auth: Arc<dyn Authenticator>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Arc<Face> {
        let face = Arc::new(Face {
            ctx,
            auth,
            live: Arc::new(Live::default()),
            conns: HttpConns::default(),
            rate: Arc::new(RateLimits::new()),
            tracker,
            cancel,
            certs: self.certs,
        });
        let tcp_slots = Arc::new(Semaphore::new(
            face.net().max_network_connections.saturating_mul(4).max(16),
        ));
        for (url, listener) in self.bound {
            tracing::info!("acpd serving ACP on {url}/acp");
            face.tracker
                .spawn(accept_loop(face.clone(), url, listener, tcp_slots.clone()));
        }
        face.tracker.spawn(watch_tokens(face.clone()));
        face
    }
}

impl Face {
    fn net(&self) -> NetworkConfig {
        self.ctx.registry.config().network.clone()
    }

    /// SIGHUP: a renewed certificate for new connections.
    pub(crate) fn reload(&self) {
        if let Some(certs) = &self.certs {
            certs.reload(&self.net());
        }
    }
}

/// Closes connections whose token was revoked (at once) or expired (within a second).
async fn watch_tokens(face: Arc<Face>) {
    let mut changed = face.auth.changed();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
            () = face.cancel.cancelled() => return,
        }
        let closed = face.live.close_unless(|id| face.auth.is_live(id));
        if closed > 0 {
            tracing::info!(
                closed,
                "closed network connections whose token was revoked or expired"
            );
        }
    }
}

async fn accept_loop(
    face: Arc<Face>,
    url: ListenUrl,
    listener: TcpListener,
    slots: Arc<Semaphore>,
) {
    let mut backoff = Duration::from_millis(10);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = face.cancel.cancelled() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => {
                backoff = Duration::from_millis(10);
                a
            }
            Err(e) => {
                tracing::warn!("accept on {url} failed: {e}; pausing accepts for {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        // Connections not yet authenticated are bounded too: past the slots a new one is
        // closed at once (a flood costs its sender, not acpd's descriptors).
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::metrics::get().network_refused("max_network_connections");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let face = face.clone();
        face.tracker.clone().spawn(async move {
            let _slot = slot;
            serve_tcp(face, url, tcp, peer).await;
        });
    }
}

async fn serve_tcp(
    face: Arc<Face>,
    url: ListenUrl,
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
) {
    let net = face.net();
    if url.tls {
        let Some(certs) = &face.certs else { return };
        let acceptor = tokio_rustls::TlsAcceptor::from(certs.current());
        match tokio::time::timeout(net.http_header_timeout, acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => serve_http(face, TokioIo::new(tls), net).await,
            Ok(Err(e)) => {
                crate::metrics::get().network_refused("tls_handshake");
                tracing::debug!(%peer, "TLS handshake failed: {e}");
            }
            Err(_) => {
                crate::metrics::get().network_refused("http_header_timeout");
                tracing::debug!(%peer, "TLS handshake not finished within http_header_timeout");
            }
        }
    } else {
        serve_http(face, TokioIo::new(tcp), net).await;
    }
}

async fn serve_http<I>(face: Arc<Face>, io: I, net: NetworkConfig)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(net.http_header_timeout)
        .max_buf_size(64 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(net.http_keepalive))
        .keep_alive_timeout(net.http_idle_timeout.min(Duration::from_secs(60)))
        .max_concurrent_streams(64)
        .max_header_list_size(64 * 1024);
    let service_face = face.clone();
    let service = hyper::service::service_fn(move |req| {
        let face = service_face.clone();
        async move { Ok::<_, Infallible>(endpoint::handle(face, req).await) }
    });
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!("http connection ended: {e}");
            }
        }
        () = face.cancel.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
        }
    }
}
