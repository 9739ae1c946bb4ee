//! `acpd mcp`'s stdio transport: every line is screened before rmcp sees it, because rmcp's
//! own transport drops a line it cannot parse without a word (a non-JSON line, a request nested
//! deeper than serde_json's recursion limit, a known method with params of the wrong shape) or
//! answers it without an `id` — and the client waits for its answer forever. Here each such
//! line gets a JSON-RPC error carrying the request's `id` when one can be read from it (null
//! otherwise): −32700 for a line that is not JSON, −32600 for one nested too deep or not a
//! JSON-RPC message, −32602 for a request whose params do not fit its method.

use std::borrow::Cow;

use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The longest line read (rmcp's own default): longer ones are answered and skipped.
const MAX_LINE: usize = 16 * 1024 * 1024;
/// serde_json's recursion limit: a line nested this deep cannot be parsed at all.
const MAX_DEPTH: usize = 128;
/// Lines queued toward stdout; a client that stops reading stops this process reading it.
const OUT_DEPTH: usize = 64;
/// How long closing waits for queued lines to reach stdout.
const CLOSE_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

/// What one input line is.
#[derive(Debug)]
enum Screened {
    /// A message rmcp can take.
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// Answered here: the error response to write.
    Answer(Value),
    /// Nothing to do (a blank line, a notification or response rmcp cannot read).
    Skip,
}

/// The transport handed to rmcp: a reader task screening stdin, a writer task owning stdout.
pub(super) struct Screening {
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    out: Option<mpsc::Sender<Vec<u8>>>,
    reader: JoinHandle<()>,
    writer: Option<JoinHandle<()>>,
}

impl Screening {
    pub(super) fn new<R, W>(reader: R, writer: W) -> Screening
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out_tx, out_rx) = mpsc::channel(OUT_DEPTH);
        let (in_tx, in_rx) = mpsc::channel(OUT_DEPTH);
        Screening {
            incoming: in_rx,
            reader: tokio::spawn(read_loop(BufReader::new(reader), in_tx, out_tx.clone())),
            writer: Some(tokio::spawn(write_loop(writer, out_rx))),
            out: Some(out_tx),
        }
    }
}

impl Drop for Screening {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Transport<RoleServer> for Screening {
    type Error = std::io::Error;

    fn name() -> Cow<'static, str> {
        "acpd-screened-stdio".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let gone = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed");
            out.ok_or_else(gone)?.send(line).await.map_err(|_| gone())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        // `recv` is cancel-safe: rmcp polls this inside a select.
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        self.out = None;
        if let Some(writer) = self.writer.take() {
            let _ = tokio::time::timeout(CLOSE_FLUSH, writer).await;
        }
        Ok(())
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(mut writer: W, mut lines: mpsc::Receiver<Vec<u8>>) {
    while let Some(line) = lines.recv().await {
        if writer.write_all(&line).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: BufReader<R>,
    incoming: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    out: mpsc::Sender<Vec<u8>>,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        let screened = match read_line(&mut reader, &mut line).await {
            Ok(Line::Eof) | Err(_) => return,
            Ok(Line::Whole) => screen(&line),
            Ok(Line::TooLong) => Screened::Answer(error(
                Value::Null,
                INVALID_REQUEST,
                format!("line longer than {MAX_LINE} bytes; skipped"),
            )),
        };
        match screened {
            Screened::Message(message) => {
                if incoming.send(*message).await.is_err() {
                    return;
                }
            }
            Screened::Answer(answer) => {
                tracing::debug!("answered an unusable line: {answer}");
                let mut bytes = answer.to_string().into_bytes();
                bytes.push(b'\n');
                if out.send(bytes).await.is_err() {
                    return;
                }
            }
            Screened::Skip => {}
        }
    }
}

enum Line {
    Whole,
    TooLong,
    Eof,
}

/// One line into `line` (without its newline; a last line without one counts), at most
/// [`MAX_LINE`] bytes kept: the rest of a longer one is read and dropped.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<Line> {
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::Eof,
                (false, false) => Line::Whole,
            });
        }
        let (take, done) = match memchr::memchr(b'\n', available) {
            Some(at) => (at, true),
            None => (available.len(), false),
        };
        if !too_long {
            if line.len() + take > MAX_LINE {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(&available[..take]);
            }
        }
        reader.consume(if done { take + 1 } else { take });
        if done {
            return Ok(if too_long { Line::TooLong } else { Line::Whole });
        }
    }
}

fn error(id: Value, code: i64, message: String) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

