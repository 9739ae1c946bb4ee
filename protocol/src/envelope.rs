//! The JSON-RPC 2.0 envelope.
//!
//! Only the routing fields (`id`, `method`) are parsed; `params`, `result` and `error.data` stay
//! raw JSON, so a bridge forwards what it does not read without re-serialising it and without
//! losing fields (or update kinds) that ACP's typed schema does not know.

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A JSON-RPC request id. ACP peers use both numbers and strings (the SDK sends UUID strings).
///
/// An id is echoed exactly as the peer wrote it: a parsed id whose JSON text is the canonical
/// form of an `i64` (`7`, `-3`) is [`Id::Num`], one that is a string serde_json would write back
/// the same way (`"a-1"`, `"é"`) is [`Id::Str`], and every other number or string (`1.0`, `1e2`,
/// `-0`, `12345678901234567890`, `"\u0041"`) is [`Id::Raw`], which keeps its text and is
/// written back byte for byte. Two ids are equal when their JSON text is equal, so a peer that
/// echoes acpd's own `Id::Num(7)` as `7` matches it, and `"A"` and `"\u0041"` are two ids (each
/// answered with its own text).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    Num(i64),
    Str(String),
    Raw(RawId),
}

/// The JSON text of an id that is neither a canonical `i64` nor a canonically written string.
/// Only [`Id::from_json`] (and so [`parse`]) makes one, so its text is always a valid JSON number
/// or string.
#[derive(Clone)]
pub struct RawId(Box<RawValue>);

impl RawId {
    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl std::fmt::Debug for RawId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawId({})", self.0.get())
    }
}

impl PartialEq for RawId {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for RawId {}

impl std::hash::Hash for RawId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.get().hash(state)
    }
}

/// Why an id value cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("id must be a number or a string")]
    WrongType,
}

impl Id {
    /// The id written as JSON `text` (already valid JSON, such as a [`RawValue`]'s). `Ok(None)` for
    /// `null`; an object, array or boolean is [`IdError::WrongType`]. Leading and trailing JSON
    /// whitespace is not part of the id.
    pub fn from_json(text: &str) -> Result<Option<Id>, IdError> {
        let text = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        match text.as_bytes().first() {
            Some(b'"') => Ok(Some(Self::from_string_text(text)?)),
            Some(b'-' | b'0'..=b'9') => Ok(Some(Self::from_number_text(text)?)),
            Some(b'n') if text == "null" => Ok(None),
            _ => Err(IdError::WrongType),
        }
    }

    fn raw(text: &str) -> Result<Id, IdError> {
        RawValue::from_string(text.to_owned())
            .map(|r| Id::Raw(RawId(r)))
            .map_err(|_| IdError::WrongType)
    }

    fn from_number_text(text: &str) -> Result<Id, IdError> {
        match canonical_i64(text) {
            Some(n) => Ok(Id::Num(n)),
            // `RawValue` checks that it is one JSON value; it must be a number, not `-"x"`.
            None if text
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
            {
                Self::raw(text)
            }
            None => Err(IdError::WrongType),
        }
    }

    fn from_string_text(text: &str) -> Result<Id, IdError> {
        let inner = text
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .ok_or(IdError::WrongType)?;
        if !inner.contains('\\') && !inner.contains('"') && !inner.bytes().any(|b| b < 0x20) {
            return Ok(Id::Str(inner.to_owned()));
        }
        match serde_json::from_str::<String>(text) {
            Ok(s) if json_string(&s) == text => Ok(Id::Str(s)),
            // Escapes written another way than serde_json writes them (`\u0041`, `\/`), and
            // escapes that decode to no Rust string (a lone surrogate): kept as written.
            Ok(_) => Self::raw(text),
            Err(_) => match serde_json::from_str::<&RawValue>(text) {
                Ok(_) => Self::raw(text),
                Err(_) => Err(IdError::WrongType),
            },
        }
    }

    /// The id as JSON text, exactly as it goes on the wire.
    pub fn to_json(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Id::Num(n) => n.to_string().into(),
            Id::Str(s) => json_string(s),
            Id::Raw(r) => r.as_str().into(),
        }
    }
}

