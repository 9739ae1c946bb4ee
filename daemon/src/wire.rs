//! acpd's JSON-RPC wire, used toward children and toward parents.
//!
//! Two halves, each bounded:
//! - [`LineReader`] frames lines (capped at `max_line`; a partial line older than
//!   `line_timeout` is dropped; the buffer shrinks back after a large line) and parses the
//!   envelope. A child's driver reads with it inline, so everything a child says is handled in
//!   the order it said it; a parent connection runs it in its own task ([`connect`]).
//! - [`Outbox`] queues lines for a writer task behind a byte budget, so a peer that stops
//!   reading costs at most the budget, then slows whoever writes to it; every write has a
//!   deadline (`write_timeout`), past which the peer is gone. Large answers are queued as
//!   closures and serialised by the writer only when it has room ([`Peer::respond_lazy`]).
//!
//! Closing an outbox drops the write half after what is queued, which is how a child's stdin
//! gets EOF (tokio's `shutdown` on a pipe is a no-op).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acpd_protocol::codec::{FrameError, LineDecoder};
use acpd_protocol::envelope::{self, EnvelopeError, Id, Message, RpcError};
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Messages queued between a reader and its owner.
pub const QUEUE_DEPTH: usize = 64;
/// Lines queued toward one peer, whatever their size (the byte budget bounds the rest).
const OUT_DEPTH: usize = 256;
/// Bytes queued toward one peer before senders wait. A larger line takes the whole budget.
const OUT_BUDGET: usize = 1024 * 1024;
const READ_CHUNK: usize = 64 * 1024;
const WRITE_BUFFER: usize = 64 * 1024;

/// The per-connection limits of the wire.
#[derive(Debug, Clone, Copy)]
pub struct WireLimits {
    pub max_line: usize,
    /// How long an unterminated line may wait for the rest of it.
    pub line_timeout: Duration,
    /// How long one write may wait for the peer to take bytes.
    pub write_timeout: Duration,
}

