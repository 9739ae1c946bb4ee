//! ACP over Streamable HTTP (the Active transport RFD): `POST /acp` with `initialize` opens a
//! connection (200, `Acp-Connection-Id`); later POSTs are answered 202 and what acpd says goes
//! out on the connection's SSE stream, or on a session's own stream (`Acp-Session-Id`) for the
//! messages of that session — routed as the TypeScript SDK's reference server routes them, except
//! that a `session/load`'s answer follows its replay on the session's stream (as the Rust SDK's
//! server sends it) and an answer to acpd's request needs no `Acp-Session-Id` (the Rust SDK's
//! client sends none), so both SDKs' clients work (tests/agents/remote_clients.rs).
//! `DELETE` ends the connection; its sessions detach as an editor's do when it hangs up.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acpd_protocol::envelope::{Id, MessageRef, parse_keyed};
use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::bridge::{FromAcpd, ToAcpd};
use super::live::Place;

/// Bytes a stream with a reader may hold before the router waits for it (backpressure on acpd,
/// then on the agent): a client that stops reading holds this much, then its connection ends
/// after acpd's `write_timeout`.
const STREAM_BYTES: usize = 1024 * 1024;
/// Bytes all streams without a reader may hold together (a session's updates before its stream
/// is opened); past it the connection is closed, never a message silently dropped.
const UNREAD_BYTES: usize = 8 * 1024 * 1024;
/// How many bytes of queued events one chunk of an event stream takes at most (past one event).
const EVENTS_CHUNK: usize = 64 * 1024;
/// Session streams one connection may have.
const MAX_STREAMS: usize = 64;
/// The longest session id a stream may be opened for.
const MAX_SESSION_ID: usize = 256;
/// How long a connection whose main stream was open may go without one before it ends.
const REOPEN_GRACE: Duration = Duration::from_secs(5);

/// Where a message goes out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Route {
    Connection,
    Session(String),
}

/// A request id as a map key (`1` and `"1"` are different ids).
fn id_key(id: &Id) -> String {
    id.to_json().into_owned()
}

#[derive(Default)]
struct Mailbox {
    queue: VecDeque<Bytes>,
    bytes: usize,
    /// An SSE response is reading this stream now.
    reader: bool,
    /// It had a reader once (the main stream: losing it ends the connection after a grace).
    was_read: bool,
}

#[derive(Default)]
struct Routing {
    /// The editor's requests in flight → the stream their answers go to.
    answers: HashMap<String, Route>,
    /// acpd's requests to the editor → the session whose stream carried them.
    asked: HashMap<String, Route>,
    main: Mailbox,
    sessions: HashMap<String, Mailbox>,
    closed: Option<&'static str>,
}

impl Routing {
    fn mailbox(&mut self, route: &Route) -> &mut Mailbox {
        match route {
            Route::Connection => &mut self.main,
            Route::Session(s) => self.sessions.entry(s.clone()).or_default(),
        }
    }

    fn unread(&self) -> usize {
        let main = if self.main.reader { 0 } else { self.main.bytes };
        main + self
            .sessions
            .values()
            .filter(|m| !m.reader)
            .map(|m| m.bytes)
            .sum::<usize>()
    }
}

/// One Streamable HTTP ACP connection.
pub(crate) struct HttpConn {
    pub id: String,
    pub token: i64,
    to_acpd: ToAcpd,
    routing: Mutex<Routing>,
    /// Wakes stream readers (a message queued, the connection closed) and the router (room).
    changed: Notify,
    pub cancel: CancellationToken,
    /// How long a full stream may keep the router waiting before its client counts as gone.
    write_timeout: Duration,
    _place: Place,
}

/// Why a POST or GET on a known connection is refused.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub status: u16,
    pub message: String,
}

fn refuse(status: u16, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        message: message.into(),
    }
}

impl HttpConn {
    pub(super) fn new(
        id: String,
        token: i64,
        to_acpd: ToAcpd,
        place: Place,
        write_timeout: Duration,
    ) -> Arc<HttpConn> {
        Arc::new(HttpConn {
            id,
            token,
            to_acpd,
            routing: Mutex::new(Routing::default()),
            changed: Notify::new(),
            cancel: place.cancel.clone(),
            write_timeout,
            _place: place,
        })
    }