/// `text` as an `i64` when it is exactly how that `i64` is written (no `-0`, `+`, leading zero).
fn canonical_i64(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let leading_zero = digits.starts_with('0') && (digits.len() > 1 || digits.len() < text.len());
    if digits.is_empty() || leading_zero || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
            Id::Raw(r) => f.write_str(r.as_str()),
        }
    }
}

/// Exact with serde_json's writers (`to_string`, `to_vec`, `to_writer`, and so the `encode_*`
/// functions here). `serde_json::to_value` and `json!` turn a raw id back into a `Value` and may
/// rewrite it (`1e2` becomes `100.0`, `-0` becomes `-0.0`, `"\u0041"` becomes `"A"`): never build
/// a message that carries a peer's id that way.
impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Id::Num(n) => s.serialize_i64(*n),
            Id::Str(v) => s.serialize_str(v),
            // serde_json writes a RawValue verbatim.
            Id::Raw(r) => r.0.serialize(s),
        }
    }
}

/// Reads an id through its raw JSON text, so it is kept exactly (serde_json deserialisers only).
impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        match Id::from_json(raw.get()) {
            Ok(Some(id)) => Ok(id),
            Ok(None) => Err(serde::de::Error::custom("id must not be null")),
            Err(e) => Err(serde::de::Error::custom(e)),
        }
    }
}

/// A JSON-RPC error object; `data` is kept raw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(PARSE_ERROR, format!("Parse error: {detail}"))
    }

    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(INVALID_REQUEST, format!("Invalid request: {detail}"))
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("Method not found: {method}"))
    }

    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(INVALID_PARAMS, format!("Invalid params: {detail}"))
    }

    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::new(INTERNAL_ERROR, format!("Internal error: {detail}"))
    }

    /// A named limit is reached: −33013 with `data: {"code":"LIMIT","limit":limit,"value":value}`
    /// (`max_connections`, `max_sessions_per_connection`, `max_pending_requests`).
    pub fn limit(limit: &str, value: u64) -> Self {
        let name = crate::errors::ErrorName::Limit;
        Self::new(name.code(), format!("Limit reached: {limit} is {value}"))
            .with_data(serde_json::json!({ "code": name.as_str(), "limit": limit, "value": value }))
    }

    /// A partial line older than `line_timeout` was dropped: −32700 with
    /// `data: {"limit":"line_timeout"}`.
    pub fn line_timeout() -> Self {
        Self::parse_error("an unfinished line was dropped after line_timeout")
            .with_data(serde_json::json!({ "limit": "line_timeout" }))
    }

    /// The answer to a line the codec refused: −32700, and for an oversized line
    /// `data: {"limit":"max_line","value":N}`.
    pub fn from_frame(error: &crate::codec::FrameError) -> Self {
        match error {
            crate::codec::FrameError::Oversized { limit } => Self::parse_error(error)
                .with_data(serde_json::json!({ "limit": "max_line", "value": limit })),
            crate::codec::FrameError::NotUtf8 => Self::parse_error(error),
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// ACP: authentication required.
pub const AUTH_REQUIRED: i64 = -32000;
/// ACP: resource (or, with `data.sessionId`, session) not found.
pub const RESOURCE_NOT_FOUND: i64 = -32002;

/// One decoded message.
#[derive(Debug)]
pub enum Message {
    Request {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    },
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
    },
    Response {
        /// `None` when the peer answered `id: null` (its reply to a line it could not parse).
        id: Option<Id>,
        outcome: Result<Box<RawValue>, RpcError>,
    },
}

/// Why a line is not a JSON-RPC message. `id` is set when one could be read, so the receiver can
/// still answer the request with an error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON-RPC 2.0 message: {reason}")]
    Invalid { id: Option<Id>, reason: String },
}