impl Default for WireLimits {
    fn default() -> Self {
        WireLimits {
            max_line: acpd_protocol::codec::DEFAULT_MAX_LINE,
            line_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// A message from a parent that the connection's owner must handle.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// A line that is not a usable message. Receivers of requests answer `Invalid` ones that
    /// carry an id; a child's driver treats any fault as a protocol failure.
    Fault(LineFault),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LineFault {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    #[error("line not finished within {0:?} (line_timeout); dropped")]
    Stalled(Duration),
}

impl LineFault {
    /// The JSON-RPC error a peer gets for this line, and the id to answer, if it had one.
    pub fn to_rpc_error(&self, max_line: usize) -> (Option<Id>, RpcError) {
        match self {
            LineFault::Envelope(e) => (e.id().cloned(), e.to_rpc_error()),
            LineFault::Frame(FrameError::Oversized { limit }) => (
                None,
                RpcError::parse_error(self)
                    .with_data(serde_json::json!({ "limit": "max_line", "value": limit })),
            ),
            LineFault::Frame(e) => (None, RpcError::parse_error(e)),
            LineFault::Stalled(t) => (
                None,
                RpcError::parse_error(self).with_data(serde_json::json!({
                    "limit": "line_timeout", "value": humantime::format_duration(*t).to_string(),
                    "maxLine": max_line,
                })),
            ),
        }
    }
}

/// Why an outgoing call did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("peer answered with an error: {0}")]
    Rpc(RpcError),
    #[error("connection closed before the peer answered")]
    Closed,
}

/// Reads framed, parsed messages from a byte stream.
pub struct LineReader<R> {
    reader: R,
    limits: WireLimits,
    decoder: LineDecoder,
    buf: BytesMut,
    eof: bool,
    /// When the bytes now in `buf` started waiting for their newline.
    partial_since: Option<Instant>,
    /// After a stalled line: drop bytes up to and including the next newline.
    skipping: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(reader: R, limits: WireLimits) -> Self {
        LineReader {
            reader,
            limits,
            decoder: LineDecoder::new(limits.max_line),
            buf: BytesMut::new(),
            eof: false,
            partial_since: None,
            skipping: false,
        }
    }

    /// The next message or bad line; `None` at end of input (or a read error). Cancel-safe:
    /// everything read is kept in `self`.
    pub async fn next(&mut self) -> Option<Result<Message, LineFault>> {
        loop {
            if self.skipping {
                match memchr::memchr(b'\n', &self.buf) {
                    Some(pos) => {
                        let _ = self.buf.split_to(pos + 1);
                        self.skipping = false;
                    }
                    None => self.buf.clear(),
                }
            }
            if !self.skipping {
                let item = if self.eof {
                    self.decoder.decode_eof(&mut self.buf)
                } else {
                    self.decoder.decode(&mut self.buf)
                };
                if let Some(item) = item {
                    self.partial_since = None;
                    self.shrink();
                    return Some(match item {
                        Ok(line) => envelope::parse(&line).map_err(LineFault::from),
                        Err(e) => Err(LineFault::from(e)),
                    });
                }
            }
            if self.eof {
                return None;
            }
            self.shrink();
            if self.buf.is_empty() || self.skipping {
                self.partial_since = None;
            } else if self.partial_since.is_none() {
                self.partial_since = Some(Instant::now());
            }
            let stall = self.partial_since.map(|t| t + self.limits.line_timeout);
            self.buf.reserve(READ_CHUNK);
            tokio::select! {
                read = self.reader.read_buf(&mut self.buf) => match read {
                    Ok(0) | Err(_) => self.eof = true,
                    Ok(_) => {}
                },
                _ = sleep_until_opt(stall), if stall.is_some() => {
                    self.partial_since = None;
                    self.buf = BytesMut::new();
                    self.decoder = LineDecoder::new(self.limits.max_line);
                    self.skipping = true;
                    return Some(Err(LineFault::Stalled(self.limits.line_timeout)));
                }
            }
        }
    }

    /// Gives memory back after a large line, and between messages when nothing is pending, so
    /// an idle connection holds no read buffer.
    fn shrink(&mut self) {
        if self.buf.is_empty() {
            if self.buf.capacity() > 0 {
                self.buf = BytesMut::new();
            }
        } else if self.buf.capacity() > 4 * READ_CHUNK && self.buf.len() <= READ_CHUNK {
            let rest = self.buf.split();
            self.buf = BytesMut::with_capacity(READ_CHUNK);
            self.buf.extend_from_slice(&rest);
        }
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// One queued item: a line, or an answer the writer serialises when it gets to it.
enum Out {
    Line(Bytes, Option<OwnedSemaphorePermit>),
    Lazy(Box<dyn FnOnce() -> Vec<u8> + Send>),
}

/// The sending half toward one peer: a bounded queue in front of a writer task. Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Out>,
    budget: Arc<Semaphore>,
    close: CancellationToken,
    broken: CancellationToken,
    /// Cancelled when the writer task has ended (flushed and closed, or broken).
    done: CancellationToken,
}

impl Outbox {
    /// Starts the writer task over `writer`.
    pub fn start<W>(writer: W, write_timeout: Duration) -> Outbox
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(OUT_DEPTH);
        let budget = Arc::new(Semaphore::new(OUT_BUDGET));
        let close = CancellationToken::new();
        let broken = CancellationToken::new();
        let done = CancellationToken::new();
        let task = write_loop(
            writer,
            rx,
            write_timeout,
            close.clone(),
            broken.clone(),
            budget.clone(),
        );
        let finished = done.clone();
        tokio::spawn(async move {
            task.await;
            finished.cancel();
        });
        Outbox {
            tx,
            budget,
            close,
            broken,
            done,
        }
    }

    /// Queues one encoded message (without its newline). Waits while the budget is spent;
    /// fails once the peer is gone.
    pub async fn send_line(&self, mut line: Vec<u8>) -> Result<(), CallError> {
        line.push(b'\n');
        let cost = line.len().min(OUT_BUDGET) as u32;
        let permit = tokio::select! {
            p = self.budget.clone().acquire_many_owned(cost) => p.map_err(|_| CallError::Closed)?,
            _ = self.broken.cancelled() => return Err(CallError::Closed),
        };
        self.tx
            .send(Out::Line(Bytes::from(line), Some(permit)))
            .await
            .map_err(|_| CallError::Closed)
    }

    /// Queues a message the writer builds when it reaches it (one at a time, so many large
    /// answers waiting for a slow peer cost one serialisation, not one each).
    async fn send_lazy(&self, build: Box<dyn FnOnce() -> Vec<u8> + Send>) -> Result<(), CallError> {
        tokio::select! {
            sent = self.tx.send(Out::Lazy(build)) => sent.map_err(|_| CallError::Closed),
            _ = self.broken.cancelled() => Err(CallError::Closed),
        }
    }

    /// Flushes what is queued and drops the write half. Idempotent.
    pub fn close(&self) {
        self.close.cancel();
    }

    /// Cancelled when the peer stopped taking bytes (a broken pipe or `write_timeout`).
    pub fn broken(&self) -> CancellationToken {
        self.broken.clone()
    }

    /// Closes the outbox and waits until what was queued is written (each write bounded by
    /// `write_timeout`).
    pub async fn flush_and_close(&self) {
        self.close.cancel();
        self.done.cancelled().await;
    }

    /// Resolves once a line of `len` bytes would be queued without waiting, for owners that
    /// stop taking work while the peer is behind. Never resolves once the writer has ended
    /// (whoever owns the peer learns that from [`Outbox::broken`] or the process).
    pub async fn room(&self, len: usize) {
        let cost = len.min(OUT_BUDGET) as u32;
        let ready = async {
            drop(self.budget.acquire_many(cost).await.ok()?);
            self.tx.reserve().await.ok()
        };
        if ready.await.is_none() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether a line of `len` bytes would be queued without waiting.
    pub fn has_room(&self, len: usize) -> bool {
        self.tx.capacity() > 0 && self.budget.available_permits() >= len.min(OUT_BUDGET)
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    out: mpsc::Receiver<Out>,
    write_timeout: Duration,
    close: CancellationToken,
    broken: CancellationToken,
    budget: Arc<Semaphore>,
) {
    let ok = write_all_queued(writer, out, write_timeout, close).await;
    if ok.is_err() {
        broken.cancel();
    }
    budget.close();
}

async fn write_all_queued<W: AsyncWrite + Unpin>(
    writer: W,
    mut out: mpsc::Receiver<Out>,
    write_timeout: Duration,
    close: CancellationToken,
) -> std::io::Result<()> {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER, writer);
    let timed = |r: Result<std::io::Result<()>, tokio::time::error::Elapsed>| match r {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "write_timeout",
        )),
    };
    loop {
        let item = tokio::select! {
            biased;
            item = out.recv() => item,
            _ = close.cancelled() => None,
        };
        let Some(item) = item else { break };
        timed(tokio::time::timeout(write_timeout, write_item(&mut writer, item)).await)?;
        // Batch whatever else is already queued into the same flush.
        while let Ok(more) = out.try_recv() {
            timed(tokio::time::timeout(write_timeout, write_item(&mut writer, more)).await)?;
        }
        timed(tokio::time::timeout(write_timeout, writer.flush()).await)?;
    }
    // Send what was queued before the close, then drop the write half.
    out.close();
    while let Ok(more) = out.try_recv() {
        timed(tokio::time::timeout(write_timeout, write_item(&mut writer, more)).await)?;
    }
    timed(tokio::time::timeout(write_timeout, writer.flush()).await)?;
    let _ = tokio::time::timeout(write_timeout, writer.shutdown()).await;
    Ok(())
}

async fn write_item<W: AsyncWrite + Unpin>(
    writer: &mut BufWriter<W>,
    item: Out,
) -> std::io::Result<()> {
    match item {
        Out::Line(line, permit) => {
            writer.write_all(&line).await?;
            drop(permit);
        }
        Out::Lazy(build) => {
            let mut line = build();
            line.push(b'\n');
            writer.write_all(&line).await?;
        }
    }
    Ok(())
}

type Reply = Result<Box<RawValue>, RpcError>;

/// Calls acpd made and is waiting on, by id.
#[derive(Default)]
pub struct Pending {
    waiters: Mutex<HashMap<Id, oneshot::Sender<Reply>>>,
    next_id: AtomicI64,
    /// Set once the peer's side has ended; new calls fail at once instead of waiting forever.
    closed: AtomicBool,
}

impl Pending {
    fn register(&self) -> Option<(Id, oneshot::Receiver<Reply>)> {
        let id = Id::Num(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        let mut waiters = lock(&self.waiters);
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        waiters.insert(id.clone(), tx);
        Some((id, rx))
    }

    /// Hands an answer to its waiter. False when no call of ours has that id.
    pub fn complete(&self, id: Option<Id>, outcome: Reply) -> bool {
        match id.and_then(|id| lock(&self.waiters).remove(&id)) {
            Some(tx) => {
                let _ = tx.send(outcome);
                true
            }
            None => false,
        }
    }

    /// The peer is gone: every waiter gets `Closed`, and new calls fail at once.
    pub fn close(&self) {
        let mut waiters = lock(&self.waiters);
        self.closed.store(true, Ordering::Release);
        waiters.clear();
    }
}

/// The peer's requests acpd has not answered yet, against `max_pending_requests`.
struct Admission {
    open: Mutex<std::collections::HashSet<Id>>,
    max: std::sync::atomic::AtomicUsize,
}

/// The sending half of a connection, with the calls it is waiting on. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    out: Outbox,
    pending: Arc<Pending>,
    admission: Arc<Admission>,
}

/// A call that has been sent; await [`PendingCall::result`] for the answer. Dropping it sends
/// nothing (ACP turns are cancelled with `session/cancel`, never by abandoning the request).
pub struct PendingCall {
    pub id: Id,
    rx: oneshot::Receiver<Reply>,
}

impl PendingCall {
    pub async fn result(self) -> Result<Box<RawValue>, CallError> {
        match self.rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Rpc(e)),
            Err(_) => Err(CallError::Closed),
        }
    }
}

