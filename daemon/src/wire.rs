//! acpd's JSON-RPC connection engine, used toward children and toward parents.
//!
//! One connection is a reader task and a writer task joined by bounded channels: the reader
//! frames lines (capped), completes our outgoing calls itself and hands every request,
//! notification and bad line to the connection's owner through a bounded queue, so a peer that
//! floods us is slowed by its own pipe instead of growing our memory. The writer batches queued
//! lines into one buffered write and flushes when its queue drains. Closing the connection drops
//! the writer, which is how a child's stdin gets EOF (tokio's `shutdown` on a pipe is a no-op).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use acpd_protocol::codec::{FrameError, LineDecoder};
use acpd_protocol::envelope::{self, EnvelopeError, Id, Message, RpcError};
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Queue depth between the reader and the owner, and between senders and the writer. Small on
/// purpose: it is the unit of backpressure.
pub const QUEUE_DEPTH: usize = 64;
const READ_CHUNK: usize = 64 * 1024;
const WRITE_BUFFER: usize = 64 * 1024;

/// A message from the peer that the owner must handle.
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
    /// carry an id; a child connection treats any fault as a protocol failure.
    Fault(LineFault),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LineFault {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
}

/// Why an outgoing call did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    #[error("peer answered with an error: {0}")]
    Rpc(RpcError),
    #[error("connection closed before the peer answered")]
    Closed,
}

type Reply = Result<Box<RawValue>, RpcError>;

struct Shared {
    pending: Mutex<HashMap<Id, oneshot::Sender<Reply>>>,
    next_id: AtomicI64,
    /// Set once the reader has seen EOF; new calls fail at once instead of waiting forever.
    closed: AtomicBool,
}

/// The sending half of a connection. Cheap to clone.
#[derive(Clone)]
pub struct Peer {
    out: mpsc::Sender<Bytes>,
    shared: Arc<Shared>,
    close: CancellationToken,
    broken: CancellationToken,
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
        let id = Id::Num(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.shared.pending);
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(CallError::Closed);
            }
            pending.insert(id.clone(), tx);
        }
        let line = envelope::encode_request(&id, method, params);
        if self.send_line(line).await.is_err() {
            lock(&self.shared.pending).remove(&id);
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

    pub async fn respond_err(&self, id: Option<&Id>, error: &RpcError) -> Result<(), CallError> {
        self.send_line(envelope::encode_error(id, error)).await
    }

    /// Queues one encoded message (without its newline). Waits while the writer's queue is full.
    pub async fn send_line(&self, mut line: Vec<u8>) -> Result<(), CallError> {
        line.push(b'\n');
        self.out
            .send(Bytes::from(line))
            .await
            .map_err(|_| CallError::Closed)
    }

    /// Closes our side: the writer flushes what is queued and drops the write half, so the peer
    /// sees EOF. Idempotent.
    pub fn close(&self) {
        self.close.cancel();
    }

    /// Cancelled when writing to the peer failed (a broken pipe): nothing more can reach it.
    pub fn broken(&self) -> CancellationToken {
        self.broken.clone()
    }

    /// True once the peer's side has ended (EOF or read error).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A running connection: the sender, the queue of incoming messages (ends at EOF), and the
/// tasks, which end on their own when both directions are done.
pub struct Connection {
    pub peer: Peer,
    pub incoming: mpsc::Receiver<Incoming>,
    pub reader: tokio::task::JoinHandle<()>,
    pub writer: tokio::task::JoinHandle<()>,
}

/// Starts the reader and writer tasks over a byte stream pair.
pub fn connect<R, W>(reader: R, writer: W, max_line: usize) -> Connection
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(QUEUE_DEPTH);
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(QUEUE_DEPTH);
    let shared = Arc::new(Shared {
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicI64::new(0),
        closed: AtomicBool::new(false),
    });
    let close = CancellationToken::new();
    let broken = CancellationToken::new();
    let reader = tokio::spawn(read_loop(reader, max_line, shared.clone(), in_tx));
    let writer = tokio::spawn(write_loop(writer, out_rx, close.clone(), broken.clone()));
    Connection {
        peer: Peer {
            out: out_tx,
            shared,
            close,
            broken,
        },
        incoming: in_rx,
        reader,
        writer,
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: R,
    max_line: usize,
    shared: Arc<Shared>,
    incoming: mpsc::Sender<Incoming>,
) {
    let mut decoder = LineDecoder::new(max_line);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut eof = false;
    loop {
        let item = if eof {
            decoder.decode_eof(&mut buf)
        } else {
            decoder.decode(&mut buf)
        };
        let Some(item) = item else {
            if eof {
                break;
            }
            buf.reserve(READ_CHUNK);
            match reader.read_buf(&mut buf).await {
                Ok(0) | Err(_) => eof = true,
                Ok(_) => {}
            }
            continue;
        };
        let msg = match item {
            Ok(line) => envelope::parse(&line).map_err(LineFault::from),
            Err(e) => Err(LineFault::from(e)),
        };
        let forward = match msg {
            Ok(Message::Response { id, outcome }) => {
                let waiter = id.and_then(|id| lock(&shared.pending).remove(&id));
                match waiter {
                    Some(tx) => {
                        let _ = tx.send(outcome);
                    }
                    None => tracing::debug!("dropping a response that matches no pending call"),
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
    let mut pending = lock(&shared.pending);
    shared.closed.store(true, Ordering::Release);
    pending.clear();
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    out: mpsc::Receiver<Bytes>,
    close: CancellationToken,
    broken: CancellationToken,
) {
    if write_all_queued(writer, out, close).await.is_err() {
        broken.cancel();
    }
}

async fn write_all_queued<W: AsyncWrite + Unpin>(
    writer: W,
    mut out: mpsc::Receiver<Bytes>,
    close: CancellationToken,
) -> std::io::Result<()> {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER, writer);
    loop {
        let line = tokio::select! {
            biased;
            line = out.recv() => line,
            _ = close.cancelled() => None,
        };
        let Some(line) = line else { break };
        writer.write_all(&line).await?;
        // Batch whatever else is already queued into the same flush.
        while let Ok(more) = out.try_recv() {
            writer.write_all(&more).await?;
        }
        writer.flush().await?;
    }
    // Send what was queued before the close, then drop the write half.
    while let Ok(more) = out.try_recv() {
        writer.write_all(&more).await?;
    }
    writer.flush().await?;
    let _ = writer.shutdown().await;
    Ok(())
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
}