    fn routing(&self) -> std::sync::MutexGuard<'_, Routing> {
        self.routing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the connection: its streams end, acpd's server sees the editor hang up.
    pub(crate) async fn close(&self, why: &'static str) {
        {
            let mut routing = self.routing();
            if routing.closed.is_none() {
                routing.closed = Some(why);
                tracing::info!(connection = %self.id, "network connection closed: {why}");
            }
        }
        self.cancel.cancel();
        self.changed.notify_waiters();
        self.to_acpd.close().await;
    }

    /// A POSTed message (not `initialize`), checked as the reference server checks it, then
    /// handed to acpd. `session` is the `Acp-Session-Id` header.
    pub(crate) async fn post(
        &self,
        body: &[u8],
        session: Option<&str>,
        write_timeout: Duration,
    ) -> Result<(), Refusal> {
        let (message, keys) =
            parse_keyed(body).map_err(|e| refuse(400, format!("not a JSON-RPC message: {e}")))?;
        match message {
            MessageRef::Response { id, .. } => {
                let key = id.as_ref().map(id_key);
                let route = key
                    .as_ref()
                    .and_then(|k| self.routing().asked.get(k).cloned());
                // The id alone names what is answered (acpd asked it on this connection); the
                // Rust SDK's client (agent-client-protocol-http 5.0) sends answers without
                // Acp-Session-Id, so only a header naming another session is refused.
                if let (Some(Route::Session(s)), Some(h)) = (&route, session)
                    && h != s
                {
                    return Err(refuse(400, "Mismatched Acp-Session-Id"));
                }
                if let Some(k) = key {
                    self.routing().asked.remove(&k);
                }
            }
            MessageRef::Request {
                ref id, ref method, ..
            } => {
                // Every answer goes out on the stream its request named, a load's too: on the
                // session's stream it follows the history the load replays there (on the main
                // stream it overtook the replay, and the client saw the load answered first).
                let route = route_of(method, session_of(keys.session_id).as_deref(), session)?;
                self.routing().answers.insert(id_key(id), route);
            }
            MessageRef::Notification { ref method, .. } => {
                route_of(method, session_of(keys.session_id).as_deref(), session)?;
            }
        }
        self.to_acpd
            .send(body, write_timeout)
            .await
            .map_err(|e| refuse(503, e.to_string()))
    }

    /// Hands `initialize` to acpd and waits for its answer (what acpd says before it, nothing
    /// in practice, stays queued for the main stream).
    pub(crate) async fn initialize(
        &self,
        body: &[u8],
        from_acpd: &mut FromAcpd,
        timeout: Duration,
    ) -> Result<Bytes, Refusal> {
        let id = match parse_keyed(body) {
            Ok((MessageRef::Request { id, .. }, _)) => id,
            _ => {
                return Err(refuse(
                    400,
                    "initialize must be a JSON-RPC request with an id",
                ));
            }
        };
        let wait = async {
            self.to_acpd
                .send(body, timeout)
                .await
                .map_err(|e| refuse(503, e.to_string()))?;
            while let Some(line) = from_acpd.next().await {
                if let Ok((MessageRef::Response { id: Some(got), .. }, _)) = parse_keyed(&line)
                    && got == id
                {
                    return Ok(line);
                }
                self.push(Route::Connection, line);
            }
            Err(refuse(
                500,
                "acpd closed the connection before answering initialize",
            ))
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| Err(refuse(503, "initialize was not answered in time")))
    }

    fn push(&self, route: Route, line: Bytes) {
        let mut routing = self.routing();
        let mailbox = routing.mailbox(&route);
        mailbox.bytes += line.len();
        mailbox.queue.push_back(line);
        drop(routing);
        self.changed.notify_waiters();
    }