impl Peer {
    pub fn new(out: Outbox, pending: Arc<Pending>) -> Peer {
        let admission = Arc::new(Admission {
            open: Mutex::new(Default::default()),
            max: usize::MAX.into(),
        });
        Peer {
            out,
            pending,
            admission,
        }
    }

    /// Caps how many of the peer's requests may wait for an answer at once.
    pub fn limit_pending(&self, max: usize) {
        self.admission.max.store(max, Ordering::Relaxed);
    }

    /// Counts a request from the peer until it is answered; false when that would exceed the
    /// limit (answer it with an error at once: an answer to an unadmitted id is not counted).
    pub fn admit(&self, id: &Id) -> bool {
        let mut open = lock(&self.admission.open);
        if open.len() >= self.admission.max.load(Ordering::Relaxed) {
            return false;
        }
        open.insert(id.clone());
        true
    }

    fn answered(&self, id: &Id) {
        lock(&self.admission.open).remove(id);
    }

    /// Sends a request and returns the pending answer.
    pub async fn call<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<PendingCall, CallError> {
        let raw = envelope::to_raw(params);
        self.call_raw(method, Some(&raw)).await
    }

    pub async fn call_raw(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<PendingCall, CallError> {
        let (id, rx) = self.pending.register().ok_or(CallError::Closed)?;
        let line = envelope::encode_request(&id, method, params);
        if self.send_line(line).await.is_err() {
            self.pending
                .complete(Some(id), Err(RpcError::internal("not sent")));
            return Err(CallError::Closed);
        }
        Ok(PendingCall { id, rx })
    }

    /// Sends a request and waits for its answer.
    pub async fn request<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<Box<RawValue>, CallError> {
        self.call(method, params).await?.result().await
    }

    pub async fn notify<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<(), CallError> {
        let raw = envelope::to_raw(params);
        self.notify_raw(method, Some(&raw)).await
    }

    pub async fn notify_raw(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<(), CallError> {
        self.send_line(envelope::encode_notification(method, params))
            .await
    }

    /// A notification whose params are JSON text known to be valid.
    pub async fn notify_text(&self, method: &str, params: &str) -> Result<(), CallError> {
        self.send_line(envelope::encode_notification_text(method, params))
            .await
    }

    pub async fn respond(
        &self,
        id: &Id,
        reply: Result<&RawValue, &RpcError>,
    ) -> Result<(), CallError> {
        let line = match reply {
            Ok(result) => envelope::encode_result(id, result),
            Err(error) => envelope::encode_error(Some(id), error),
        };
        self.answered(id);
        self.send_line(line).await
    }

    pub async fn respond_ok<R: Serialize + ?Sized>(
        &self,
        id: &Id,
        result: &R,
    ) -> Result<(), CallError> {
        let raw = envelope::to_raw(result);
        self.respond(id, Ok(&raw)).await
    }

    /// Answers with a result serialised only when the writer gets to it: `result` is shared
    /// (an `Arc`), so many waiters on one large result hold one copy.
    pub async fn respond_lazy<R>(&self, id: &Id, result: Arc<R>) -> Result<(), CallError>
    where
        R: Serialize + Send + Sync + 'static,
    {
        self.answered(id);
        let id = id.clone();
        self.out
            .send_lazy(Box::new(move || {
                envelope::encode_result(&id, &envelope::to_raw(&*result))
            }))
            .await
    }

    pub async fn respond_err(&self, id: Option<&Id>, error: &RpcError) -> Result<(), CallError> {
        if let Some(id) = id {
            self.answered(id);
        }
        self.send_line(envelope::encode_error(id, error)).await
    }

    /// Queues one encoded message (without its newline).
    pub async fn send_line(&self, line: Vec<u8>) -> Result<(), CallError> {
        self.out.send_line(line).await
    }

    /// Closes our side: the writer flushes what is queued and drops the write half, so the peer
    /// sees EOF. Idempotent.
    pub fn close(&self) {
        self.out.close();
    }

    /// Cancelled when writing to the peer failed (a broken pipe, `write_timeout`).
    pub fn broken(&self) -> CancellationToken {
        self.out.broken()
    }

    /// Closes our side and waits until what was queued is written or the peer is gone.
    pub async fn flush_and_close(&self) {
        self.out.flush_and_close().await;
    }

    /// True once the peer's side has ended (EOF or read error).
    pub fn is_closed(&self) -> bool {
        self.pending.closed.load(Ordering::Acquire)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running connection: the sender and the queue of incoming messages (ends at EOF).
pub struct Connection {
    pub peer: Peer,
    pub incoming: mpsc::Receiver<Incoming>,
    /// Cancelled when the peer's input ended (EOF or a read error).
    pub eof: CancellationToken,
}

/// Starts a reader task and a writer task over a byte stream pair, with default limits.
pub fn connect<R, W>(reader: R, writer: W, max_line: usize) -> Connection
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = WireLimits {
        max_line,
        ..WireLimits::default()
    };
    connect_with(reader, writer, limits)
}

/// Starts a reader task and a writer task over a byte stream pair. The reader completes our
/// calls itself and queues everything else for the owner (bounded: a flooding peer is slowed
/// by its own pipe).
pub fn connect_with<R, W>(reader: R, writer: W, limits: WireLimits) -> Connection
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(QUEUE_DEPTH);
    let pending = Arc::new(Pending::default());
    let eof = CancellationToken::new();
    tokio::spawn(read_loop(
        LineReader::new(reader, limits),
        pending.clone(),
        in_tx,
        eof.clone(),
    ));
    let out = Outbox::start(writer, limits.write_timeout);
    Connection {
        peer: Peer::new(out, pending),
        incoming: in_rx,
        eof,
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: LineReader<R>,
    pending: Arc<Pending>,
    incoming: mpsc::Sender<Incoming>,
    eof: CancellationToken,
) {
    while let Some(msg) = reader.next().await {
        let forward = match msg {
            Ok(Message::Response { id, outcome }) => {
                if !pending.complete(id, outcome) {
                    tracing::debug!("dropping a response that matches no pending call");
                }
                continue;
            }
            Ok(Message::Request { id, method, params }) => Incoming::Request { id, method, params },
            Ok(Message::Notification { method, params }) => {
                Incoming::Notification { method, params }
            }
            Err(fault) => Incoming::Fault(fault),
        };
        if incoming.send(forward).await.is_err() {
            // The owner is gone; keep draining so pending calls still complete.
            continue;
        }
    }
    pending.close();
    eof.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_complete_and_requests_reach_the_owner() {
        let (a, b) = tokio::io::duplex(1024);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let left = connect(ar, aw, 1024);
        let mut right = connect(br, bw, 1024);
        let call = left
            .peer
            .call("ping", &serde_json::json!({"n": 1}))
            .await
            .unwrap();
        let Some(Incoming::Request { id, method, params }) = right.incoming.recv().await else {
            panic!("expected a request")
        };
        assert_eq!(method, "ping");
        assert_eq!(params.unwrap().get(), r#"{"n":1}"#);
        right
            .peer
            .respond_ok(&id, &serde_json::json!("pong"))
            .await
            .unwrap();
        assert_eq!(call.result().await.unwrap().get(), r#""pong""#);
        left.peer.close();
        assert!(right.incoming.recv().await.is_none(), "EOF after close");
    }

    #[tokio::test]
    async fn bad_lines_are_faults_and_eof_fails_pending_calls() {
        let (a, b) = tokio::io::duplex(1024);
        let (ar, aw) = tokio::io::split(a);
        let (br, mut bw) = tokio::io::split(b);
        let mut left = connect(ar, aw, 16);
        let call = left.peer.call("x", &serde_json::json!({})).await.unwrap();
        bw.write_all(b"{nope\n0123456789012345678901\n")
            .await
            .unwrap();
        let Some(Incoming::Fault(LineFault::Envelope(_))) = left.incoming.recv().await else {
            panic!()
        };
        let Some(Incoming::Fault(LineFault::Frame(FrameError::Oversized { .. }))) =
            left.incoming.recv().await
        else {
            panic!()
        };
        drop(bw);
        drop(br);
        assert!(matches!(call.result().await, Err(CallError::Closed)));
        assert!(left.incoming.recv().await.is_none());
        assert!(matches!(
            left.peer.call("y", &()).await,
            Err(CallError::Closed)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_partial_line_is_dropped_and_the_stream_resumes() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let limits = WireLimits {
            max_line: 1 << 20,
            line_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
        };
        let mut reader = LineReader::new(a, limits);
        b.write_all(&vec![b'x'; 300_000]).await.unwrap();
        let fault = reader.next().await;
        assert!(
            matches!(fault, Some(Err(LineFault::Stalled(_)))),
            "{fault:?}"
        );
        assert_eq!(
            reader.buf.capacity(),
            0,
            "the partial line's memory is released"
        );
        // The rest of the stalled line is skipped; the next line parses.
        b.write_all(b"still the old line\n{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n")
            .await
            .unwrap();
        let next = reader.next().await;
        assert!(
            matches!(next, Some(Ok(Message::Notification { ref method, .. })) if method == "m"),
            "{next:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_breaks_after_write_timeout() {
        let (a, _b) = tokio::io::duplex(64);
        let out = Outbox::start(a, Duration::from_secs(3));
        let broken = out.broken();
        // More than the pipe holds: the writer blocks, then gives up.
        let _ = out.send_line(vec![b'y'; 4096]).await;
        tokio::time::timeout(Duration::from_secs(10), broken.cancelled())
            .await
            .expect("broken within write_timeout");
        assert!(out.send_line(b"{}".to_vec()).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn queued_bytes_are_bounded_by_the_budget() {
        let (a, _b) = tokio::io::duplex(64);
        let out = Outbox::start(a, Duration::from_secs(3600));
        let mut sent = 0usize;
        loop {
            let send = out.send_line(vec![b'z'; 64 * 1024]);
            match tokio::time::timeout(Duration::from_secs(1), send).await {
                Ok(Ok(())) => sent += 64 * 1024,
                _ => break,
            }
        }
        assert!(sent <= OUT_BUDGET + 2 * 64 * 1024, "queued {sent} bytes");
    }
}