/// What to do with one line.
fn screen(line: &[u8]) -> Screened {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let line = line.trim_ascii();
    if line.is_empty() {
        return Screened::Skip;
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            let outline = outline(line);
            let id = outline.id.unwrap_or(Value::Null);
            return Screened::Answer(if outline.depth >= MAX_DEPTH {
                error(
                    id,
                    INVALID_REQUEST,
                    format!(
                        "Invalid Request: nested deeper than {MAX_DEPTH} levels, which this \
                         server cannot read; flatten the params"
                    ),
                )
            } else {
                error(id, PARSE_ERROR, format!("Parse error: {e}"))
            });
        }
    };
    let Some(object) = value.as_object() else {
        return Screened::Answer(error(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: a message is one JSON object (batches are not supported)".into(),
        ));
    };
    // Echoed only when it is an id JSON-RPC allows.
    let id = object
        .get("id")
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .cloned();
    let method = object.get("method").and_then(Value::as_str);
    match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line) {
        Ok(message) => match (misread_as_custom(&message), id) {
            (Some(why), Some(id)) => Screened::Answer(error(id, INVALID_PARAMS, why)),
            _ => Screened::Message(Box::new(message)),
        },
        Err(e) => match (method, id) {
            (Some(method), Some(id)) => Screened::Answer(error(
                id,
                INVALID_PARAMS,
                format!("Invalid params for {method}: {e}"),
            )),
            // A notification, or a response to us, that does not parse: nobody waits.
            (Some(_), None) if !object.contains_key("id") => Screened::Skip,
            (None, _) if object.contains_key("result") || object.contains_key("error") => {
                Screened::Skip
            }
            (_, id) => Screened::Answer(error(
                id.unwrap_or(Value::Null),
                INVALID_REQUEST,
                format!("Invalid Request: {e}"),
            )),
        },
    }
}

/// The MCP requests rmcp reads into a typed request: one of these that reaches rmcp as a
/// custom request had params that did not fit (rmcp falls back to its catch-all variant, then
/// answers "method not found", −32601, for a method it does know).
const TYPED_REQUESTS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/directory/read",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "skills/list",
    "skills/get",
];

/// Why a request of a known method was read as a custom one (its params do not fit its
/// method: −32602), with serde's reason for `tools/call`; None for any other message.
fn misread_as_custom(message: &RxJsonRpcMessage<RoleServer>) -> Option<String> {
    let rmcp::model::JsonRpcMessage::Request(request) = message else {
        return None;
    };
    let rmcp::model::ClientRequest::CustomRequest(custom) = &request.request else {
        return None;
    };
    let method = custom.method.as_str();
    if !TYPED_REQUESTS.contains(&method) {
        return None;
    }
    let reason = match method {
        "tools/call" => custom
            .params_as::<rmcp::model::CallToolRequestParams>()
            .err()
            .map_or_else(
                || "they do not fit its schema".to_string(),
                |e| e.to_string(),
            ),
        _ => "they do not fit its schema".to_string(),
    };
    Some(format!("Invalid params for {method}: {reason}"))
}

/// What a line that does not parse still tells: how deep it nests, and the top-level `id`
/// (a string or a number), read without recursion.
#[derive(Debug, Default, PartialEq)]
struct Outline {
    depth: usize,
    id: Option<Value>,
}

fn outline(bytes: &[u8]) -> Outline {
    let mut out = Outline::default();
    let mut depth = 0usize;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                let end = string_end(bytes, at);
                if depth == 1 && out.id.is_none() && &bytes[at..end] == b"\"id\"" {
                    out.id = value_after_colon(bytes, end);
                }
                at = end;
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                out.depth = out.depth.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        at += 1;
    }
    out
}

/// The index just past the string starting at `start` (a quote), or the end of the input.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut at = start + 1;
    while at < bytes.len() {
        match bytes[at] {
            b'\\' => at += 2,
            b'"' => return at + 1,
            _ => at += 1,
        }
    }
    bytes.len()
}

/// After a key ending at `at`: `: <string or number>`, parsed.
fn value_after_colon(bytes: &[u8], at: usize) -> Option<Value> {
    let rest = &bytes[at..];
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let len = match rest.first()? {
        b'"' => string_end(rest, 0),
        b'-' | b'0'..=b'9' => rest
            .iter()
            .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
            .unwrap_or(rest.len()),
        _ => return None,
    };
    let id: Value = serde_json::from_slice(rest.get(..len)?).ok()?;
    (id.is_string() || id.is_i64() || id.is_u64()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &str) -> Value {
        match screen(line.as_bytes()) {
            Screened::Answer(v) => v,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn unusable_lines_are_answered_with_their_id() {
        let v = answer("not json");
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (Value::Null, json!(-32700))
        );
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":"x7","method":"tools/call","params":{{"name":"subagent_list","arguments":{{"a":{}{}}}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let v = answer(&deep);
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (json!("x7"), json!(-32600))
        );
        let v = answer(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":7}"#);
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (json!(5), json!(-32602))
        );
        let v = answer(r#"{"foo":"bar"}"#);
        assert_eq!(v["id"], Value::Null);
        assert!(v.as_object().unwrap().contains_key("id"));
        let v = answer(r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#);
        assert_eq!(
            (v["id"].clone(), v["error"]["code"].clone()),
            (Value::Null, json!(-32600))
        );
        let v = answer("[1,2]");
        assert_eq!(v["error"]["code"], json!(-32600));
    }

    #[test]
    fn the_outline_finds_only_the_top_level_id() {
        let o = outline(br#"{"params":{"id":9,"s":"\"id\": 3"},"id" : -12, [[["#);
        assert_eq!(o.id, Some(json!(-12)));
        assert_eq!(outline(br#"{"id":{"x":1}}"#).id, None);
        assert_eq!(outline(b"[[[[").depth, 4);
    }

    #[test]
    fn good_lines_and_unreadable_notifications_pass_or_skip() {
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Screened::Message(_)
        ));
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":3}"#),
            Screened::Skip | Screened::Message(_)
        ));
        assert!(matches!(screen(b"  \r"), Screened::Skip));
    }
}