    /// Routes what acpd writes until it closes the connection: each answer to the stream its
    /// request asked for, each request and notification naming a session to that session's
    /// stream, the rest to the main stream.
    pub(crate) async fn route(self: Arc<Self>, mut from_acpd: FromAcpd) {
        loop {
            let line = tokio::select! {
                line = from_acpd.next() => line,
                () = self.cancel.cancelled() => None,
            };
            let Some(line) = line else { break };
            let route = match parse_keyed(&line) {
                Ok((MessageRef::Response { id: Some(id), .. }, _)) => self
                    .routing()
                    .answers
                    .remove(&id_key(&id))
                    .unwrap_or(Route::Connection),
                Ok((MessageRef::Request { id, .. }, keys)) => {
                    let route =
                        session_of(keys.session_id).map_or(Route::Connection, Route::Session);
                    self.routing().asked.insert(id_key(&id), route.clone());
                    route
                }
                Ok((MessageRef::Notification { .. }, keys)) => {
                    session_of(keys.session_id).map_or(Route::Connection, Route::Session)
                }
                _ => Route::Connection,
            };
            match tokio::time::timeout(self.write_timeout, self.room_for(&route)).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(_) => {
                    crate::metrics::get().network_refused("client_not_reading");
                    tracing::warn!(connection = %self.id,
                        "closing a network connection whose client stopped reading its event stream (write_timeout)");
                    self.close("its client stopped reading (write_timeout)")
                        .await;
                    return;
                }
            }
            self.push(route, line);
            let unread = self.routing().unread();
            if unread > UNREAD_BYTES {
                tracing::warn!(connection = %self.id, unread,
                    "closing a network connection: {UNREAD_BYTES} bytes wait on streams nobody opened");
                crate::metrics::get().network_refused("unread_streams");
                self.close("messages waited on streams the client never opened")
                    .await;
                return;
            }
        }
        self.close("acpd ended the connection").await;
    }

    /// Waits while a read stream is full; false once the connection is closing.
    async fn room_for(&self, route: &Route) -> bool {
        loop {
            let notified = self.changed.notified();
            {
                let mut routing = self.routing();
                if routing.closed.is_some() {
                    return false;
                }
                let mailbox = routing.mailbox(route);
                if !mailbox.reader || mailbox.bytes < STREAM_BYTES {
                    return true;
                }
            }
            tokio::select! {
                () = notified => {}
                () = self.cancel.cancelled() => return false,
            }
        }
    }

    /// Takes the reader's place on a stream: the main one (`session` `None`) or a session's.
    pub(crate) fn open_stream(
        self: &Arc<Self>,
        session: Option<&str>,
    ) -> Result<StreamLease, Refusal> {
        let route = match session {
            None => Route::Connection,
            Some(s) if s.is_empty() || s.len() > MAX_SESSION_ID => {
                return Err(refuse(
                    400,
                    format!("Acp-Session-Id must be 1 to {MAX_SESSION_ID} bytes"),
                ));
            }
            Some(s) => Route::Session(s.to_owned()),
        };
        let mut routing = self.routing();
        if routing.closed.is_some() {
            return Err(refuse(404, "Unknown Acp-Connection-Id"));
        }
        if let Route::Session(s) = &route
            && !routing.sessions.contains_key(s)
            && routing.sessions.len() >= MAX_STREAMS
        {
            return Err(refuse(
                400,
                format!("a connection may open {MAX_STREAMS} session streams"),
            ));
        }
        let mailbox = routing.mailbox(&route);
        if mailbox.reader {
            return Err(refuse(
                409,
                "Outbound stream already has an active receiver",
            ));
        }
        mailbox.reader = true;
        mailbox.was_read = true;
        drop(routing);
        Ok(StreamLease {
            conn: self.clone(),
            route,
        })
    }

    /// Whether the main stream is read now, and was ever.
    fn main_stream(&self) -> (bool, bool) {
        let routing = self.routing();
        (routing.main.reader, routing.main.was_read)
    }

    /// Ends the connection when its client is gone: the main stream was never opened within
    /// `idle`, or was lost and not opened again within a grace.
    pub(crate) async fn watch_idle(self: Arc<Self>, idle: Duration) {
        let start = tokio::time::Instant::now();
        loop {
            let (reading, was_read) = self.main_stream();
            let wait = match (reading, was_read) {
                (true, _) => None,
                (false, true) => Some(REOPEN_GRACE),
                (false, false) => Some(idle.saturating_sub(start.elapsed())),
            };
            let notified = self.changed.notified();
            match wait {
                None => tokio::select! {
                    () = notified => {}
                    () = self.cancel.cancelled() => return,
                },
                Some(wait) => tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep(wait) => {
                        if self.main_stream().0 {
                            continue;
                        }
                        crate::metrics::get().network_refused("http_idle_timeout");
                        self.close(if was_read {
                            "its event stream was lost and not opened again"
                        } else {
                            "its event stream was not opened within http_idle_timeout"
                        })
                        .await;
                        return;
                    }
                    () = self.cancel.cancelled() => return,
                },
            }
        }
    }
}

/// A params' `sessionId` as the scan found it (a JSON string, quotes and escapes included).
fn session_of(written: Option<&str>) -> Option<String> {
    serde_json::from_str(written?).ok()
}

