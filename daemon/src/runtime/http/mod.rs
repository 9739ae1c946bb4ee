//! The network face (`listen`): ACP over Streamable HTTP and WebSocket on `/acp`, over TLS
//! (rustls) with HTTP/1.1 and HTTP/2, behind bearer tokens. Each authenticated ACP connection
//! becomes the same `server::serve` a Unix-socket connection gets ([`bridge`]); what differs
//! is only who it is (its token's principal) and how its bytes travel.
//!
//! - [`guard`]: credentials only in `Authorization`, `Origin`, requests per second.
//! - [`live`]: connections counted per token and in all; closed when their token goes.
//! - [`streamable`]: POST/SSE/DELETE connections. [`websocket`]: upgraded ones.
//! - [`tls`]: the certificate, reloaded on SIGHUP.

mod bridge;
mod budgeted;
pub(crate) mod guard;
mod live;
mod streamable;
pub(crate) mod tls;
mod websocket;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::network::{ListenUrl, NetworkConfig};
use crate::server::ServerContext;
use guard::{Authenticator, Grant, RateLimits, Refused};
use live::Live;
use streamable::{HttpConn, HttpConns};

/// Response bodies: whole texts, or an SSE stream.
pub(crate) type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

const HEADER_CONNECTION_ID: &str = "acp-connection-id";
const HEADER_SESSION_ID: &str = "acp-session-id";
/// How long an `initialize` POST waits for acpd's answer (it may start the default agent).
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(120);

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
            listener.set_nonblocking(true).map_err(FaceError::Activation)?;
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
        async move { Ok::<_, Infallible>(handle(face, req).await) }
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

