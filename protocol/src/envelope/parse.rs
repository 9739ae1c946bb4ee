//! One line into a [`Message`]: only the routing fields are read, the rest stays raw. The
//! bridge's hot path reads a [`MessageRef`] instead, which borrows its method and params from
//! the line (no allocation, no copy); [`parse`] is that parse made owned, so the two never differ.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::value::RawValue;

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
        params: Option<&'a RawValue>,
    },
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    Response {
        /// `None` when the peer answered `id: null` (its reply to a line it could not parse).
        id: Option<Id>,
        outcome: Result<&'a RawValue, RpcError>,
    },
}

impl MessageRef<'_> {
    /// The message with its own copies of the method and the raw JSON.
    pub fn into_owned(self) -> Message {
        match self {
            MessageRef::Request { id, method, params } => Message::Request {
                id,
                method: method.into_owned(),
                params: params.map(ToOwned::to_owned),
            },
            MessageRef::Notification { method, params } => Message::Notification {
                method: method.into_owned(),
                params: params.map(ToOwned::to_owned),
            },
            MessageRef::Response { id, outcome } => Message::Response {
                id,
                outcome: outcome.map(ToOwned::to_owned),
            },
        }
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

/// A JSON string's value, borrowed when it has no escape; `None` when `raw` is not a string.
fn string_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
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
    parse_ref(line).map(MessageRef::into_owned)
}

/// [`parse`] without copying: the method and the raw params or result borrow from `line`.
pub fn parse_ref(line: &[u8]) -> Result<MessageRef<'_>, EnvelopeError> {
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
        let params = wire.params;
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
            outcome: Ok(result),
        }),
        (None, Some(error)) => {
            let error = error
                .get()
                .starts_with('{')
                .then(|| serde_json::from_str::<RpcError>(error.get()).ok())
                .flatten()
                .ok_or_else(|| invalid("error must be an object with a code and a message"))?;
            Ok(MessageRef::Response {
                id,
                outcome: Err(error),
            })
        }
        (Some(_), Some(_)) => Err(invalid("a response has both result and error")),
        (None, None) => Err(invalid("neither a request, a notification nor a response")),
    }
}