impl EnvelopeError {
    /// The error object to answer with, per JSON-RPC 2.0.
    pub fn to_rpc_error(&self) -> RpcError {
        match self {
            EnvelopeError::NotJson(e) => RpcError::parse_error(e),
            EnvelopeError::Invalid { reason, .. } => RpcError::invalid_request(reason),
        }
    }

    pub fn id(&self) -> Option<&Id> {
        match self {
            EnvelopeError::NotJson(_) => None,
            EnvelopeError::Invalid { id, .. } => id.as_ref(),
        }
    }
}

/// Keeps a present-but-null field as `Some(null)`; serde's `Option` would make it `None`.
fn present<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<&'a RawValue>, D::Error> {
    <&'a RawValue>::deserialize(d).map(Some)
}

/// The top-level fields, every one raw: this never fails on a field's type (only on bad JSON or a
/// duplicate key), so the id can be read before anything else is judged.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A JSON string's value; `None` when `raw` is not a string.
fn string_of(raw: &RawValue) -> Option<String> {
    let text = raw.get();
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'))
        && !inner.contains('\\')
    {
        return Some(inner.to_owned());
    }
    if !text.starts_with('"') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Parses one line into a message.
///
/// The line must be one JSON object: an array (a JSON-RPC batch, which ACP does not use) or any
/// other JSON value is [`EnvelopeError::Invalid`] with no id (−32600), text that is not JSON is
/// [`EnvelopeError::NotJson`] (−32700). A request whose id can be read keeps it in the error, so
/// it is answered with that id.
pub fn parse(line: &[u8]) -> Result<Message, EnvelopeError> {
    // serde_json checks UTF-8 only in the strings it reads, not in the ones it skips (an unknown
    // field's), so the whole line is checked once here; `from_str` then checks nothing again.
    let line = std::str::from_utf8(line)
        .map_err(|_| EnvelopeError::NotJson("the line is not valid UTF-8".into()))?;
    let first = line.bytes().find(|b| !is_json_ws(*b));
    if first != Some(b'{') {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(line) {
            Ok(_) if first == Some(b'[') => EnvelopeError::Invalid {
                id: None,
                reason: "a batch (JSON array) is not supported; send one object per line".into(),
            },
            Ok(_) => EnvelopeError::Invalid {
                id: None,
                reason: "a message must be a JSON object".into(),
            },
            Err(e) => EnvelopeError::NotJson(e.to_string()),
        });
    }
    let wire: Wire<'_> = match serde_json::from_str(line) {
        Ok(w) => w,
        Err(e) if e.is_data() => {
            // A doubled envelope key (`id`, `method`, `params`…, however spelled): which one
            // is meant is unknowable, so none is used, not even the id.
            let reason = e.to_string();
            let reason = if reason.starts_with("duplicate field") {
                format!("{reason}: each envelope key may appear once")
            } else {
                reason
            };
            return Err(EnvelopeError::Invalid { id: None, reason });
        }
        Err(e) => return Err(EnvelopeError::NotJson(e.to_string())),
    };
    let id = match wire.id {
        None => None,
        Some(raw) => match Id::from_json(raw.get()) {
            Ok(id) => id,
            Err(e) => {
                return Err(EnvelopeError::Invalid {
                    id: None,
                    reason: e.to_string(),
                });
            }
        },
    };
    let invalid = |reason: &str| EnvelopeError::Invalid {
        id: id.clone(),
        reason: reason.to_string(),
    };
    if let Some(v) = wire.jsonrpc
        && string_of(v).as_deref() != Some("2.0")
    {
        return Err(invalid("jsonrpc must be \"2.0\""));
    }
    if let Some(method) = wire.method {
        let Some(method) = string_of(method) else {
            return Err(invalid("method must be a string"));
        };
        if wire.result.is_some() || wire.error.is_some() {
            return Err(invalid("a request has no result or error"));
        }
        if let Some(p) = wire.params
            && !matches!(p.get().as_bytes().first(), Some(b'{' | b'['))
        {
            return Err(invalid("params must be an object or an array"));
        }
        let params = wire.params.map(ToOwned::to_owned);
        return match (wire.id, id) {
            (None, _) => Ok(Message::Notification { method, params }),
            (Some(_), Some(id)) => Ok(Message::Request { id, method, params }),
            (Some(_), None) => Err(EnvelopeError::Invalid {
                id: None,
                reason: "a request id must not be null".into(),
            }),
        };
    }
    if wire.id.is_none() {
        return Err(invalid("neither a request, a notification nor a response"));
    }
    match (wire.result, wire.error) {
        (Some(result), None) => Ok(Message::Response {
            id,
            outcome: Ok(result.to_owned()),
        }),
        (None, Some(error)) => {
            let error = error
                .get()
                .starts_with('{')
                .then(|| serde_json::from_str::<RpcError>(error.get()).ok())
                .flatten()
                .ok_or_else(|| invalid("error must be an object with a code and a message"))?;
            Ok(Message::Response {
                id,
                outcome: Err(error),
            })
        }
        (Some(_), Some(_)) => Err(invalid("a response has both result and error")),
        (None, None) => Err(invalid("neither a request, a notification nor a response")),
    }
}