fn text(status: u16, message: impl Into<String>) -> Response<Body> {
    let mut response =
        Response::new(http_body_util::Full::new(Bytes::from(message.into() + "\n")).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn refused(r: Refused) -> Response<Body> {
    crate::metrics::get().network_refused(r.reason);
    tracing::debug!(
        reason = r.reason,
        status = r.status,
        "network request refused"
    );
    let mut response = text(r.status, r.message);
    if r.status == 401 {
        let value = if r.reason == "unauthenticated" {
            "Bearer realm=\"acpd\""
        } else {
            "Bearer realm=\"acpd\", error=\"invalid_token\""
        };
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static(value),
        );
    }
    if r.status == 429 {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn header<'a>(req: &'a Request<hyper::body::Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Every request: checked (credentials, origin, token, rate) before anything else is read.
async fn handle(face: Arc<Face>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    if req.uri().path() != "/acp" {
        return text(404, "not found: ACP is served on /acp");
    }
    let net = face.net();
    if let Err(r) = guard::no_misplaced_credentials(req.uri().query(), req.headers())
        .and_then(|()| guard::origin_allowed(req.headers(), &net.allowed_origins))
    {
        return refused(r);
    }
    let grant = match guard::bearer(req.headers()) {
        Err(r) => return refused(r),
        Ok(token) => match face.auth.verify(token) {
            Ok(grant) => grant,
            Err(why) => {
                tracing::info!(reason = ?why, "refused a network request's token");
                return refused(guard::refused_token(why));
            }
        },
    };
    if let Err(wait) = face
        .rate
        .take(grant.id, net.requests_per_second, std::time::Instant::now())
    {
        tracing::debug!(token = %grant.name, ?wait, "over requests_per_second");
        return refused(Refused::new(
            429,
            "requests_per_second",
            format!(
                "token {:?} is over requests_per_second ({}); retry after {} ms",
                grant.name,
                net.requests_per_second,
                wait.as_millis().max(1)
            ),
        ));
    }
    let is_upgrade = header(&req, "upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    match *req.method() {
        Method::GET if is_upgrade => upgrade(face, grant, req, &net),
        Method::GET => open_stream(face, grant, req, &net),
        Method::POST => post(face, grant, req, &net).await,
        Method::DELETE => delete(face, grant, req).await,
        _ => text(
            405,
            "/acp takes POST, GET (an event stream or a WebSocket upgrade) and DELETE",
        ),
    }
}

/// The server context of a network connection: its token's principal, no local process.
fn conn_ctx(face: &Face, grant: &Grant) -> ServerContext {
    ServerContext {
        principal: Some(crate::server::Principal::token(grant)),
        origin: None,
        caller_cwd: None,
        ..face.ctx.clone()
    }
}

fn upgrade(
    face: Arc<Face>,
    grant: Grant,
    mut req: Request<hyper::body::Incoming>,
    net: &NetworkConfig,
) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return refused(Refused::new(
            400,
            "bad_request",
            "a WebSocket upgrade needs Sec-WebSocket-Key",
        ));
    };
    if header(&req, "sec-websocket-version") != Some("13") {
        let mut r = text(426, "WebSocket version 13 is required");
        r.headers_mut()
            .insert("sec-websocket-version", HeaderValue::from_static("13"));
        return r;
    }
    let place = match face.live.admit(
        &grant,
        net.max_network_connections,
        net.max_connections_per_token,
        &face.cancel,
    ) {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    let id = uuid::Uuid::new_v4().to_string();
    let on_upgrade = hyper::upgrade::on(&mut req);
    let limits = websocket::WsLimits {
        max_message: face.ctx.registry.config().max_line,
        keepalive: net.http_keepalive,
        idle: net.http_idle_timeout,
        write_timeout: face.ctx.registry.config().write_timeout,
        requests_per_second: net.requests_per_second,
        message_timeout: face.ctx.registry.config().line_timeout,
    };
    let ctx = conn_ctx(&face, &grant);
    let task_face = face.clone();
    face.tracker.spawn(async move {
        let upgraded = tokio::select! {
            u = on_upgrade => u,
            () = place.cancel.cancelled() => return,
        };
        match upgraded {
            Ok(upgraded) => {
                let bridged = bridge::open(ctx, &task_face.tracker);
                websocket::serve(upgraded, bridged, place, limits, task_face.rate.clone()).await;
            }
            Err(e) => tracing::debug!("websocket upgrade failed: {e}"),
        }
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut response = Response::new(http_body_util::Empty::new().boxed_unsync());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::UPGRADE,
        HeaderValue::from_static("websocket"),
    );
    headers.insert(
        hyper::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        headers.insert("sec-websocket-accept", v);
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        headers.insert(HEADER_CONNECTION_ID, v);
    }
    response
}

fn open_stream(
    face: Arc<Face>,
    grant: Grant,
    req: Request<hyper::body::Incoming>,
    net: &NetworkConfig,
) -> Response<Body> {
    if !header(&req, "accept").is_some_and(|a| a.to_ascii_lowercase().contains("text/event-stream"))
    {
        return text(
            406,
            "a GET on /acp is an event stream (Accept: text/event-stream) or a WebSocket upgrade",
        );
    }
    let Some(id) = header(&req, HEADER_CONNECTION_ID) else {
        return text(400, "Missing Acp-Connection-Id");
    };
    let Some(conn) = face.conns.get(id, grant.id) else {
        return text(404, "Unknown Acp-Connection-Id");
    };
    match conn.open_stream(header(&req, HEADER_SESSION_ID)) {
        Err(r) => text(r.status, r.message),
        Ok(lease) => {
            let mut response = Response::new(lease.into_body(net.http_keepalive));
            let h = response.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            h.insert(
                hyper::header::CACHE_CONTROL,
                HeaderValue::from_static("no-cache"),
            );
            response
        }
    }
}

async fn post(
    face: Arc<Face>,
    grant: Grant,
    req: Request<hyper::body::Incoming>,
    net: &NetworkConfig,
) -> Response<Body> {
    let json = header(&req, "content-type")
        .and_then(|c| c.split(';').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return text(415, "POST /acp takes Content-Type: application/json");
    }
    let config = face.ctx.registry.config();
    let connection = header(&req, HEADER_CONNECTION_ID).map(str::to_owned);
    let session = header(&req, HEADER_SESSION_ID).map(str::to_owned);
    let body = match read_body(req.into_body(), config.max_line, config.line_timeout).await {
        Ok(body) => body,
        Err(r) => return refused(r),
    };
    let Some(id) = connection else {
        return initialize(face, grant, &body, net).await;
    };
    let Some(conn) = face.conns.get(&id, grant.id) else {
        return text(404, "Unknown Acp-Connection-Id");
    };
    if is_initialize(&body) {
        return text(400, "Initialize not allowed on existing connection");
    }
    match conn
        .post(&body, session.as_deref(), config.write_timeout)
        .await
    {
        Ok(()) => {
            let mut r = Response::new(http_body_util::Empty::new().boxed_unsync());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        }
        Err(r) => text(r.status, r.message),
    }
}

/// A POST's body, held to the bounds of every door: `max_line` in size, `line_timeout` from
/// the request to its last byte, and past a small allowance the process-wide budget for
/// unfinished messages (a body arriving slowly waits for budget rather than holding memory
/// nobody accounts for).
async fn read_body(
    mut body: hyper::body::Incoming,
    max_line: usize,
    timeout: Duration,
) -> Result<Bytes, Refused> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut held = crate::wire::half::HalfBudget::global().held();
    let mut buf = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return Err(Refused::new(
                    408,
                    "line_timeout",
                    format!("the request body did not arrive within line_timeout ({timeout:?})"),
                ));
            }
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Err(e))) => {
                return Err(Refused::new(
                    400,
                    "bad_request",
                    format!("the request body could not be read: {e}"),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > max_line {
            crate::metrics::get().limit_hit(crate::metrics::Limit::MaxLine);
            return Err(Refused::new(
                413,
                "max_line",
                format!("the message is over max_line ({max_line} bytes)"),
            ));
        }
        if held.grow(buf.len() + data.len(), deadline).await.is_err() {
            return Err(Refused::new(
                503,
                "unfinished_message_budget",
                "unfinished messages on all connections hold the whole budget \
                 (unfinished_message_budget); retry later",
            ));
        }
        buf.extend_from_slice(&data);
    }
}

fn is_initialize(body: &[u8]) -> bool {
    matches!(
        acpd_protocol::envelope::parse_ref(body),
        Ok(acpd_protocol::envelope::MessageRef::Request { method, .. }) if method == "initialize"
    )
}

async fn initialize(
    face: Arc<Face>,
    grant: Grant,
    body: &[u8],
    net: &NetworkConfig,
) -> Response<Body> {
    if !is_initialize(body) {
        return text(
            400,
            "Missing Acp-Connection-Id: a connection starts with an initialize request",
        );
    }
    let place = match face.live.admit(
        &grant,
        net.max_network_connections,
        net.max_connections_per_token,
        &face.cancel,
    ) {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    let id = uuid::Uuid::new_v4().to_string();
    let bridge::Bridged {
        to_acpd,
        mut from_acpd,
    } = bridge::open(conn_ctx(&face, &grant), &face.tracker);
    let write_timeout = face.ctx.registry.config().write_timeout;
    let conn = HttpConn::new(id.clone(), grant.id, to_acpd, place, write_timeout);
    match conn
        .initialize(body, &mut from_acpd, INITIALIZE_TIMEOUT)
        .await
    {
        Ok(answer) => {
            face.conns.insert(conn.clone());
            let router_face = face.clone();
            let router_conn = conn.clone();
            face.tracker.spawn(async move {
                router_conn.clone().route(from_acpd).await;
                router_face.conns.remove(&router_conn.id);
            });
            face.tracker
                .spawn(conn.clone().watch_idle(net.http_idle_timeout));
            let mut response = Response::new(http_body_util::Full::new(answer).boxed_unsync());
            let h = response.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Ok(v) = HeaderValue::from_str(&id) {
                h.insert(HEADER_CONNECTION_ID, v);
            }
            response
        }
        Err(r) => {
            conn.close("initialize failed").await;
            text(r.status, r.message)
        }
    }
}

async fn delete(
    face: Arc<Face>,
    grant: Grant,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let Some(id) = header(&req, HEADER_CONNECTION_ID) else {
        return text(400, "Missing Acp-Connection-Id");
    };
    let Some(conn) = face.conns.get(id, grant.id) else {
        return text(404, "Unknown Acp-Connection-Id");
    };
    face.conns.remove(id);
    conn.close("the client ended it (DELETE)").await;
    let mut r = Response::new(http_body_util::Empty::new().boxed_unsync());
    *r.status_mut() = StatusCode::ACCEPTED;
    r
}
