//! A WebSocket's unfinished message held to the same bounds as every other door's: the bytes
//! read toward a message that has not ended come out of the process-wide budget for unfinished
//! messages ([`crate::wire::half`]) past the connection's allowance, and a message may take at
//! most `line_timeout` from its first byte to its last. tungstenite buffers a message as it
//! arrives and cannot be asked to wait, so the bound sits under it, on the socket: a read that
//! would take the message past what it holds waits for budget (the client is slowed by its own
//! socket), and a message past its deadline ends the connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::wire::half::{Exhausted, HalfBudget, Held};

/// How much more a message that filled its room asks the budget for at a time.
const GROW_STEP: usize = 256 * 1024;

/// Why a read was refused: what the WebSocket's close frame says.
pub(super) const OVER_BUDGET: &str = "unfinished_message_budget";
pub(super) const TOO_SLOW: &str = "line_timeout";

/// Told by the reader of messages when one ended, so the next one starts a fresh count.
#[derive(Clone, Default)]
pub(super) struct MessageEnds(Arc<AtomicBool>);

impl MessageEnds {
    pub(super) fn ended(&self) {
        self.0.store(true, Ordering::Release);
    }
}

type Growing = Pin<Box<dyn Future<Output = (Held, Result<(), Exhausted>)> + Send>>;

/// An upgraded socket whose reads count toward the unfinished message.
pub(super) struct Budgeted<T> {
    inner: T,
    held: Option<Held>,
    growing: Option<Growing>,
    ends: MessageEnds,
    /// Bytes read since the last message ended.
    unfinished: usize,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> Budgeted<T> {
    pub(super) fn new(inner: T, timeout: Duration) -> (Budgeted<T>, MessageEnds) {
        let ends = MessageEnds::default();
        let io = Budgeted {
            inner,
            held: Some(HalfBudget::global().held()),
            growing: None,
            ends: ends.clone(),
            unfinished: 0,
            timeout,
            deadline: None,
        };
        (io, ends)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Budgeted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.ends.0.swap(false, Ordering::AcqRel) {
            this.unfinished = 0;
            this.deadline = None;
            if let Some(held) = this.held.as_mut() {
                held.fit(0);
            }
        }
        if let Some(deadline) = this.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, TOO_SLOW)));
        }
        // A read brings at most what the message may still hold: an idle connection (or one
        // whose message fits its allowance) never touches the budget, whatever the size of
        // the buffer it reads into. Only a message that filled its room grows it.
        if let Some(growing) = this.growing.as_mut() {
            match growing.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready((held, outcome)) => {
                    this.growing = None;
                    this.held = Some(held);
                    if outcome.is_err() {
                        return Poll::Ready(Err(io::Error::other(OVER_BUDGET)));
                    }
                }
            }
        }
        let room = this.held.as_ref().map_or(usize::MAX, Held::room);
        if this.unfinished >= room
            && let Some(mut held) = this.held.take()
        {
            let want = this.unfinished + GROW_STEP;
            let deadline = this
                .deadline
                .as_ref()
                .map_or_else(|| Instant::now() + this.timeout, |d| d.deadline());
            let mut growing: Growing = Box::pin(async move {
                let outcome = held.grow(want, deadline).await;
                (held, outcome)
            });
            match growing.as_mut().poll(cx) {
                Poll::Pending => {
                    this.growing = Some(growing);
                    return Poll::Pending;
                }
                Poll::Ready((held, outcome)) => {
                    this.held = Some(held);
                    if outcome.is_err() {
                        return Poll::Ready(Err(io::Error::other(OVER_BUDGET)));
                    }
                }
            }
        }
        let room = this.held.as_ref().map_or(usize::MAX, Held::room);
        let at_most = room.saturating_sub(this.unfinished).min(buf.remaining());
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(at_most));
        let read = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
        let got = limited.filled().len();
        buf.advance(got);
        if got > 0 {
            if this.unfinished == 0 {
                this.deadline = Some(Box::pin(tokio::time::sleep(this.timeout)));
            }
            this.unfinished += got;
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Budgeted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
