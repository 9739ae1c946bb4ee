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
    pub(crate) async fn bind(net: &NetworkConfig) -> Result<Listeners, FaceError> {
        let certs = if net.listen.iter().any(|l| l.tls) {
            let (cert, key) = tls::files(net)?;
            Some(tls::Certificates::new(tls::load(&cert, &key)?))
        } else {
            None
        };
        let mut bound = Vec::new();
        for url in &net.listen {
            let listener = TcpListener::bind(url.addr)
                .await
                .map_err(|source| FaceError::Bind { url: *url, source })?;
            let addr = listener.local_addr().unwrap_or(url.addr);
            bound.push((ListenUrl { addr, ..*url }, listener));
        }
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
    let limited = http_body_util::Limited::new(req.into_body(), config.max_line);
    let body = match tokio::time::timeout(config.line_timeout, limited.collect()).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            crate::metrics::get().limit_hit(crate::metrics::Limit::MaxLine);
            return refused(Refused::new(
                413,
                "max_line",
                format!("the message is over max_line ({} bytes)", config.max_line),
            ));
        }
        Ok(Err(e)) => return text(400, format!("the request body could not be read: {e}")),
        Err(_) => {
            return refused(Refused::new(
                408,
                "http_header_timeout",
                format!(
                    "the request body did not arrive within line_timeout ({:?})",
                    config.line_timeout
                ),
            ));
        }
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
