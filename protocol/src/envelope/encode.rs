//! Messages written as one JSON line each; a peer's id is written back byte for byte.

use serde::Serialize;
use serde_json::value::RawValue;

use super::{Id, RpcError};

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
