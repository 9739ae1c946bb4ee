//! The pump between the editor's stdio and the server's WebSocket: each stdin line one text
//! frame, each text frame one stdout line. Everything is held one message at a time: a stdout
//! that is not read stops the reading of frames (the server's send buffer then fills, and it
//! applies its own limit), and a server that does not read stops the reading of stdin.

use std::cell::Cell;
use std::time::Duration;

use acpd_protocol::codec::{FrameError, LineDecoder};
use bytes::{Bytes, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message, Utf8Bytes};

use super::{MAX_MESSAGE, Ws};
use crate::runtime::{Reader, Writer};

/// How often a ping goes to the server (what keeps NATs and proxies from dropping an idle
/// connection), and how long a silent server is waited for before the connection counts as
/// lost (three pings unanswered).
const PING_EVERY: Duration = Duration::from_secs(15);
const SILENT_FOR: Duration = Duration::from_secs(45);
/// Once stdin has ended: how long the answers to the requests already sent are waited for
/// before the close frame goes (a WebSocket has no half-close: the server answers nothing
/// after it), and then how long the server's close is waited for.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// The most request ids waited for at the end (an editor that never reads its answers cannot
/// grow the set past it).
const PENDING_MAX: usize = 4096;
/// How long `--provider`'s answer is waited for.
const PROVIDER_WAIT: Duration = Duration::from_secs(30);
/// The read size from stdin.
const READ_CHUNK: usize = 64 * 1024;

/// How a bridge ended.
#[derive(Debug)]
pub(super) enum Bridged {
    /// The editor closed stdin, then the server closed (or did not within [`CLOSE_WAIT`]).
    Done,
    /// The editor closed stdout (it is gone; nobody is left to tell).
    EditorGone,
    /// The server closed or the connection broke while the editor was still there.
    ServerGone(String),
}

