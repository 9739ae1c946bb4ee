//! One network ACP connection as acpd's server sees it: a byte stream pair, one JSON-RPC
//! message per line, served by the same `server::serve` as a Unix-socket connection — so
//! nothing below `server/` learns which door a message came through.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::Mutex;

use crate::server::{self, ServerContext};

/// Bytes in flight between the transport and acpd's server, each way. acpd's own reader and
/// outbox bound what it holds behind this.
const PIPE: usize = 64 * 1024;

/// The transport's ends of a bridged connection.
pub(super) struct Bridged {
    pub to_acpd: ToAcpd,
    pub from_acpd: FromAcpd,
}

/// Starts `server::serve` for one network connection on `tracker`.
pub(super) fn open(ctx: ServerContext, tracker: &tokio_util::task::TaskTracker) -> Bridged {
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let (reader, writer) = tokio::io::split(theirs);
    tracker.spawn(server::serve(reader, writer, ctx));
    let (our_reader, our_writer) = tokio::io::split(ours);
    Bridged {
        to_acpd: ToAcpd(Arc::new(Mutex::new(Some(our_writer)))),
        from_acpd: FromAcpd {
            reader: BufReader::with_capacity(16 * 1024, our_reader),
            line: Vec::new(),
        },
    }
}

/// Why a message could not be handed to acpd's server.
#[derive(Debug, thiserror::Error)]
pub(super) enum ToAcpdError {
    #[error("the connection is closed")]
    Closed,
    #[error(
        "acpd did not take the message within {0:?} (write_timeout): it is busy with this connection's earlier messages"
    )]
    Stalled(Duration),
}

/// The writing end toward acpd's server: whole messages, one at a time, each on one line.
#[derive(Clone)]
pub(super) struct ToAcpd(Arc<Mutex<Option<WriteHalf<DuplexStream>>>>);

impl ToAcpd {
    /// Writes `message` as one line. JSON allows raw line breaks only as whitespace between
    /// tokens (inside strings they must be escaped), so turning them into spaces keeps every
    /// message, valid or not, on exactly one line without changing what it means.
    pub(super) async fn send(&self, message: &[u8], timeout: Duration) -> Result<(), ToAcpdError> {
        let mut line = Vec::with_capacity(message.len() + 1);
        line.extend(
            message
                .iter()
                .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
        );
        line.push(b'\n');
        let write = async {
            let mut guard = self.0.lock().await;
            let writer = guard.as_mut().ok_or(ToAcpdError::Closed)?;
            writer
                .write_all(&line)
                .await
                .map_err(|_| ToAcpdError::Closed)
        };
        tokio::time::timeout(timeout, write)
            .await
            .map_err(|_| ToAcpdError::Stalled(timeout))?
    }

    /// Ends acpd's input: the connection ends as an editor's that hung up (sessions detach).
    pub(super) async fn close(&self) {
        if let Some(mut writer) = self.0.lock().await.take() {
            let _ = writer.shutdown().await;
        }
    }
}

/// The reading end from acpd's server: each line it writes.
pub(super) struct FromAcpd {
    reader: BufReader<ReadHalf<DuplexStream>>,
    line: Vec<u8>,
}

impl FromAcpd {
    /// The next message acpd wrote (without its newline); `None` once acpd closed the
    /// connection.
    ///
    /// Cancel-safe: what a cancelled call read of a line stays in `line` for the next call
    /// (the line is cleared only once it was taken whole).
    pub(super) async fn next(&mut self) -> Option<bytes::Bytes> {
        match self.reader.read_until(b'\n', &mut self.line).await {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                if self.line.last() == Some(&b'\n') {
                    self.line.pop();
                }
                let message = bytes::Bytes::copy_from_slice(&self.line);
                self.line.clear();
                // A large answer does not keep its buffer for the rest of the connection.
                if self.line.capacity() > 1024 * 1024 {
                    self.line = Vec::new();
                }
                Some(message)
            }
        }
    }

    /// Whether a whole line is already buffered (the next [`FromAcpd::next`] will not wait):
    /// a writer takes every such line before it flushes, so a burst costs one write.
    pub(super) fn has_line(&self) -> bool {
        memchr::memchr(b'\n', self.reader.buffer()).is_some()
    }
}
