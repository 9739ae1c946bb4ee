//! A child's stderr: logged line by line with its run, a bounded tail kept for the failure
//! log, and — in `acpd stdio` (`child_stderr = "forward"`) — copied to acpd's own stderr, where
//! an editor that launched acpd shows it in its log as it would the agent's. It never reaches
//! a result, an output or a diagnostic.
//!
//! Reading never waits on anything but the child: a forwarded line goes through a bounded
//! queue to one writer thread, and when acpd's stderr is slower than the children (nobody
//! reads it, or a child floods) lines are dropped and the count is written in their place.

use std::collections::VecDeque;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncRead as _;
use tokio::process::ChildStderr;

const TAIL_LINES: usize = 40;
/// A tail line's cap: the tail is for a failure's log line, not the whole story.
const TAIL_LINE: usize = 1024;
/// A line's cap; the rest of a longer line is cut (and counted). Below `PIPE_BUF`, so a
/// forwarded line is one atomic write that acpd's own log lines cannot split.
const MAX_LINE: usize = 3072;
/// Forwarded lines waiting for acpd's stderr, at most.
const FORWARD_QUEUE: usize = 256;

/// The config's `child_stderr` key: where children's stderr goes besides the log and tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChildStderrMode {
    /// Also to acpd's own stderr, line by line (the default of `acpd stdio`).
    Forward,
    /// Only to acpd's log at debug level and the failure tail (the default of `acpd serve`).
    Log,
}

#[derive(Clone, Default)]
pub(crate) struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Cancelled once stderr reached its end: every line the child wrote is in the tail.
    ended: tokio_util::sync::CancellationToken,
}

impl StderrTail {
    /// Starts draining `stderr`; `label` names the run in the log. Reads the child's stderr
    /// to its end, keeping the last lines, tracing each in `trace`, and forwarding each when
    /// [`forward_child_stderr`] was called. Lines are cut at a cap, so a child that writes one
    /// endless line cannot grow acpd's memory.
    pub(crate) fn drain(
        mut stderr: ChildStderr,
        label: String,
        trace: Option<std::sync::Arc<crate::trace::Trace>>,
    ) -> Self {
        let tail = StderrTail::default();
        let lines = tail.lines.clone();
        let ended = tail.ended.clone();
        tokio::spawn(async move {
            let _ended = ended.drop_guard();
            let mut splitter = Splitter::default();
            let mut emit = |line: String| {
                tracing::debug!(target: "acpd::child", run = %label, "stderr: {line}");
                if let Some(trace) = &trace {
                    trace.note(crate::trace::Hop::Stderr, &line);
                }
                let tail_line = cut(&line, TAIL_LINE);
                if let Some(forward) = FORWARD.get() {
                    forward.send(line);
                }
                let mut q = lines.lock().unwrap_or_else(|p| p.into_inner());
                if q.len() == TAIL_LINES {
                    q.pop_front();
                }
                q.push_back(tail_line);
            };
            loop {
                // The bytes land on the stack of the poll that finds them: a quiet child's
                // stderr holds no buffer (a 4 KiB one per idle child before).
                let read = std::future::poll_fn(|cx| {
                    let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
                    let mut read = tokio::io::ReadBuf::uninit(&mut stack);
                    std::pin::Pin::new(&mut stderr)
                        .poll_read(cx, &mut read)
                        .map_ok(|()| {
                            splitter.push(read.filled(), &mut emit);
                            read.filled().len()
                        })
                })
                .await;
                if !matches!(read, Ok(1..)) {
                    break;
                }
            }
            splitter.finish(&mut emit);
        });
        tail
    }

    /// Waits up to `limit` for stderr's end (a child that just exited has usually closed it).
    pub(crate) async fn ended_within(&self, limit: std::time::Duration) {
        let _ = tokio::time::timeout(limit, self.ended.cancelled()).await;
    }

    /// The last lines, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// `line` cut to at most `max` bytes on a character boundary.
fn cut(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_owned();
    }
    format!("{} [cut]", acpd_protocol::utf8::head(line, max))
}

/// Splits bytes into lines (`\n`, a trailing `\r` dropped), each at most [`MAX_LINE`] bytes:
/// the head of a longer line is kept and the rest counted. Invalid UTF-8 is replaced, not
/// dropped: stderr is for people.
#[derive(Default)]
struct Splitter {
    line: Vec<u8>,
    /// Bytes of the current line beyond the cap.
    over: usize,
}

impl Splitter {
    fn push(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(String)) {
        while !bytes.is_empty() {
            let (part, newline) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], true),
                None => (bytes, false),
            };
            let room = MAX_LINE - self.line.len();
            let kept = part.len().min(room);
            self.line.extend_from_slice(&part[..kept]);
            self.over += part.len() - kept;
            bytes = &bytes[part.len() + usize::from(newline)..];
            if newline {
                self.emit(emit);
            }
        }
    }

    fn finish(&mut self, emit: &mut impl FnMut(String)) {
        if !self.line.is_empty() || self.over > 0 {
            self.emit(emit);
        }
    }

    fn emit(&mut self, emit: &mut impl FnMut(String)) {
        if self.line.last() == Some(&b'\r') && self.over == 0 {
            self.line.pop();
        }
        let mut text = String::from_utf8_lossy(&self.line).into_owned();
        if self.over > 0 {
            text.push_str(&format!(" [{} more bytes cut]", self.over));
        }
        self.line.clear();
        self.over = 0;
        emit(text);
    }
}

