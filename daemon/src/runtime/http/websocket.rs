//! ACP over WebSocket on `/acp`: one JSON-RPC message per text frame each way. A binary frame
//! is refused (close 1003), a frame over `max_line` ends the connection (1009), a peer that
//! neither sends nor answers pings for `http_idle_timeout` is gone, and one that stops reading
//! is closed after acpd's `write_timeout` — each with a close reason, never a silent drop.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use super::bridge::Bridged;
use super::live::Place;

/// What one WebSocket connection is held to.
#[derive(Clone, Copy)]
pub(super) struct WsLimits {
    pub max_message: usize,
    pub keepalive: Duration,
    pub idle: Duration,
    pub write_timeout: Duration,
    pub requests_per_second: u32,
    /// How long one message may take from its first byte to its last (`line_timeout`).
    pub message_timeout: Duration,
}

/// Serves one upgraded connection until either side ends it.
pub(super) async fn serve(
    upgraded: hyper::upgrade::Upgraded,
    bridged: Bridged,
    place: Place,
    limits: WsLimits,
    rate: std::sync::Arc<super::guard::RateLimits>,
) {
    // A small read buffer: an idle connection holds it all its life (tungstenite's default is
    // 128 KiB); a large message still grows its own buffer, under the budget for unfinished
    // messages.
    let config = WebSocketConfig::default()
        .read_buffer_size(8 * 1024)
        .max_message_size(Some(limits.max_message))
        .max_frame_size(Some(limits.max_message));
    let (io, ends) = super::budgeted::Budgeted::new(TokioIo::new(upgraded), limits.message_timeout);
    let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
    let (mut sink, mut stream) = ws.split();
    let Bridged {
        to_acpd,
        mut from_acpd,
    } = bridged;
    let mut ping = tokio::time::interval(limits.keepalive);
    ping.reset();
    let mut heard = tokio::time::Instant::now();
    let close = |code: CloseCode, reason: &str| {
        Message::Close(Some(CloseFrame {
            code,
            reason: reason.to_owned().into(),
        }))
    };
    let ending: Option<Message> = loop {
        let idle_at = heard + limits.idle;
        tokio::select! {
            frame = stream.next() => {
                heard = tokio::time::Instant::now();
                if matches!(frame, Some(Ok(_))) {
                    ends.ended();
                }
                match frame {
                    Some(Ok(Message::Text(text))) => {
                        while let Err(wait) = rate.take(place_token(&place), limits.requests_per_second, std::time::Instant::now()) {
                            tokio::time::sleep(wait).await;
                        }
                        if let Err(e) = to_acpd.send(text.as_bytes(), limits.write_timeout).await {
                            break Some(close(CloseCode::Again, &format!("acpd could not take the message: {e}")));
                        }
                    }
                    Some(Ok(Message::Binary(_))) => {
                        crate::metrics::get().network_refused("binary_frame");
                        break Some(close(CloseCode::Unsupported, "binary frames are refused: send each JSON-RPC message as a text frame"));
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                    Some(Ok(Message::Close(_))) | None => break None,
                    Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(e))) => {
                        crate::metrics::get().limit_hit(crate::metrics::Limit::MaxLine);
                        break Some(close(CloseCode::Size, &format!("{e} (max_line)")));
                    }
                    Some(Err(tokio_tungstenite::tungstenite::Error::Io(e)))
                        if matches!(e.to_string().as_str(), super::budgeted::OVER_BUDGET | super::budgeted::TOO_SLOW) =>
                    {
                        let limit = if e.to_string() == super::budgeted::OVER_BUDGET {
                            "unfinished messages on all connections hold the whole budget (unfinished_message_budget)"
                        } else {
                            crate::metrics::get().network_refused("line_timeout");
                            "a message did not end within line_timeout"
                        };
                        tracing::warn!("closing a websocket: {limit}");
                        break Some(close(CloseCode::Policy, limit));
                    }
                    Some(Err(e)) => {
                        tracing::debug!("websocket read failed: {e}");
                        break None;
                    }
                }
            }
            line = from_acpd.next() => {
                let Some(line) = line else {
                    break Some(close(CloseCode::Normal, "acpd ended the connection"));
                };
                // Every line acpd has already written goes out before one flush: a burst of
                // updates is one TLS record and one write, not one per update.
                let burst = async {
                    let mut line = line;
                    loop {
                        sink.feed(text_frame(line)).await?;
                        if !from_acpd.has_line() {
                            break;
                        }
                        match from_acpd.next().await {
                            Some(next) => line = next,
                            None => break,
                        }
                    }
                    sink.flush().await
                };
                match tokio::time::timeout(limits.write_timeout, burst).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break None,
                    Err(_) => {
                        crate::metrics::get().network_refused("client_not_reading");
                        tracing::warn!("closing a websocket whose client stopped reading (write_timeout)");
                        break None;
                    }
                }
            }
            _ = ping.tick() => {
                if tokio::time::timeout(limits.write_timeout, sink.send(Message::Ping(Default::default()))).await.is_err() {
                    crate::metrics::get().network_refused("client_not_reading");
                    break None;
                }
            }
            () = tokio::time::sleep_until(idle_at) => {
                crate::metrics::get().network_refused("http_idle_timeout");
                break Some(close(CloseCode::Away, "nothing heard for http_idle_timeout"));
            }
            () = place.cancel.cancelled() => {
                break Some(close(CloseCode::Policy, "the connection's token was revoked or expired, or acpd is stopping"));
            }
        }
    };
    to_acpd.close().await;
    if let Some(message) = ending {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = sink.send(message).await;
            let _ = sink.close().await;
        })
        .await;
    }
    drop(place);
}

/// A line of acpd's as a text frame. acpd writes UTF-8 JSON only; a line that is not (never
/// expected) goes out with its bad bytes replaced rather than as a frame the client must refuse.
fn text_frame(line: bytes::Bytes) -> Message {
    match tokio_tungstenite::tungstenite::Utf8Bytes::try_from(line.clone()) {
        Ok(text) => Message::Text(text),
        Err(_) => Message::text(String::from_utf8_lossy(&line).into_owned()),
    }
}

fn place_token(place: &Place) -> i64 {
    place.token()
}
