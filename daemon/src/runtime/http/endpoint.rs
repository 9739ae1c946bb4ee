//! `/acp` itself: every request checked (credentials where they may travel, origin, token,
//! rate) before anything else is read, then served as the transport RFD has it — a POST
//! (`initialize` opening a connection, the rest handed to it), a GET (an event stream, or a
//! WebSocket upgrade), a DELETE.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use super::guard::{self, Grant, Refused};
use super::streamable::HttpConn;
use super::{Body, Face, bridge, websocket};
use crate::config::network::NetworkConfig;
use crate::server::ServerContext;

const HEADER_CONNECTION_ID: &str = "acp-connection-id";
const HEADER_SESSION_ID: &str = "acp-session-id";
/// How long an `initialize` POST waits for acpd's answer (it may start the default agent).
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(120);

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
pub(super) async fn handle(face: Arc<Face>, req: Request<hyper::body::Incoming>) -> Response<Body> {
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