/// The writer of forwarded lines, once [`forward_child_stderr`] started it.
static FORWARD: OnceLock<Forward> = OnceLock::new();

struct Forward {
    queue: SyncSender<String>,
    /// Lines dropped since the writer last wrote: the queue was full.
    dropped: Arc<AtomicU64>,
    /// Lines queued and not yet written, for [`flush_child_stderr`].
    pending: Arc<(Mutex<usize>, Condvar)>,
}

impl Forward {
    fn send(&self, line: String) {
        *self.pending.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        match self.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.written(1);
            }
            // The writer is gone (acpd's stderr failed): nothing can be shown any more.
            Err(TrySendError::Disconnected(_)) => self.written(1),
        }
    }

    fn written(&self, n: usize) {
        let (lock, changed) = &*self.pending;
        let mut pending = lock.lock().unwrap_or_else(|p| p.into_inner());
        *pending = pending.saturating_sub(n);
        changed.notify_all();
    }
}

/// Makes every child's stderr lines also go to acpd's stderr from now on (`child_stderr =
/// "forward"`). Idempotent. The writer is a thread of its own: a write to a stderr nobody
/// reads blocks it, never the runtime.
pub(crate) fn forward_child_stderr() {
    let _ = FORWARD.get_or_init(|| {
        let (queue, lines) = std::sync::mpsc::sync_channel(FORWARD_QUEUE);
        let forward = Forward {
            queue,
            dropped: Arc::new(AtomicU64::new(0)),
            pending: Arc::new((Mutex::new(0), Condvar::new())),
        };
        let dropped = forward.dropped.clone();
        let pending = forward.pending.clone();
        let spawned = std::thread::Builder::new()
            .name("acpd-stderr".into())
            .spawn(move || write_forwarded(&lines, &dropped, &pending));
        if let Err(e) = spawned {
            tracing::warn!("cannot forward child stderr (no writer thread: {e}); it is logged");
        }
        forward
    });
}

fn write_forwarded(
    lines: &Receiver<String>,
    dropped: &AtomicU64,
    pending: &(Mutex<usize>, Condvar),
) {
    let done = |n: usize| {
        let mut p = pending.0.lock().unwrap_or_else(|p| p.into_inner());
        *p = p.saturating_sub(n);
        pending.1.notify_all();
    };
    let mut out = Vec::with_capacity(MAX_LINE + 64);
    while let Ok(line) = lines.recv() {
        out.clear();
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let _ = writeln!(
                out,
                "acpd: {lost} line(s) of child stderr dropped: acpd's stderr was not read fast enough"
            );
        }
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        let written = std::io::stderr().lock().write_all(&out);
        done(1);
        if written.is_err() {
            // stderr is closed or broken: stop; senders now drop their lines.
            return;
        }
    }
}

/// Waits up to `limit` for the forwarded lines already queued to be written (at exit, so
/// the last lines a child wrote before acpd stopped are not lost in the queue).
pub(crate) fn flush_child_stderr(limit: Duration) {
    let Some(forward) = FORWARD.get() else {
        return;
    };
    let (lock, changed) = &*forward.pending;
    let pending = lock.lock().unwrap_or_else(|p| p.into_inner());
    let _ = changed.wait_timeout_while(pending, limit, |n| *n > 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| out.push(l));
        }
        s.finish(&mut |l| out.push(l));
        out
    }

    #[test]
    fn lines_split_across_reads_and_crlf() {
        assert_eq!(
            split(&[b"one\r\ntw", b"o\n\nthree"]),
            ["one", "two", "", "three"]
        );
    }

    #[test]
    fn a_long_line_keeps_its_head_and_counts_the_rest() {
        let long = vec![b'x'; MAX_LINE + 10];
        let out = split(&[&long, b"\nnext\n"]);
        assert_eq!(out.len(), 2);
        assert!(out[0].starts_with(&"x".repeat(MAX_LINE)));
        assert!(out[0].ends_with(" [10 more bytes cut]"), "{}", out[0]);
        assert_eq!(out[1], "next");
    }

    #[test]
    fn invalid_utf8_is_replaced_and_tail_lines_cut_on_a_boundary() {
        assert_eq!(split(&[b"a\xffb\n"]), ["a\u{fffd}b"]);
        let s = "é".repeat(TAIL_LINE);
        let c = cut(&s, TAIL_LINE + 1);
        assert!(c.ends_with(" [cut]") && c.len() <= TAIL_LINE + 7, "{c}");
    }
}
