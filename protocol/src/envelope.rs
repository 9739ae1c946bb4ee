//! The JSON-RPC 2.0 envelope.
//!
//! Only the routing fields (`id`, `method`) are parsed; `params`, `result` and `error.data` stay
//! raw JSON, so a bridge forwards what it does not read without re-serialising it and without
//! losing fields (or update kinds) that ACP's typed schema does not know.

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A JSON-RPC request id. ACP peers use both numbers and strings (the SDK sends UUID strings).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    Num(i64),
    Str(String),
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
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
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    jsonrpc: Option<String>,
    #[serde(default, deserialize_with = "present")]
    id: Option<Box<RawValue>>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default, deserialize_with = "present")]
    params: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<RpcError>,
}

/// Parses one line into a message.
pub fn parse(line: &[u8]) -> Result<Message, EnvelopeError> {
    let wire: Wire = match serde_json::from_slice(line) {
        Ok(w) => w,
        Err(e) if e.is_data() => {
            return Err(EnvelopeError::Invalid {
                id: None,
                reason: e.to_string(),
            });
        }
        Err(e) => return Err(EnvelopeError::NotJson(e.to_string())),
    };
    let id = match &wire.id {
        None => None,
        Some(raw) if raw.get() == "null" => None,
        Some(raw) => match serde_json::from_str::<Id>(raw.get()) {
            Ok(id) => Some(id),
            Err(_) => {
                return Err(EnvelopeError::Invalid {
                    id: None,
                    reason: "id must be a number or a string".into(),
                });
            }
        },
    };
    let invalid = |reason: &str| EnvelopeError::Invalid {
        id: id.clone(),
        reason: reason.to_string(),
    };
    if let Some(v) = &wire.jsonrpc
        && v != "2.0"
    {
        return Err(invalid("jsonrpc must be \"2.0\""));
    }
    if let Some(p) = &wire.params {
        let first = p.get().as_bytes().first();
        if !matches!(first, Some(b'{') | Some(b'[')) {
            return Err(invalid("params must be an object or an array"));
        }
    }
    match (wire.method, id.clone(), wire.result, wire.error) {
        (Some(method), Some(id), None, None) => Ok(Message::Request {
            id,
            method,
            params: wire.params,
        }),
        (Some(method), None, None, None) if wire.id.is_none() => Ok(Message::Notification {
            method,
            params: wire.params,
        }),
        (Some(_), None, None, None) => Err(invalid("a request id must not be null")),
        (None, id, Some(result), None) if wire.id.is_some() => Ok(Message::Response {
            id,
            outcome: Ok(result),
        }),
        (None, id, None, Some(error)) if wire.id.is_some() => Ok(Message::Response {
            id,
            outcome: Err(error),
        }),
        (None, _, Some(_), Some(_)) => Err(invalid("a response has both result and error")),
        _ => Err(invalid("neither a request, a notification nor a response")),
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
    fn error_response_with_null_id() {
        let out = encode_error(None, &RpcError::parse_error("x"));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v["id"].is_null());
        assert_eq!(v["error"]["code"], -32700);
    }
}