#[derive(Serialize)]
struct Out<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "OutId::is_absent")]
    id: OutId<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RpcError>,
}

enum OutId<'a> {
    Absent,
    Null,
    Id(&'a Id),
}

impl OutId<'_> {
    fn is_absent(&self) -> bool {
        matches!(self, OutId::Absent)
    }
}

impl Serialize for OutId<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            OutId::Absent | OutId::Null => s.serialize_none(),
            OutId::Id(id) => id.serialize(s),
        }
    }
}

fn to_vec(out: &Out<'_>) -> Vec<u8> {
    // Serialising borrowed strings, raw JSON and integers cannot fail.
    serde_json::to_vec(out).unwrap_or_default()
}

pub fn encode_request(id: &Id, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    to_vec(&Out {
        jsonrpc: "2.0",
        id: OutId::Id(id),
        method: Some(method),
        params,
        result: None,
        error: None,
    })
}

pub fn encode_notification(method: &str, params: Option<&RawValue>) -> Vec<u8> {
    to_vec(&Out {
        jsonrpc: "2.0",
        id: OutId::Absent,
        method: Some(method),
        params,
        result: None,
        error: None,
    })
}

/// A notification whose params are already JSON text (valid by construction), written without
/// another parse: the bridge's hot path.
pub fn encode_notification_text(method: &str, params: &str) -> Vec<u8> {
    let method = json_string(method);
    let mut out = Vec::with_capacity(params.len() + method.len() + 40);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    out.extend_from_slice(method.as_bytes());
    out.extend_from_slice(b",\"params\":");
    out.extend_from_slice(params.as_bytes());
    out.push(b'}');
    out
}

pub fn encode_result(id: &Id, result: &RawValue) -> Vec<u8> {
    to_vec(&Out {
        jsonrpc: "2.0",
        id: OutId::Id(id),
        method: None,
        params: None,
        result: Some(result),
        error: None,
    })
}

/// An error response; `id: None` answers a line whose id could not be read.
/// The answer to request `id`: its result, or its error.
pub fn encode_reply(id: &Id, reply: Result<&RawValue, &RpcError>) -> Vec<u8> {
    match reply {
        Ok(result) => encode_result(id, result),
        Err(error) => encode_error(Some(id), error),
    }
}

pub fn encode_error(id: Option<&Id>, error: &RpcError) -> Vec<u8> {
    to_vec(&Out {
        jsonrpc: "2.0",
        id: id.map_or(OutId::Null, OutId::Id),
        method: None,
        params: None,
        result: None,
        error: Some(error),
    })
}

/// `s` as a JSON string literal; plain ASCII (method names, minted ids) needs no escaping pass.
pub fn json_string(s: &str) -> std::borrow::Cow<'static, str> {
    let plain = s
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ');
    if plain {
        let mut out = String::with_capacity(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
        out.into()
    } else {
        serde_json::to_string(s).unwrap_or_default().into()
    }
}

