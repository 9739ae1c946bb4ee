//! Framing toward a peer: capped lines, a deadline for an unfinished one, and a read buffer
//! that gives memory back after a large line and between messages.

use acpd_protocol::codec::{FrameError, LineDecoder};
use acpd_protocol::envelope::{self, Message, MessageRef};
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncRead;
use tokio::time::Instant;

use super::half::{HalfBudget, Held};
use super::{LineFault, READ_CHUNK, WireLimits};

/// Reads framed, parsed messages from a byte stream.
pub(crate) struct LineReader<R> {
    reader: R,
    limits: WireLimits,
    decoder: LineDecoder,
    buf: BytesMut,
    eof: bool,
    /// When the bytes now in `buf` started waiting for their newline.
    partial_since: Option<Instant>,
    /// Where each line read is traced (`trace_dir`).
    tap: Option<Tap>,
    /// A parent's share of the budget for unfinished messages; `None` toward a child.
    held: Option<Held>,
    /// A large line (over 4 × [`STREAM_BUFFER`]) was taken from the allocation `buf` still
    /// points into: its bytes stay resident as long as what follows it there.
    after_large_line: bool,
}

/// A trace and the hop it records.
pub(crate) type Tap = (std::sync::Arc<crate::trace::Trace>, crate::trace::Hop);

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(reader: R, limits: WireLimits) -> Self {
        LineReader {
            reader,
            limits,
            // Every line goes to `envelope::parse`, which checks UTF-8 itself.
            decoder: LineDecoder::new(limits.max_line).leaving_utf8_to_the_envelope(),
            buf: BytesMut::new(),
            eof: false,
            partial_since: None,
            tap: None,
            held: None,
            after_large_line: false,
        }
    }

    /// Holds an unfinished line past [`half::ALLOWANCE`](super::half::ALLOWANCE) only with
    /// `budget`'s bytes: a parent's connection, one of many that share it.
    pub(crate) fn budgeted(mut self, budget: &std::sync::Arc<HalfBudget>) -> Self {
        self.held = Some(budget.held());
        self
    }

    /// Records every line read in `tap`'s trace.
    pub(crate) fn traced(mut self, tap: Option<Tap>) -> Self {
        self.tap = tap;
        self
    }

    /// A framed line, recorded in the trace; the framing fault when it is not one.
    fn framed(&self, item: Result<Bytes, FrameError>) -> Result<Bytes, LineFault> {
        let line = item.map_err(counted)?;
        if let Some((trace, hop)) = &self.tap {
            trace.record(*hop, &line);
        }
        Ok(line)
    }

    /// The next message or bad line; `None` at end of input (or a read error). Cancel-safe:
    /// everything read is kept in `self`.
    pub(crate) async fn next(&mut self) -> Option<Result<Message, LineFault>> {
        Some(parse(self.next_line().await?))
    }

    /// The next line, framed but not parsed (for [`envelope::parse_ref`], which borrows from
    /// it), or a framing fault; `None` at end of input. Cancel-safe like [`LineReader::next`].
    pub(crate) async fn next_line(&mut self) -> Option<Result<Bytes, LineFault>> {
        loop {
            let before = self.buf.len();
            let item = if self.eof {
                self.decoder.decode_eof(&mut self.buf)
            } else {
                self.decoder.decode(&mut self.buf)
            };
            if let Some(item) = item {
                self.taken(before - self.buf.len());
                return Some(self.framed(item));
            }
            if self.eof {
                return None;
            }
            self.leave_large_line();
            self.shrink();
            self.fit_held();
            if self.buf.is_empty() {
                self.partial_since = None;
            } else if self.partial_since.is_none() {
                self.partial_since = Some(Instant::now());
            }
            let stall = self
                .partial_since
                .map(|t| crate::durations::deadline_from(t, self.limits.line_timeout));
            // Room for the next read is taken from the budget before it: what a silent peer
            // holds was granted. Waiting for it reads nothing, and ends at the line's deadline.
            let room = match (&mut self.held, stall) {
                (Some(held), Some(deadline)) => {
                    // One byte more at least; the grains taken make room for whole reads. (No
                    // more than `max_line` and a `\r\n` is ever buffered: past it the decoder
                    // skips the line, so asks for no more.)
                    if let Err(e) = held.grow(self.buf.len() + 1, deadline).await {
                        self.abandon();
                        return Some(Err(e.into()));
                    }
                    held.room()
                }
                (Some(held), None) => held.room(),
                (None, _) => usize::MAX,
            };
            let at_most = room.saturating_sub(self.buf.len());
            tokio::select! {
                // Bytes that are already there always win over the deadline: the owner may
                // have been busy elsewhere while the rest of the line arrived.
                biased;
                read = read_into(&mut self.reader, &mut self.buf, at_most) => match read {
                    Ok(0) | Err(_) => self.eof = true,
                    Ok(_) => {}
                },
                _ = sleep_until_opt(stall), if stall.is_some() => {
                    if self.abandon() {
                        return Some(Err(LineFault::Stalled(self.limits.line_timeout)));
                    }
                }
            }
        }
    }

    /// Drops the unfinished line whose deadline passed: its memory is freed, its share of the
    /// budget given back, and the rest of it, up to its newline, skipped. Whether there was
    /// one to drop (not an oversized one already being skipped).
    fn abandon(&mut self) -> bool {
        self.partial_since = None;
        let dropped = self.decoder.abandon_partial(&mut self.buf);
        self.fit_held();
        dropped
    }

    /// After `consumed` bytes of lines were taken from the buffer: a new one starts, in less
    /// memory.
    fn taken(&mut self, consumed: usize) {
        self.partial_since = None;
        // Past a few stream buffers: never a burst of ordinary lines, which must not pay for a
        // new allocation.
        self.after_large_line |= consumed > 4 * STREAM_BUFFER;
        self.shrink();
        self.fit_held();
    }

    /// Once only an unfinished line (or nothing) is left behind a large one, moves it to an
    /// allocation of its own: sharing the large line's, it kept all of it resident (8 MiB held
    /// by 32 KiB, not counted in the budget) until it ended. Each byte is moved at most once:
    /// only the bytes that came after a large line, and only when no whole line is left.
    fn leave_large_line(&mut self) {
        if std::mem::take(&mut self.after_large_line) {
            let rest = self.buf.split();
            self.buf = BytesMut::new();
            if !rest.is_empty() {
                self.buf.reserve(rest.len() + READ_CHUNK);
                self.buf.extend_from_slice(&rest);
            }
        }
    }

    /// Gives back the budget the buffered bytes no longer need (no atomic while none is held).
    fn fit_held(&mut self) {
        if let Some(held) = &mut self.held {
            held.fit(self.buf.len());
        }
    }

    /// The next line already in the buffer, without reading: lets an owner handle a burst
    /// in one go (between its other duties) instead of one `select!` round per message.
    pub(crate) fn next_buffered_line(&mut self) -> Option<Result<Bytes, LineFault>> {
        if self.eof {
            return None;
        }
        let before = self.buf.len();
        let item = self.decoder.decode(&mut self.buf)?;
        self.taken(before - self.buf.len());
        Some(self.framed(item))
    }

    /// Lends the lines already in the buffer, where they lie, to a caller that knows how long
    /// each is: `measure` gets the buffered bytes from a line's start and says how long the
    /// line there is (it vouches that no newline is in it) with what it found; a line framed as
    /// the decoder would frame it goes to `take` with that, which says whether to go on. The
    /// lines taken are dropped from the buffer together; the first one not measured or not
    /// framed so stays for [`LineReader::next_buffered_line`]. How many were taken. Saves a hot
    /// path the search for each line's end, a split-off `Bytes` and the buffer's bookkeeping
    /// per line. A traced reader lends nothing (its lines are recorded as they are taken).
    pub(crate) fn lend_buffered_lines<T>(
        &mut self,
        mut measure: impl FnMut(&[u8]) -> Option<(usize, T)>,
        mut take: impl FnMut(&[u8], T) -> bool,
    ) -> usize {
        if self.eof || self.tap.is_some() {
            return 0;
        }
        let (mut end, mut taken) = (0, 0);
        while let Some((n, found)) = measure(&self.buf[end..])
            && let Some((line, next)) = self.decoder.framed_at(&self.buf, end, n)
        {
            end = next;
            taken += 1;
            if !take(line, found) {
                break;
            }
        }
        if taken > 0 {
            self.decoder.consume(&mut self.buf, end);
            self.taken(end);
        }
        taken
    }

    /// Bytes buffered, for tests of what a reader holds.
    #[cfg(test)]
    pub(super) fn buffered_len(&self) -> usize {
        self.buf.len()
    }

    /// The read buffer's allocation, for tests of its release.
    #[cfg(test)]
    pub(super) fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Gives memory back after a large line. (An empty buffer is kept while bytes keep coming,
    /// and given back once a read finds none: see [`read_into`].)
    fn shrink(&mut self) {
        if self.buf.capacity() > 4 * READ_CHUNK && self.buf.len() <= READ_CHUNK {
            let rest = self.buf.split();
            self.buf = BytesMut::with_capacity(READ_CHUNK);
            self.buf.extend_from_slice(&rest);
        }
    }
}

