//! A child's stderr: logged line by line with its run, and a bounded tail kept for the failure
//! log. It never reaches a result, an output or a diagnostic.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use acpd_protocol::codec::{FrameError, LineDecoder};
use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use tokio::process::ChildStderr;

const TAIL_LINES: usize = 40;
const MAX_LINE: usize = 1024;

#[derive(Clone, Default)]
pub struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Cancelled once stderr reached its end: every line the child wrote is in the tail.
    ended: tokio_util::sync::CancellationToken,
}

impl StderrTail {
    /// Starts draining `stderr`; `label` names the run in the log. Lines are framed with a
    /// cap, so a child that writes one endless line cannot grow acpd's memory.
    /// Reads the child's stderr to its end, keeping the last lines (and tracing each in
    /// `trace`).
    pub fn drain(
        mut stderr: ChildStderr,
        label: String,
        trace: Option<std::sync::Arc<crate::trace::Trace>>,
    ) -> Self {
        let tail = StderrTail::default();
        let lines = tail.lines.clone();
        let ended = tail.ended.clone();
        tokio::spawn(async move {
            let _ended = ended.drop_guard();
            let mut decoder = LineDecoder::new(MAX_LINE);
            // Held for the child's whole life, and most children write little: one line's worth
            // (it grows if a read brings more).
            let mut buf = BytesMut::with_capacity(MAX_LINE);
            let mut eof = false;
            while !eof {
                eof = matches!(stderr.read_buf(&mut buf).await, Ok(0) | Err(_));
                loop {
                    let item = if eof {
                        decoder.decode_eof(&mut buf)
                    } else {
                        decoder.decode(&mut buf)
                    };
                    let Some(item) = item else { break };
                    let line = match item {
                        Ok(line) => String::from_utf8_lossy(&line).into_owned(),
                        Err(FrameError::Oversized { limit }) => {
                            format!("<a line over {limit} bytes, dropped>")
                        }
                        Err(FrameError::NotUtf8) => {
                            "<a line that is not UTF-8, dropped>".to_string()
                        }
                    };
                    tracing::debug!(target: "acpd::child", run = %label, "stderr: {line}");
                    if let Some(trace) = &trace {
                        trace.note(crate::trace::Hop::Stderr, &line);
                    }
                    let mut q = lines.lock().unwrap_or_else(|p| p.into_inner());
                    if q.len() == TAIL_LINES {
                        q.pop_front();
                    }
                    q.push_back(line);
                }
            }
        });
        tail
    }

    /// Waits up to `limit` for stderr's end (a child that just exited has usually closed it).
    pub async fn ended_within(&self, limit: std::time::Duration) {
        let _ = tokio::time::timeout(limit, self.ended.cancelled()).await;
    }

    /// The last lines, oldest first.
    pub fn snapshot(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}
