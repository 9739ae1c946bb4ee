//! One line into a [`Message`]: only the routing fields are read, the rest stays raw. The
//! bridge's hot path reads a [`MessageRef`] instead, which borrows its method and params from
//! the line (no allocation, no copy); [`parse`] is that parse made owned, so the two never differ.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::scan::{Fields, ParamsKeys, ScanError, Shape, scan};
use super::{Id, RpcError};

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

/// One decoded message borrowing from its line: what [`Message`] holds, with the method and the
/// raw params or result left in the line. The same checks as [`parse`] (which is
/// [`parse_ref`] then [`MessageRef::into_owned`]).
#[derive(Debug)]
pub enum MessageRef<'a> {
    Request {
        id: Id,
        method: Cow<'a, str>,
        params: Option<RawJson<'a>>,
    },
    Notification {
        method: Cow<'a, str>,
        params: Option<RawJson<'a>>,
    },
    Response {
        /// `None` when the peer answered `id: null` (its reply to a line it could not parse).
        id: Option<Id>,
        outcome: Result<RawJson<'a>, RpcError>,
    },
}

/// A JSON value's text, left in its line: the raw params or result of a [`MessageRef`]. Only
/// [`parse_ref`] (from text its scan found to be one JSON value) and a serde_json `RawValue`
/// make one, so the conversions back to serde_json's raw values parse it again but cannot fail
/// on it; they still return the error rather than assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawJson<'a>(&'a str);

impl<'a> RawJson<'a> {
    /// The value's JSON text, exactly as the peer wrote it.
    pub fn get(self) -> &'a str {
        self.0
    }

    /// As serde_json's borrowed raw value (a second parse of the text: for the slow paths).
    pub fn to_raw_value(self) -> Result<&'a RawValue, EnvelopeError> {
        serde_json::from_str(self.0).map_err(|e| EnvelopeError::NotJson(e.to_string()))
    }

    /// As serde_json's owned raw value (a copy and a second parse of the text).
    pub fn to_boxed(self) -> Result<Box<RawValue>, EnvelopeError> {
        RawValue::from_string(self.0.to_owned()).map_err(|e| EnvelopeError::NotJson(e.to_string()))
    }
}

/// A raw value serde_json has already checked is one JSON value (a message queued owned, say).
impl<'a> From<&'a RawValue> for RawJson<'a> {
    fn from(raw: &'a RawValue) -> Self {
        RawJson(raw.get())
    }
}

impl MessageRef<'_> {
    /// The message with its own copies of the method and the raw JSON.
    pub fn into_owned(self) -> Result<Message, EnvelopeError> {
        Ok(match self {
            MessageRef::Request { id, method, params } => Message::Request {
                id,
                method: method.into_owned(),
                params: params.map(RawJson::to_boxed).transpose()?,
            },
            MessageRef::Notification { method, params } => Message::Notification {
                method: method.into_owned(),
                params: params.map(RawJson::to_boxed).transpose()?,
            },
            MessageRef::Response { id, outcome } => Message::Response {
                id,
                outcome: match outcome {
                    Ok(result) => Ok(result.to_boxed()?),
                    Err(e) => Err(e),
                },
            },
        })
    }
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

/// A JSON string's value, borrowed when it has no escape; `None` when `raw` is not a string.
fn string_of(text: &str) -> Option<Cow<'_, str>> {
    if let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"'))
        && !inner.contains('\\')
    {
        return Some(Cow::Borrowed(inner));
    }
    if !text.starts_with('"') {
        return None;
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

/// Parses one line into a message.
///
/// The line must be one JSON object: an array (a JSON-RPC batch, which ACP does not use) or any
/// other JSON value is [`EnvelopeError::Invalid`] with no id (−32600), text that is not JSON is
/// [`EnvelopeError::NotJson`] (−32700). A request whose id can be read keeps it in the error, so
/// it is answered with that id.
pub fn parse(line: &[u8]) -> Result<Message, EnvelopeError> {
    parse_ref(line).and_then(MessageRef::into_owned)
}

/// [`parse`] without copying: the method and the raw params or result borrow from `line`.
pub fn parse_ref(line: &[u8]) -> Result<MessageRef<'_>, EnvelopeError> {
    parse_keyed(line).map(|(message, _)| message)
}

/// [`parse_ref`], with what the params' routing keys are (the same pass found them).
pub fn parse_keyed(line: &[u8]) -> Result<(MessageRef<'_>, ParamsKeys<'_>), EnvelopeError> {
    match scan(line) {
        // The scan checks UTF-8 as it goes, so a line it refuses may be cut short by a syntax
        // error before the bad byte; the bad byte is the reason given.
        Err(_) if std::str::from_utf8(line).is_err() => {
            Err(EnvelopeError::NotJson("the line is not valid UTF-8".into()))
        }
        Ok(Shape::Object(fields)) => {
            let keys = fields.keys;
            classify(fields).map(|message| (message, keys))
        }
        Ok(Shape::Array) => Err(EnvelopeError::Invalid {
            id: None,
            reason: "a batch (JSON array) is not supported; send one object per line".into(),
        }),
        Ok(Shape::Scalar) => Err(EnvelopeError::Invalid {
            id: None,
            reason: "a message must be a JSON object".into(),
        }),
        // A doubled envelope key (`id`, `method`, `params`…, however spelled): which one is
        // meant is unknowable, so none is used, not even the id.
        Err(e @ ScanError::Duplicate { .. }) => Err(EnvelopeError::Invalid {
            id: None,
            reason: format!("{e}: each envelope key may appear once"),
        }),
        Err(e @ ScanError::Syntax { .. }) => Err(EnvelopeError::NotJson(e.to_string())),
    }
}

/// The message the envelope's fields make, or why they make none.
///
/// A member written as `null` where JSON-RPC says it is absent (`"params": null`, an `"error":
/// null` beside a result, a `"result": null` beside an error) is read as absent: serialisers
/// that write every optional field (pydantic's, say) write them so, and what they mean is plain.
pub(super) fn classify(mut wire: Fields<'_>) -> Result<MessageRef<'_>, EnvelopeError> {
    if wire.params == Some("null") {
        wire.params = None;
    }
    match (wire.result, wire.error) {
        (Some(_), Some("null")) => wire.error = None,
        (Some("null"), Some(_)) => wire.result = None,
        _ => {}
    }
    let id = match wire.id {
        None => None,
        Some(raw) => match Id::from_json(raw) {
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
            && !matches!(p.as_bytes().first(), Some(b'{' | b'['))
        {
            return Err(invalid("params must be an object or an array"));
        }
        let params = wire.params.map(RawJson);
        return match (wire.id, id) {
            (None, _) => Ok(MessageRef::Notification { method, params }),
            (Some(_), Some(id)) => Ok(MessageRef::Request { id, method, params }),
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
        (Some(result), None) => Ok(MessageRef::Response {
            id,
            outcome: Ok(RawJson(result)),
        }),
        (None, Some(error)) => {
            let error = error
                .starts_with('{')
                .then(|| serde_json::from_str::<RpcError>(error).ok())
                .flatten()
                .ok_or_else(|| invalid("error must be an object with an integer code"))?;
            Ok(MessageRef::Response {
                id,
                outcome: Err(error),
            })
        }
        (Some(_), Some(_)) => Err(invalid("a response has both result and error")),
        (None, None) => Err(invalid("neither a request, a notification nor a response")),
    }
}
