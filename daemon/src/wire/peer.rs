//! A connection's sending half with the calls acpd is waiting on, and the count of the peer's
//! requests not answered yet (`max_pending_requests`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use acpd_protocol::envelope::{self, Id, RpcError};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{CallError, Outbox};

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

/// Whether a peer's request may be served now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Yes,
    /// `max_pending_requests` are unanswered.
    Full,
    /// A request with this id is still unanswered: two could not be told apart.
    DuplicateId,
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

    /// Counts a request from the peer until it is answered. Refused when that would exceed the
    /// limit, or when a request with the same id is still unanswered (answer it with an error
    /// at once: an answer to an unadmitted id is not counted).
    pub fn admit(&self, id: &Id) -> Admit {
        let mut open = lock(&self.admission.open);
        if open.contains(id) {
            return Admit::DuplicateId;
        }
        if open.len() >= self.admission.max.load(Ordering::Relaxed) {
            return Admit::Full;
        }
        open.insert(id.clone());
        Admit::Yes
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
        let line = envelope::encode_reply(id, reply);
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

    /// An empty buffer to gather a batch for [`Peer::send_lines`] in, reused when there is one.
    pub fn batch_buffer(&self, capacity: usize) -> Vec<u8> {
        self.out.batch_buffer(capacity)
    }

    /// Queues several encoded messages, each with its newline, as one item.
    pub async fn send_lines(&self, lines: Vec<u8>) -> Result<(), CallError> {
        self.out.send_lines(lines).await
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

    /// [`Peer::flush_and_close`] for at most `within`; then the peer is given up on (see
    /// [`super::outbox::Outbox::flush_and_close_within`]).
    pub async fn flush_and_close_within(&self, within: std::time::Duration) {
        self.out.flush_and_close_within(within).await;
    }

    /// True once the peer's side has ended (EOF or read error).
    pub fn is_closed(&self) -> bool {
        self.pending.closed.load(Ordering::Acquire)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