/// Serialises a typed value into raw JSON for `params` or `result`.
pub fn to_raw<T: Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classifies_requests_notifications_and_responses() {
        let m = parse(
            br#"{"jsonrpc":"2.0","id":"a-1","method":"session/prompt","params":{"x":[1,2]}}"#,
        )
        .unwrap();
        let Message::Request { id, method, params } = m else {
            panic!("{m:?}")
        };
        assert_eq!(id, Id::Str("a-1".into()));
        assert_eq!(method, "session/prompt");
        assert_eq!(params.unwrap().get(), r#"{"x":[1,2]}"#);

        let m = parse(br#"{"jsonrpc":"2.0","method":"session/update","params":{"u":1}}"#).unwrap();
        assert!(matches!(m, Message::Notification { .. }));

        let m = parse(br#"{"jsonrpc":"2.0","id":7,"result":null}"#).unwrap();
        let Message::Response { id, outcome } = m else {
            panic!()
        };
        assert_eq!(id, Some(Id::Num(7)));
        assert_eq!(outcome.unwrap().get(), "null");

        let m =
            parse(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#).unwrap();
        let Message::Response { id, outcome } = m else {
            panic!()
        };
        assert_eq!(id, None);
        assert_eq!(outcome.unwrap_err().code, -32700);
    }

    #[test]
    fn malformed_lines_are_typed() {
        assert!(matches!(
            parse(b"{not json"),
            Err(EnvelopeError::NotJson(_))
        ));
        assert!(matches!(
            parse(b"[1,2]"),
            Err(EnvelopeError::Invalid { .. })
        ));
        let e = parse(br#"{"jsonrpc":"1.0","id":3,"method":"x"}"#).unwrap_err();
        assert_eq!(e.id(), Some(&Id::Num(3)));
        assert_eq!(e.to_rpc_error().code, INVALID_REQUEST);
        assert!(parse(br#"{"id":3,"method":"x","params":5}"#).is_err());
        assert!(parse(br#"{"id":{"a":1},"method":"x"}"#).is_err());
        assert!(parse(br#"{"id":1}"#).is_err());
        assert_eq!(
            parse(b"{oops").unwrap_err().to_rpc_error().code,
            PARSE_ERROR
        );
    }

    #[test]
    fn raw_params_round_trip_byte_for_byte() {
        let params =
            r#"{"sessionId":"s","update":{"sessionUpdate":"future_kind","weird":[1,{"a":null}]}}"#;
        let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
        let Message::Notification { method, params: p } = parse(line.as_bytes()).unwrap() else {
            panic!()
        };
        let out = encode_notification(&method, p.as_deref());
        assert_eq!(String::from_utf8(out).unwrap(), line);
    }

    #[test]
    fn text_notification_matches_the_serde_encoding() {
        let raw = RawValue::from_string(r#"{"a":[1,"x"]}"#.into()).unwrap();
        assert_eq!(
            encode_notification_text("m/x", raw.get()),
            encode_notification("m/x", Some(&raw))
        );
    }

    #[test]
    fn limit_errors_carry_the_contract_data() {
        let out = encode_error(None, &RpcError::limit("max_connections", 64));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-33013,"message":"Limit reached: max_connections is 64","data":{"code":"LIMIT","limit":"max_connections","value":64}}}"#
        );
        let e = RpcError::from_frame(&crate::codec::FrameError::Oversized { limit: 16 });
        assert_eq!(e.code, PARSE_ERROR);
        assert_eq!(
            e.data,
            Some(serde_json::json!({"limit": "max_line", "value": 16}))
        );
        let e = RpcError::from_frame(&crate::codec::FrameError::NotUtf8);
        assert_eq!((e.code, e.data), (PARSE_ERROR, None));
        let e = RpcError::line_timeout();
        assert_eq!(e.code, PARSE_ERROR);
        assert_eq!(e.data, Some(serde_json::json!({"limit": "line_timeout"})));
    }

    #[test]
    fn error_response_with_null_id() {
        let out = encode_error(None, &RpcError::parse_error("x"));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v["id"].is_null());
        assert_eq!(v["error"]["code"], -32700);
    }

    /// The id's text as it appears in an encoded line (`"id":<text>`).
    fn id_text(line: &[u8]) -> String {
        let v: &RawValue = serde_json::from_slice::<std::collections::HashMap<&str, &RawValue>>(
            line,
        )
        .unwrap()["id"];
        v.get().to_string()
    }

    const ODD_IDS: &[&str] = &[
        "1.0",
        "1e2",
        "1E+2",
        "-0",
        "-0.0",
        "12345678901234567890",
        "-9223372036854775809",
        "9223372036854775807",
        "-9223372036854775808",
        "0",
        "1.5e-300",
        "1e400",
        r#""\u0041""#,
        r#""\/""#,
        r#""a\"b""#,
        r#""\ud83d\ude00""#,
        r#""😀""#,
        r#""""#,
        r#""\u0000""#,
        r#""\ud800""#,
    ];

    #[test]
    fn odd_ids_are_echoed_byte_for_byte() {
        for text in ODD_IDS {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{text},"method":"m"}}"#);
            let Message::Request { id, .. } = parse(line.as_bytes()).unwrap() else {
                panic!("{line}")
            };
            assert_eq!(id.to_json(), *text);
            let raw = RawValue::from_string("{}".into()).unwrap();
            assert_eq!(id_text(&encode_result(&id, &raw)), *text, "{line}");
            assert_eq!(
                id_text(&encode_error(Some(&id), &RpcError::internal("x"))),
                *text
            );
            // The same text read through serde (as a field of a typed struct) is the same id.
            let again: Id = serde_json::from_str(text).unwrap();
            assert_eq!(again, id);
        }
    }

    #[test]
    fn ids_inside_typed_bodies_keep_their_text() {
        // A typed struct holding an id (such as a cancel request naming one) reads and writes it
        // exactly too.
        #[derive(Serialize, Deserialize)]
        struct Ref {
            id: Id,
        }
        for text in ODD_IDS {
            let json = format!(r#"{{"id":{text}}}"#);
            let r: Ref = serde_json::from_str(&json).unwrap();
            assert_eq!(serde_json::to_string(&r).unwrap(), json);
        }
        assert!(serde_json::from_str::<Ref>(r#"{"id":null}"#).is_err());
        assert!(serde_json::from_str::<Ref>(r#"{"id":[1]}"#).is_err());
    }

    #[test]
    fn canonical_ids_keep_their_typed_variants() {
        assert_eq!(Id::from_json("7"), Ok(Some(Id::Num(7))));
        assert_eq!(Id::from_json(" -3 "), Ok(Some(Id::Num(-3))));
        assert_eq!(Id::from_json(r#""a-1""#), Ok(Some(Id::Str("a-1".into()))));
        assert_eq!(Id::from_json(r#""a\"b""#), Ok(Some(Id::Str("a\"b".into()))));
        assert_eq!(Id::from_json(r#""é""#), Ok(Some(Id::Str("é".into()))));
        assert_eq!(Id::from_json("null"), Ok(None));
        assert!(matches!(Id::from_json("-0"), Ok(Some(Id::Raw(_)))));
        assert!(matches!(Id::from_json("1.0"), Ok(Some(Id::Raw(_)))));
        assert!(matches!(Id::from_json(r#""\u0041""#), Ok(Some(Id::Raw(_)))));
        for bad in [
            "true", "{}", "[1]", "", "1 2", "1.", "\"a", "nul", "+1", "01", "\"\n\"",
        ] {
            assert_eq!(Id::from_json(bad), Err(IdError::WrongType), "{bad:?}");
        }
        // Two spellings of one string are two ids; a peer's `7` is acpd's `Id::Num(7)`.
        assert_ne!(Id::from_json(r#""\u0041""#), Id::from_json(r#""A""#));
        let mut pending = std::collections::HashMap::new();
        pending.insert(Id::Num(7), "call");
        let Message::Response { id, .. } =
            parse(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(pending.get(&id.unwrap()), Some(&"call"));
    }

    #[test]
    fn arrays_and_scalars_are_invalid_requests_with_no_id() {
        for line in [
            r#"["2.0",73,"_acpd/providers",{}]"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#,
            "[]",
            " [1]",
            "1",
            r#""{\"id\":1}""#,
            "null",
            "true",
        ] {
            let e = parse(line.as_bytes()).unwrap_err();
            assert!(
                matches!(e, EnvelopeError::Invalid { id: None, .. }),
                "{line}: {e:?}"
            );
            assert_eq!(e.to_rpc_error().code, INVALID_REQUEST, "{line}");
        }
        for line in ["[1,", "[1]]", "{", "{}}", "\u{feff}{}", "", "   "] {
            let e = parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.to_rpc_error().code, PARSE_ERROR, "{line}: {e:?}");
            assert_eq!(e.id(), None);
        }
        // Leading JSON whitespace before an object is fine.
        assert!(matches!(
            parse(b" \t{\"id\":1,\"method\":\"m\"}"),
            Ok(Message::Request { .. })
        ));
    }

    #[test]
    fn a_bad_field_keeps_the_readable_id() {
        for line in [
            r#"{"jsonrpc":"2.0","id":5,"method":3}"#,
            r#"{"jsonrpc":2,"id":5,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"m","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":5,"method":"m","result":1}"#,
            r#"{"jsonrpc":"2.0","id":5,"error":[1,"x"]}"#,
            r#"{"jsonrpc":"2.0","id":5,"error":{"code":"x","message":"m"}}"#,
            r#"{"jsonrpc":"2.0","id":5,"result":1,"error":{"code":1,"message":"m"}}"#,
            r#"{"jsonrpc":"2.0","id":5}"#,
        ] {
            let e = parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.id(), Some(&Id::Num(5)), "{line}");
            assert_eq!(e.to_rpc_error().code, INVALID_REQUEST, "{line}");
        }
        // Duplicate keys: which id is meant is unknowable, so none is used.
        let e = parse(br#"{"id":1,"id":2,"method":"m"}"#).unwrap_err();
        assert!(matches!(e, EnvelopeError::Invalid { id: None, .. }));
        // However the second key is spelled, and whichever envelope key is doubled.
        for line in [
            r#"{"id":1,"id":2,"method":"m"}"#,
            r#"{"id":1,"method":"a","method":"b"}"#,
            r#"{"id":1,"method":"m","params":{"sessionId":"a"},"params":{"sessionId":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"result":{}}"#,
        ] {
            let e = parse(line.as_bytes()).unwrap_err();
            assert!(
                matches!(e, EnvelopeError::Invalid { id: None, .. }),
                "{line}"
            );
            let rpc = e.to_rpc_error();
            assert_eq!(rpc.code, INVALID_REQUEST, "{line}");
            assert!(
                rpc.message.contains("appear once"),
                "{line}: {}",
                rpc.message
            );
        }
        let e = parse(br#"{"id":null,"method":"m"}"#).unwrap_err();
        assert!(matches!(e, EnvelopeError::Invalid { id: None, .. }));
        let e = parse(br#"{"id":true,"method":"m"}"#).unwrap_err();
        assert!(matches!(e, EnvelopeError::Invalid { id: None, .. }));
    }

    #[test]
    fn non_utf8_anywhere_is_a_parse_error() {
        // Found by the fuzz target: serde_json skipped an unknown field's bytes unchecked, so
        // this was a request.
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"x\":{\"a\x9e\x9e\":1}}";
        let e = parse(line).unwrap_err();
        assert!(matches!(e, EnvelopeError::NotJson(_)), "{e:?}");
        assert_eq!(e.to_rpc_error().code, PARSE_ERROR);
        assert!(parse(b"[\"\xff\"]").is_err_and(|e| e.to_rpc_error().code == PARSE_ERROR));
    }

    #[test]
    fn escaped_method_names_are_decoded() {
        let Message::Request { method, .. } =
            parse(br#"{"id":1,"method":"session\/prompt"}"#).unwrap()
        else {
            panic!()
        };
        assert_eq!(method, "session/prompt");
        assert!(parse(br#"{"jsonrpc":"2\u002e0","id":1,"method":"m"}"#).is_ok());
    }

    fn json_number() -> impl Strategy<Value = String> {
        (
            any::<bool>(),
            "(0|[1-9][0-9]{0,30})",
            proptest::option::of("[0-9]{1,20}"),
            proptest::option::of(("[eE]", "[+-]?", "[0-9]{1,3}")),
        )
            .prop_map(|(neg, int, frac, exp)| {
                let mut s = String::new();
                if neg {
                    s.push('-');
                }
                s.push_str(&int);
                if let Some(f) = frac {
                    s.push('.');
                    s.push_str(&f);
                }
                if let Some((e, sign, d)) = exp {
                    s.push_str(&e);
                    s.push_str(&sign);
                    s.push_str(&d);
                }
                s
            })
    }

    fn json_string_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-zA-Z0-9 _.:-]{1,4}",
            Just("\\\"".to_string()),
            Just("\\\\".to_string()),
            Just("\\/".to_string()),
            Just("\\n".to_string()),
            Just("\\b".to_string()),
            "\\\\u[0-9a-fA-F]{4}".prop_filter("no surrogates", |s| {
                !matches!(u16::from_str_radix(&s[2..], 16), Ok(0xd800..=0xdfff))
            }),
            any::<char>()
                .prop_filter("literal", |c| *c >= ' ' && *c != '"' && *c != '\\')
                .prop_map(String::from),
        ];
        proptest::collection::vec(piece, 0..8).prop_map(|v| format!("\"{}\"", v.concat()))
    }

    proptest! {
        /// Whatever number or string a parent uses as an id, the answer carries the same text.
        #[test]
        fn any_id_text_round_trips(
            text in prop_oneof![json_number(), json_string_text(), any::<i64>().prop_map(|n| n.to_string())],
            ws in "[ \t]{0,2}",
        ) {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{ws}{text}{ws},"method":"m","params":{{}}}}"#);
            let Ok(Message::Request { id, .. }) = parse(line.as_bytes()) else {
                return Err(TestCaseError::fail(format!("not a request: {line}")));
            };
            let raw = RawValue::from_string("null".into()).unwrap();
            prop_assert_eq!(id_text(&encode_result(&id, &raw)), text.clone());
            prop_assert_eq!(id.to_json(), text.clone());
            let reparsed = parse(&encode_result(&id, &raw)).unwrap();
            let Message::Response { id: Some(back), .. } = reparsed else {
                return Err(TestCaseError::fail("not a response"));
            };
            prop_assert_eq!(back, id);
        }

        /// acpd's own numeric ids survive a peer echoing them.
        #[test]
        fn own_numeric_ids_match_the_echo(n in any::<i64>()) {
            let out = encode_request(&Id::Num(n), "m", None);
            let Ok(Message::Request { id, .. }) = parse(&out) else {
                return Err(TestCaseError::fail("not a request"));
            };
            prop_assert_eq!(id, Id::Num(n));
        }

        /// Any JSON value that is not an object is −32600 with no id.
        #[test]
        fn non_objects_are_invalid_requests(v in json_value(3)) {
            let text = serde_json::to_string(&v).unwrap();
            let r = parse(text.as_bytes());
            if v.is_object() {
                prop_assert!(r.is_ok() || r.as_ref().is_err_and(|e| e.to_rpc_error().code == INVALID_REQUEST));
            } else {
                let e = r.unwrap_err();
                prop_assert_eq!(e.to_rpc_error().code, INVALID_REQUEST);
                prop_assert!(e.id().is_none());
            }
        }

        /// Arbitrary bytes never panic and are typed.
        #[test]
        fn random_lines_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&bytes);
        }
    }

    fn json_value(depth: u32) -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "[a-z]{0,5}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(depth, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("id".to_string()),
                        Just("method".to_string()),
                        "[a-z]{1,3}".prop_map(String::from)
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
