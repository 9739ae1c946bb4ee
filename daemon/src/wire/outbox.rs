//! The sending half toward a peer: a bounded queue behind a byte budget, a writer task that
//! gathers what is queued into one vectored write, and a deadline on every write.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::io::IoSlice;
use std::sync::Mutex;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{CallError, OUT_BUDGET, OUT_DEPTH};

/// One queued item: a line (or a batch of them, whose buffer the writer gives back to
/// [`Spare`]), or an answer the writer serialises when it gets to it.
enum Out {
    Line {
        bytes: Vec<u8>,
        permit: Option<OwnedSemaphorePermit>,
        batch: bool,
    },
    Lazy(Box<dyn FnOnce() -> Vec<u8> + Send>),
}

/// Items written by one `writev(2)` at most (Linux's `IOV_MAX` is 1 024).
const GATHER: usize = 64;
/// Written batch buffers kept for the next batch: a stream reuses two or three.
const SPARES: usize = 4;
/// A batch buffer this large or larger is not kept: it came from its own mapping (acpd's
/// `mmap` threshold is 32 KiB), so keeping it would keep memory an idle peer never gives back.
const SPARE_MAX: usize = 32 * 1024;

/// Batch buffers the writer has written, for the batcher's next batch. Without them each batch
/// was a fresh allocation, and the pages a stream touched were returned to the kernel and
/// faulted in again, batch after batch (a fifth of acpd's system time on a flood).
#[derive(Default)]
struct Spare(Mutex<Vec<Vec<u8>>>);

impl Spare {
    fn take(&self) -> Option<Vec<u8>> {
        self.0.lock().ok()?.pop()
    }

    fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() >= SPARE_MAX {
            return;
        }
        buf.clear();
        if let Ok(mut spare) = self.0.lock()
            && spare.len() < SPARES
        {
            spare.push(buf);
        }
    }
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
    spare: Arc<Spare>,
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
        let spare = Arc::new(Spare::default());
        let task = write_loop(
            writer,
            rx,
            write_timeout,
            close.clone(),
            broken.clone(),
            budget.clone(),
            spare.clone(),
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
            spare,
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
        self.queue(line, false).await
    }

    /// An empty buffer with room for `capacity` bytes to gather a batch for
    /// [`Outbox::send_lines`] in: one the writer has written and given back when there is one.
    pub fn batch_buffer(&self, capacity: usize) -> Vec<u8> {
        match self.spare.take() {
            Some(mut buf) => {
                buf.reserve_exact(capacity);
                buf
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// Queues several encoded messages at once, each ending in its newline: one budget claim
    /// and one queue slot for a burst.
    pub async fn send_lines(&self, lines: Vec<u8>) -> Result<(), CallError> {
        if let Some((trace, hop)) = &self.tap {
            for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                trace.record(*hop, line);
            }
        }
        self.queue(lines, true).await
    }

    async fn queue(&self, line: Vec<u8>, batch: bool) -> Result<(), CallError> {
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
        let item = Out::Line {
            bytes: line,
            permit: Some(permit),
            batch,
        };
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
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    out: mpsc::Receiver<Out>,
    write_timeout: Duration,
    close: CancellationToken,
    broken: CancellationToken,
    budget: Arc<Semaphore>,
    spare: Arc<Spare>,
) {
    // `broken` cancelled from outside is an owner giving up on the peer: stop writing.
    let ok = tokio::select! {
        ok = write_all_queued(writer, out, write_timeout, close, &spare) => ok,
        () = broken.cancelled() => Ok(()),
    };
    if ok.is_err() {
        broken.cancel();
    }
    budget.close();
}

/// What the writer has taken off the queue and not yet written.
#[derive(Default)]
struct Gathered {
    lines: Vec<(Vec<u8>, bool)>,
    /// The budget those lines hold, given back once, when they are written.
    held: Option<OwnedSemaphorePermit>,
}

impl Gathered {
    /// Adds `item` to the next write; whether more may join it (not after an answer built
    /// here: those are built and written one at a time, so many large answers waiting for a
    /// slow peer hold one serialisation at once, not one each).
    fn take(&mut self, item: Out) -> bool {
        match item {
            Out::Line {
                bytes,
                permit,
                batch,
            } => {
                self.lines.push((bytes, batch));
                match (self.held.as_mut(), permit) {
                    (Some(h), Some(m)) => h.merge(m),
                    (None, m) => self.held = m,
                    (Some(_), None) => {}
                }
                self.lines.len() < GATHER
            }
            Out::Lazy(build) => {
                let mut line = build();
                line.push(b'\n');
                self.lines.push((line, false));
                false
            }
        }
    }

    /// Writes every line gathered, in order, with as few `writev(2)` calls as the peer allows
    /// (no copy into a buffer of the writer's own), then gives the budget and the batch
    /// buffers back.
    async fn write<W: AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
        spare: &Spare,
    ) -> std::io::Result<()> {
        // A peer with no vectored write (a file or terminal behind tokio's stdout) would take
        // one line per call: it gets them joined instead.
        let joined;
        let mut slices: Vec<IoSlice<'_>> = if writer.is_write_vectored() || self.lines.len() < 2 {
            self.lines.iter().map(|(l, _)| IoSlice::new(l)).collect()
        } else {
            joined = self
                .lines
                .iter()
                .flat_map(|(l, _)| l)
                .copied()
                .collect::<Vec<u8>>();
            vec![IoSlice::new(&joined)]
        };
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = writer.write_vectored(rest).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut rest, n);
        }
        drop(slices);
        writer.flush().await?;
        self.held = None;
        for (line, batch) in self.lines.drain(..) {
            if batch {
                spare.give(line);
            }
        }
        Ok(())
    }
}

async fn write_all_queued<W: AsyncWrite + Unpin>(
    writer: W,
    mut out: mpsc::Receiver<Out>,
    write_timeout: Duration,
    close: CancellationToken,
    spare: &Spare,
) -> std::io::Result<()> {
    let mut writer = Deadline::new(writer, write_timeout);
    let mut gathered = Gathered::default();
    loop {
        let item = tokio::select! {
            biased;
            item = out.recv() => item,
            _ = close.cancelled() => None,
        };
        let Some(item) = item else { break };
        // Whatever else is already queued goes in the same write.
        let mut more = gathered.take(item);
        while more && let Ok(item) = out.try_recv() {
            more = gathered.take(item);
        }
        gathered.write(&mut writer, spare).await?;
    }
    // Send what was queued before the close, then drop the write half.
    out.close();
    while let Ok(item) = out.try_recv() {
        if !gathered.take(item) {
            gathered.write(&mut writer, spare).await?;
        }
    }
    gathered.write(&mut writer, spare).await?;
    let _ = writer.shutdown().await;
    Ok(())
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

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(cx, polled).map(|r| r.and_then(|r| r))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
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