/// Copies stdin lines to text frames and text frames to stdout lines until the connection
/// ends; pings the server every [`PING_EVERY`].
pub(super) async fn bridge(ws: Ws, stdin: Reader, mut stdout: Writer) -> Bridged {
    let (mut sink, mut frames) = ws.split();
    let editor_done = Cell::new(false);
    let pending = Pending::default();
    // A stdin line the codec refused, answered on stdout as the daemon answers it on its
    // socket (−32700); at most a few wait while a frame is being written.
    let (faults, mut faulted) = tokio::sync::mpsc::channel::<String>(4);
    let upstream = async {
        let mut lines = Lines::new(stdin);
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = tokio::select! {
                line = lines.next() => match line {
                    None => break,
                    Some(Ok(text)) => {
                        pending.sent(&text);
                        Message::Text(text)
                    }
                    Some(Err(e)) => {
                        let _ = faults.send(fault_line(&e)).await;
                        continue;
                    }
                },
                _ = ping.tick() => Message::Ping(Bytes::new()),
            };
            if let Err(e) = sink.send(message).await {
                return Some(e.to_string());
            }
        }
        editor_done.set(true);
        let _ = tokio::time::timeout(CLOSE_WAIT, pending.drained()).await;
        let bye = CloseFrame {
            code: CloseCode::Normal,
            reason: "the editor closed its input".into(),
        };
        let _ = sink.send(Message::Close(Some(bye))).await;
        None
    };
    let downstream = async {
        let mut closed_with = None;
        let mut binary_seen = false;
        loop {
            let next = tokio::select! {
                Some(line) = faulted.recv() => {
                    if write_line(&mut stdout, &line).await.is_err() {
                        return Bridged::EditorGone;
                    }
                    continue;
                }
                next = tokio::time::timeout(SILENT_FOR, frames.next()) => next,
            };
            let frame = match next {
                Err(_) => {
                    return Bridged::ServerGone(format!(
                        "nothing came from it for {}, not even an answer to a ping: the \
                         connection is lost",
                        humantime::format_duration(SILENT_FOR)
                    ));
                }
                Ok(None)
                | Ok(Some(Err(
                    tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
                ))) => return ended(editor_done.get(), closed_with),
                // After a close frame (either way) the server may drop TCP without TLS's
                // close_notify: the connection ended as agreed, not broken.
                Ok(Some(Err(_))) if editor_done.get() || closed_with.is_some() => {
                    return ended(editor_done.get(), closed_with);
                }
                Ok(Some(Err(e))) => return Bridged::ServerGone(broken(&e)),
                Ok(Some(Ok(frame))) => frame,
            };
            match frame {
                Message::Text(text) => {
                    pending.answered(&text);
                    if write_line(&mut stdout, &text).await.is_err() {
                        return Bridged::EditorGone;
                    }
                }
                Message::Binary(bytes) if !binary_seen => {
                    binary_seen = true;
                    errln!(
                        "acpd: warning: the server sent a binary frame ({} bytes); ignored, as \
                         are any more (ACP over WebSocket is text frames)",
                        bytes.len()
                    );
                }
                Message::Close(frame) => closed_with = Some(close_reason(frame.as_ref())),
                Message::Binary(_) | Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
    };
    tokio::pin!(downstream);
    tokio::select! {
        ended = &mut downstream => ended,
        failed = upstream => {
            // Stdin ended (and the close is sent), or a write failed: the server's last
            // frames and its close are still read, for a bounded time.
            match tokio::time::timeout(CLOSE_WAIT, &mut downstream).await {
                Ok(ended) => ended,
                Err(_) => match failed {
                    None => Bridged::Done,
                    Some(why) => Bridged::ServerGone(why),
                },
            }
        }
    }
}

/// The ids of the editor's requests not answered yet, so that an editor that writes a request
/// and closes stdin (`echo … | acpd connect --url`) still gets its answer, as over the socket.
/// A frame is parsed for its id only while some request is outstanding.
#[derive(Default)]
struct Pending {
    ids: std::cell::RefCell<std::collections::HashSet<String>>,
    answered: tokio::sync::Notify,
}

/// The parts of a JSON-RPC message that tell a request or an answer, and its id.
#[derive(serde::Deserialize)]
struct Head {
    id: Option<serde_json::Value>,
    method: Option<serde::de::IgnoredAny>,
}

impl Pending {
    fn sent(&self, line: &str) {
        let mut ids = self.ids.borrow_mut();
        if ids.len() >= PENDING_MAX {
            return;
        }
        if let Ok(Head {
            id: Some(id),
            method: Some(_),
        }) = serde_json::from_str::<Head>(line)
            && !id.is_null()
        {
            ids.insert(id.to_string());
        }
    }

    fn answered(&self, frame: &str) {
        if self.ids.borrow().is_empty() {
            return;
        }
        if let Ok(Head {
            id: Some(id),
            method: None,
        }) = serde_json::from_str::<Head>(frame)
            && self.ids.borrow_mut().remove(&id.to_string())
        {
            self.answered.notify_one();
        }
    }

    /// Resolves once every request sent has been answered.
    async fn drained(&self) {
        while !self.ids.borrow().is_empty() {
            self.answered.notified().await;
        }
    }
}

/// How a connection the server closed ended: fine after the editor's end, else the server's
/// reason.
fn ended(editor_done: bool, closed_with: Option<String>) -> Bridged {
    if editor_done {
        return Bridged::Done;
    }
    Bridged::ServerGone(
        closed_with.unwrap_or_else(|| "it closed the connection without a close frame".into()),
    )
}

/// `it closed the connection (1008 policy): <reason>`, the reason's controls escaped.
fn close_reason(frame: Option<&CloseFrame>) -> String {
    match frame {
        None => "it closed the connection (no reason given)".into(),
        Some(f) if f.reason.is_empty() => {
            format!("it closed the connection ({})", u16::from(f.code))
        }
        Some(f) => format!(
            "it closed the connection ({}): {}",
            u16::from(f.code),
            super::super::daemon::shown(&f.reason)
        ),
    }
}

/// What broke the connection, for the user.
fn broken(error: &tungstenite::Error) -> String {
    match error {
        tungstenite::Error::Capacity(e) => format!(
            "it sent a message over the {MAX_MESSAGE}-byte limit ({e}); the connection was \
             dropped"
        ),
        tungstenite::Error::Io(e) => format!("the connection broke ({e})"),
        other => format!("the connection failed ({other})"),
    }
}

/// Writes one frame as one line: a raw CR or LF inside it can only be JSON whitespace, so it
/// becomes a space and the line stays one message.
async fn write_line(stdout: &mut Writer, text: &str) -> std::io::Result<()> {
    if text.contains(['\r', '\n']) {
        let flat = text.replace(['\r', '\n'], " ");
        stdout.write_all(flat.as_bytes()).await?;
    } else {
        stdout.write_all(text.as_bytes()).await?;
    }
    stdout.write_all(b"\n").await?;
    stdout.flush().await
}

/// The −32700 answer (id null) to a stdin line the codec refused.
fn fault_line(error: &FrameError) -> String {
    let error = acpd_protocol::envelope::RpcError::from_frame(error);
    serde_json::json!({"jsonrpc": "2.0", "id": null, "error": error}).to_string()
}

/// Stdin as capped lines: one too long or not UTF-8 is an error for that line alone.
struct Lines {
    reader: Reader,
    decoder: LineDecoder,
    buf: BytesMut,
    eof: bool,
}

impl Lines {
    fn new(reader: Reader) -> Self {
        Lines {
            reader,
            decoder: LineDecoder::new(MAX_MESSAGE),
            buf: BytesMut::new(),
            eof: false,
        }
    }

    /// The next line as a frame's text; `None` at the end of stdin (or a read error).
    /// Cancel-safe: what was read stays in `self`.
    async fn next(&mut self) -> Option<Result<Utf8Bytes, FrameError>> {
        loop {
            let item = if self.eof {
                self.decoder.decode_eof(&mut self.buf)
            } else {
                self.decoder.decode(&mut self.buf)
            };
            if let Some(item) = item {
                return Some(
                    item.and_then(|line| {
                        Utf8Bytes::try_from(line).map_err(|_| FrameError::NotUtf8)
                    }),
                );
            }
            if self.eof {
                return None;
            }
            self.buf.reserve(READ_CHUNK);
            match self.reader.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(_) => {}
            }
        }
    }
}

