//! The sending half toward a peer: a bounded queue behind a byte budget, a writer task that
//! batches and flushes, and a deadline on every write.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{CallError, OUT_BUDGET, OUT_DEPTH, WRITE_BUFFER};

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
    /// Where each line queued is traced (`trace_dir`).
    tap: Option<super::reader::Tap>,
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
            tap: None,
        }
    }

    /// Records every line queued in `tap`'s trace.
    pub fn traced(mut self, tap: Option<super::reader::Tap>) -> Self {
        self.tap = tap;
        self
    }

    /// Queues one encoded message (without its newline). Waits while the budget is spent;
    /// fails once the peer is gone.
    pub async fn send_line(&self, mut line: Vec<u8>) -> Result<(), CallError> {
        if let Some((trace, hop)) = &self.tap {
            trace.record(*hop, &line);
        }
        line.push(b'\n');
        self.queue(line).await
    }

    /// Queues several encoded messages at once, each ending in its newline: one budget claim
    /// and one queue slot for a burst.
    pub async fn send_lines(&self, lines: Vec<u8>) -> Result<(), CallError> {
        if let Some((trace, hop)) = &self.tap {
            for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                trace.record(*hop, line);
            }
        }
        self.queue(lines).await
    }

    async fn queue(&self, line: Vec<u8>) -> Result<(), CallError> {
        let cost = line.len().min(OUT_BUDGET) as u32;
        // The hot path: budget and a queue slot free, nothing to wait for.
        let permit = match self.budget.clone().try_acquire_many_owned(cost) {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(CallError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => tokio::select! {
                p = self.budget.clone().acquire_many_owned(cost) => p.map_err(|_| CallError::Closed)?,
                _ = self.broken.cancelled() => return Err(CallError::Closed),
            },
        };
        let item = Out::Line(Bytes::from(line), Some(permit));
        match self.tx.try_send(item) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(CallError::Closed),
            Err(mpsc::error::TrySendError::Full(item)) => tokio::select! {
                sent = self.tx.send(item) => sent.map_err(|_| CallError::Closed),
                _ = self.broken.cancelled() => Err(CallError::Closed),
            },
        }
    }

    /// Queues a message the writer builds when it reaches it (one at a time, so many large
    /// answers waiting for a slow peer cost one serialisation, not one each).
    pub(super) async fn send_lazy(
        &self,
        build: Box<dyn FnOnce() -> Vec<u8> + Send>,
    ) -> Result<(), CallError> {
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

    /// Flushes what is queued for at most `within`, then gives up on the peer: the writer
    /// stops and every sender waiting for room (a session still streaming toward a parent
    /// that hung up without reading) fails at once instead of waiting out `write_timeout`.
    pub async fn flush_and_close_within(&self, within: Duration) {
        if tokio::time::timeout(within, self.flush_and_close())
            .await
            .is_err()
        {
            self.broken.cancel();
            self.done.cancelled().await;
        }
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
    // `broken` cancelled from outside is an owner giving up on the peer: stop writing.
    let ok = tokio::select! {
        ok = write_all_queued(writer, out, write_timeout, close) => ok,
        () = broken.cancelled() => Ok(()),
    };
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
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER, Deadline::new(writer, write_timeout));
    loop {
        let item = tokio::select! {
            biased;
            item = out.recv() => item,
            _ = close.cancelled() => None,
        };
        let Some(item) = item else { break };
        // Batch whatever else is already queued into the same flush; the budget the batch
        // holds is given back once, when it is written.
        let mut held = write_item(&mut writer, item).await?;
        while let Ok(more) = out.try_recv() {
            merge(&mut held, write_item(&mut writer, more).await?);
        }
        writer.flush().await?;
        drop(held);
    }
    // Send what was queued before the close, then drop the write half.
    out.close();
    while let Ok(more) = out.try_recv() {
        write_item(&mut writer, more).await?;
    }
    writer.flush().await?;
    let _ = writer.shutdown().await;
    Ok(())
}

fn merge(held: &mut Option<OwnedSemaphorePermit>, more: Option<OwnedSemaphorePermit>) {
    match (held.as_mut(), more) {
        (Some(h), Some(m)) => h.merge(m),
        (None, m) => *held = m,
        (Some(_), None) => {}
    }
}

/// Writes one item; returns the budget it held.
async fn write_item<W: AsyncWrite + Unpin>(
    writer: &mut BufWriter<W>,
    item: Out,
) -> std::io::Result<Option<OwnedSemaphorePermit>> {
    match item {
        Out::Line(line, permit) => {
            writer.write_all(&line).await?;
            Ok(permit)
        }
        Out::Lazy(build) => {
            let mut line = build();
            line.push(b'\n');
            writer.write_all(&line).await?;
            Ok(None)
        }
    }
}

/// A writer that fails with `TimedOut` once the peer has taken no bytes for `timeout`. The
/// clock is read only while the peer is not taking bytes, never per line.
struct Deadline<W> {
    inner: W,
    timeout: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<W> Deadline<W> {
    fn new(inner: W, timeout: Duration) -> Self {
        Deadline {
            inner,
            timeout,
            stalled: None,
        }
    }

    fn progress<T>(&mut self, cx: &mut Context<'_>, polled: Poll<T>) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(Ok(r))
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match stalled.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "write_timeout: the peer took no bytes",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Deadline<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(cx, polled).map(|r| r.and_then(|r| r))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(cx, polled).map(|r| r.and_then(|r| r))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progress(cx, polled).map(|r| r.and_then(|r| r))
    }
}
