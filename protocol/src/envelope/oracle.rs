//! The envelope parse as it was before the single-pass scan: serde_json reads the line into the
//! six raw fields. Kept (tests only) as the oracle the scan is held to.

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::value::RawValue;

use super::parse::{EnvelopeError, MessageRef, classify};
use super::scan::Fields;

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

/// `parse_ref` as serde_json decided it.
pub(super) fn parse_ref_serde(line: &[u8]) -> Result<MessageRef<'_>, EnvelopeError> {
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
    classify(Fields {
        jsonrpc: wire.jsonrpc.map(RawValue::get),
        id: wire.id.map(RawValue::get),
        method: wire.method.map(RawValue::get),
        params: wire.params.map(RawValue::get),
        result: wire.result.map(RawValue::get),
        error: wire.error.map(RawValue::get),
    })
}