/// `acpd connect --url … --provider NAME`: `_acpd/connect` as the first frame, and its answer
/// judged as over the socket. `Err` is the exit code, the reason on stderr.
pub(super) async fn choose_provider(ws: &mut Ws, name: &str) -> Result<(), u8> {
    let request = crate::cli::connect_provider::provider_request(name);
    let exchange = async {
        ws.send(Message::text(request))
            .await
            .map_err(|e| broken(&e))?;
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(answer))) => return Ok(Some(answer)),
                Some(Ok(Message::Close(frame))) => {
                    return Err(close_reason(frame.as_ref()));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(broken(&e)),
                None => return Ok(None),
            }
        }
    };
    let answer = match tokio::time::timeout(PROVIDER_WAIT, exchange).await {
        Ok(Ok(Some(answer))) => answer,
        Ok(Ok(None)) => {
            errln!("acpd: the server closed the connection before answering --provider");
            return Err(1);
        }
        Ok(Err(why)) => {
            errln!("acpd: cannot tell the server the provider: {why}");
            return Err(1);
        }
        Err(_) => {
            errln!(
                "acpd: the server did not answer --provider within {}",
                humantime::format_duration(PROVIDER_WAIT)
            );
            return Err(1);
        }
    };
    crate::cli::connect_provider::judge_provider_answer(answer.as_bytes())
}