/// The stream a request addresses: its `Acp-Session-Id` header, which must match the params'
/// `sessionId` when both are present, and must be present for session-scoped methods.
fn route_of(
    method: &str,
    params_session: Option<&str>,
    header: Option<&str>,
) -> Result<Route, Refusal> {
    const SCOPED: &[&str] = &[
        "session/cancel",
        "session/close",
        "session/delete",
        "session/fork",
        "session/load",
        "session/prompt",
        "session/resume",
        "session/set_config_option",
        "session/set_mode",
        "session/set_model",
    ];
    if (SCOPED.contains(&method) || params_session.is_some()) && header.is_none() {
        return Err(refuse(400, "Missing Acp-Session-Id"));
    }
    if let (Some(h), Some(p)) = (header, params_session)
        && h != p
    {
        return Err(refuse(400, "Mismatched Acp-Session-Id"));
    }
    Ok(header
        .or(params_session)
        .map_or(Route::Connection, |s| Route::Session(s.to_owned())))
}

/// An SSE response's hold on its stream; released when the response ends.
pub(crate) struct StreamLease {
    conn: Arc<HttpConn>,
    route: Route,
}

impl Drop for StreamLease {
    fn drop(&mut self) {
        {
            let mut routing = self.conn.routing();
            let mailbox = routing.mailbox(&self.route);
            mailbox.reader = false;
            if let Route::Session(s) = &self.route
                && mailbox.queue.is_empty()
            {
                let s = s.clone();
                routing.sessions.remove(&s);
            }
        }
        self.conn.changed.notify_waiters();
    }
}

enum Event {
    Data(Bytes),
    Again,
    End,
}

impl StreamLease {
    /// The next event for this stream: a message, a keep-alive comment, or the end.
    async fn next_event(&self, keepalive: Duration) -> Event {
        // Created before the queue is looked at: a message queued after the look wakes it.
        let notified = self.conn.changed.notified();
        {
            let mut routing = self.conn.routing();
            if routing.closed.is_some() {
                return Event::End;
            }
            let mailbox = routing.mailbox(&self.route);
            if !mailbox.queue.is_empty() {
                // Every message queued now, as one chunk: a burst of updates is one write.
                let mut events = Vec::new();
                while let Some(line) = mailbox.queue.pop_front() {
                    mailbox.bytes -= line.len();
                    events.extend_from_slice(b"data: ");
                    events.extend_from_slice(&line);
                    events.extend_from_slice(b"\n\n");
                    if events.len() >= EVENTS_CHUNK {
                        break;
                    }
                }
                drop(routing);
                self.conn.changed.notify_waiters();
                return Event::Data(Bytes::from(events));
            }
        }
        tokio::select! {
            () = notified => Event::Again,
            () = tokio::time::sleep(keepalive) => Event::Data(Bytes::from_static(b":\n\n")),
        }
    }

    /// The SSE body: each message as a `data:` event, a comment every `keepalive` while idle;
    /// it ends when the connection closes.
    pub(crate) fn into_body(self, keepalive: Duration) -> super::Body {
        use http_body_util::BodyExt;
        let stream = futures::stream::unfold(self, move |lease| async move {
            loop {
                match lease.next_event(keepalive).await {
                    Event::Data(bytes) => {
                        let frame = hyper::body::Frame::data(bytes);
                        return Some((Ok::<_, Infallible>(frame), lease));
                    }
                    Event::Again => {}
                    Event::End => return None,
                }
            }
        });
        http_body_util::StreamBody::new(stream).boxed_unsync()
    }
}

/// The live Streamable HTTP connections, by `Acp-Connection-Id`.
#[derive(Default)]
pub(crate) struct HttpConns {
    by_id: Mutex<HashMap<String, Arc<HttpConn>>>,
}

impl HttpConns {
    pub(crate) fn insert(&self, conn: Arc<HttpConn>) {
        self.lock().insert(conn.id.clone(), conn);
    }

    /// The connection `id` if it is `token`'s; another token's connection is unknown to it.
    pub(crate) fn get(&self, id: &str, token: i64) -> Option<Arc<HttpConn>> {
        self.lock().get(id).filter(|c| c.token == token).cloned()
    }

    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<HttpConn>>> {
        self.by_id.lock().unwrap_or_else(|e| e.into_inner())
    }
}
