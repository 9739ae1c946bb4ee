//! A child's stderr: logged line by line with its run, and a bounded tail kept for the failure
//! log. It never reaches a result, an output or a diagnostic.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;

const TAIL_LINES: usize = 40;
const MAX_LINE: usize = 1024;

#[derive(Clone, Default)]
pub struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
}

impl StderrTail {
    /// Starts draining `stderr`; `label` names the run in the log.
    pub fn drain(stderr: ChildStderr, label: String) -> Self {
        let tail = StderrTail::default();
        let lines = tail.lines.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let mut line = String::from_utf8_lossy(&buf).trim_end().to_string();
                if line.len() > MAX_LINE {
                    let mut cut = MAX_LINE;
                    while !line.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    line.truncate(cut);
                }
                tracing::debug!(target: "acpd::child", run = %label, "stderr: {line}");
                let mut q = lines.lock().unwrap_or_else(|p| p.into_inner());
                if q.len() == TAIL_LINES {
                    q.pop_front();
                }
                q.push_back(line);
            }
        });
        tail
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