/// A line over `max_line` counts as that limit's hit.
fn counted(e: acpd_protocol::codec::FrameError) -> acpd_protocol::codec::FrameError {
    if let acpd_protocol::codec::FrameError::Oversized { .. } = e {
        crate::metrics::get().limit_hit(crate::metrics::Limit::MaxLine);
    }
    e
}

/// The buffer a stream is read into: a pipe's default capacity, so one read takes all a
/// writer has put in the pipe (half as many reads as a 32 KiB buffer on a flood). It is above
/// acpd's `mmap` threshold, so it is mapped when a stream starts and unmapped once a read
/// finds nothing: once per burst, not per read.
const STREAM_BUFFER: usize = 64 * 1024;

/// Reads once into `buf`, at most `at_most` bytes (at least 1). A reader that waits holds no
/// buffer: when a read finds nothing and `buf` is empty, its allocation is given back before
/// the poll returns, and the bytes that wake it land in a buffer on the stack of the poll that
/// finds them, then only what arrived is copied into a new one (reserving one before waiting
/// kept 16 KiB per idle child, resident wherever it landed on a reused heap page). While bytes
/// keep coming the buffer is kept and read into directly: taking and freeing it for every read
/// cost a stream a copy and two trips through the allocator per read. Cancel-safe: bytes read
/// are in `buf` before the poll returns.
pub(crate) async fn read_into<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    at_most: usize,
) -> std::io::Result<usize> {
    let at_most = at_most.max(1);
    std::future::poll_fn(|cx| {
        // A stream's buffer, or a line that is still arriving: read straight into it.
        if buf.capacity() >= READ_CHUNK || !buf.is_empty() {
            buf.reserve(READ_CHUNK);
            let polled = if buf.capacity() - buf.len() > at_most {
                // A budgeted line's room ends before the buffer's does.
                let mut capped = tokio::io::AsyncReadExt::take(&mut *reader, at_most as u64);
                tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut capped), cx, buf)
            } else {
                tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut *reader), cx, buf)
            };
            if polled.is_pending() && buf.is_empty() {
                *buf = BytesMut::new();
            }
            return polled;
        }
        // A message at a time: what the last read allocated is given back, and what arrives
        // next gets an allocation of its own size (not a stream's buffer per message).
        *buf = BytesMut::new();
        let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK];
        let stack = &mut stack[..at_most.min(READ_CHUNK)];
        let mut read = tokio::io::ReadBuf::uninit(stack);
        std::pin::Pin::new(&mut *reader)
            .poll_read(cx, &mut read)
            .map_ok(|()| {
                let n = read.filled().len();
                // A full stack buffer: more is likely waiting, so room for a larger read next.
                buf.reserve(if n == READ_CHUNK { STREAM_BUFFER } else { n });
                buf.extend_from_slice(read.filled());
                n
            })
    })
    .await
}

