//! The sending half toward a peer: a bounded queue behind a byte budget, a writer task that
//! batches and flushes, and a deadline on every write.

use std::sync::Arc;
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
