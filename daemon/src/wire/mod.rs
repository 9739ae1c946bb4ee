//! acpd's JSON-RPC wire, used toward children and toward parents.
//!
//! Two halves, each bounded:
//! - [`LineReader`] frames lines (capped at `max_line`; a partial line older than
//!   `line_timeout` is dropped; the buffer shrinks back after a large line; a parent's partial
//!   line past a small allowance holds bytes of the process-wide budget, [`half`]) and parses
//!   the envelope. A child's driver reads with it inline, so everything a child says is handled
//!   in the order it said it; a parent connection runs it in its own task ([`connect`]).
//! - [`Outbox`] queues lines for a writer task behind a byte budget, so a peer that stops
//!   reading costs at most the budget, then slows whoever writes to it; every write has a
//!   deadline (`write_timeout`), past which the peer is gone. Large answers are queued as
//!   closures and serialised by the writer only when it has room ([`Peer::respond_lazy`]).
//!
//! Closing an outbox drops the write half after what is queued, which is how a child's stdin
//! gets EOF (tokio's `shutdown` on a pipe is a no-op).

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::codec::FrameError;
use acpd_protocol::envelope::{EnvelopeError, Id, Message, RpcError};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

/// Messages queued between a reader and its owner.
pub(crate) const QUEUE_DEPTH: usize = 64;
/// Bytes of messages queued between a reader and its owner: past it the reader stops reading
/// the peer until the owner catches up. A larger message (up to `max_line`) takes it all.
const IN_BUDGET: usize = 4 * 1024 * 1024;
/// Lines queued toward one peer, whatever their size (the byte budget bounds the rest).
const OUT_DEPTH: usize = 256;
/// Bytes queued toward one peer before senders wait. A larger line takes the whole budget.
const OUT_BUDGET: usize = 1024 * 1024;
/// Read size, and the buffer an idle connection gives back: below glibc's mmap threshold as
/// acpd tunes it (32 KiB), so taking it again costs no system call.
const READ_CHUNK: usize = 16 * 1024;

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
    /// The line needed more of the budget for unfinished messages than others left it
    /// before its deadline.
    #[error("line dropped: {0}")]
    OverBudget(#[from] half::Exhausted),
}

impl LineFault {
    /// The JSON-RPC error a peer gets for this line, and the id to answer, if it had one.
    pub fn to_rpc_error(&self) -> (Option<Id>, RpcError) {
        match self {
            LineFault::Envelope(e) => (e.id().cloned(), e.to_rpc_error()),
            LineFault::Frame(e) => (None, RpcError::from_frame(e)),
            LineFault::Stalled(_) => (None, RpcError::line_timeout()),
            LineFault::OverBudget(e) => (None, half::refusal(e)),
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

pub(crate) mod half;
#[cfg(test)]
mod half_tests;
mod outbox;
pub(crate) mod peer;
mod reader;
#[cfg(test)]
mod tests;

pub(crate) use outbox::Outbox;
pub(crate) use peer::{Admit, Peer, Pending};
pub(crate) use reader::sleep_until_opt;
pub(crate) use reader::{LineReader, unicode_escapes};

/// A running connection: the sender and the queue of incoming messages (ends at EOF).
pub struct Connection {
    pub peer: Peer,
    pub incoming: Inbox,
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
    connect_with(reader, writer, limits, None)
}

/// Starts a reader task and a writer task over a byte stream pair. The reader completes our
/// calls itself and queues everything else for the owner (bounded: a flooding peer is slowed
/// by its own pipe). A parent's unfinished line past its allowance holds `budget`'s bytes.
pub(crate) fn connect_with<R, W>(
    reader: R,
    writer: W,
    limits: WireLimits,
    budget: Option<&Arc<half::HalfBudget>>,
) -> Connection
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (in_tx, in_rx) = mpsc::channel(QUEUE_DEPTH);
    let pending = Arc::new(Pending::default());
    let eof = CancellationToken::new();
    let queued = Arc::new(Semaphore::new(IN_BUDGET));
    let reader = LineReader::new(reader, limits);
    tokio::spawn(read_loop(
        match budget {
            Some(budget) => reader.budgeted(budget),
            None => reader,
        },
        pending.clone(),
        (in_tx, queued),
        eof.clone(),
    ));
    let out = Outbox::start(writer, limits.write_timeout);
    Connection {
        peer: Peer::new(out, pending),
        incoming: Inbox(in_rx),
        eof,
    }
}

/// A message read, with the share of [`IN_BUDGET`] it holds until its owner takes it.
type Read = (Incoming, Option<OwnedSemaphorePermit>);

/// The queue of a connection's incoming messages, bounded in messages ([`QUEUE_DEPTH`]) and
/// bytes ([`IN_BUDGET`]).
pub struct Inbox(mpsc::Receiver<Read>);

impl Inbox {
    /// The next message; `None` once the peer's input has ended and all were taken.
    pub async fn recv(&mut self) -> Option<Incoming> {
        self.0.recv().await.map(|(message, _)| message)
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: LineReader<R>,
    pending: Arc<Pending>,
    (incoming, budget): (mpsc::Sender<Read>, Arc<Semaphore>),
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
        let len = match &forward {
            Incoming::Request { method, params, .. }
            | Incoming::Notification { method, params } => {
                method.len() + params.as_ref().map_or(0, |p| p.get().len())
            }
            Incoming::Fault(_) => 0,
        };
        // The budget is never closed: waiting is the peer's own backpressure.
        let held = match len {
            0 => None,
            n => (budget
                .clone()
                .acquire_many_owned(n.min(IN_BUDGET) as u32)
                .await)
                .ok(),
        };
        if incoming.send((forward, held)).await.is_err() {
            // The owner is gone; keep draining so pending calls still complete.
            continue;
        }
    }
    pending.close();
    eof.cancel();
}