/// A framed line as a message, its lone surrogates replaced ([`unicode_escapes`]).
pub(crate) fn parse(line: Result<Bytes, LineFault>) -> Result<Message, LineFault> {
    Ok(envelope::parse(&unicode_escapes(line?))?)
}

/// `line` with every lone surrogate escape (`\ud800`) in its params or result replaced by
/// `\ufffd`, so what acpd reads, and passes on, is Unicode a typed reader decodes (see
/// `envelope::surrogates` for why replaced, not refused). The `id` is left as written: it is
/// echoed to its sender, who matches it byte for byte. Costs a `\u` search on a line; looks
/// further only at one with a lone surrogate, and copies only such a line. Every line acpd
/// parses whole goes through it ([`parse`]); the relay's hot path, which does not, declines a
/// text that holds one.
pub(crate) fn unicode_escapes(line: Bytes) -> Bytes {
    if memchr::memmem::find(&line, b"\\u").is_none()
        || envelope::lone_surrogates(&line).next().is_none()
    {
        return line;
    }
    let value = match envelope::parse_ref(&line) {
        Ok(
            MessageRef::Request {
                params: Some(v), ..
            }
            | MessageRef::Notification {
                params: Some(v), ..
            }
            | MessageRef::Response { outcome: Ok(v), .. },
        ) => v.get(),
        // An error, whose `data` is passed on as written: replaced throughout (the ids acpd
        // matches answers by are its own, which hold none). Not a message as it is (an
        // error's message or a method with a lone half does not decode): replaced
        // throughout, it may be one (its id was unreadable either way).
        Ok(MessageRef::Response {
            outcome: Err(_), ..
        })
        | Err(_) => {
            return envelope::replace_lone_surrogates(&line).map_or(line, Bytes::from);
        }
        // Nothing to replace but in the id.
        Ok(_) => return line,
    };
    let at = (value.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize);
    let Some(fixed) = envelope::replace_lone_surrogates(value.as_bytes()) else {
        return line;
    };
    let mut out = line.to_vec();
    if let Some(span) = out.get_mut(at..at + fixed.len()) {
        span.copy_from_slice(&fixed);
    }
    tracing::debug!("replaced a lone surrogate escape in a line read with \\ufffd");
    Bytes::from(out)
}

/// Sleeps until `deadline`, or forever without one: a `select!` branch for an optional timer.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
