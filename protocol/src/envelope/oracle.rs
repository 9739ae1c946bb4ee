//! The envelope parse as it was before the single-pass scan: serde_json reads the line into the
//! six raw fields. Kept as the oracle the scan is held to, by the unit tests and (feature
//! `oracle`) by the fuzz target.

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

/// A typical forwarded update: 272 bytes, as the echo agent streams them (the tests' seed and
/// the bench's parse row).
pub const TYPICAL_UPDATE: &str = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_4f1c2a9e-7b3d-4e8a-9c1f-2d6b8e0a5c37","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"The quick brown fox jumps over the lazy dog, twice; then naps \u2014 all done"}}}}"#;

fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// `parse_ref` as serde_json decided it.
pub fn parse_ref_serde(line: &[u8]) -> Result<MessageRef<'_>, EnvelopeError> {
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

/// Why two verdicts differ, or `None` when they agree: the same message (method, id, the raw
/// params or result as the same bytes of the line), or the same kind of error with the same id
/// and, apart from serde_json's own wording, the same reason.
pub fn disagreement(line: &[u8]) -> Option<String> {
    let new = super::parse_ref(line);
    let old = parse_ref_serde(line);
    let same = match (&new, &old) {
        (Ok(n), Ok(o)) => format!("{n:?}") == format!("{o:?}") && spans(n) == spans(o),
        (Err(EnvelopeError::NotJson(_)), Err(EnvelopeError::NotJson(_))) => true,
        (
            Err(EnvelopeError::Invalid { id: ni, reason: nr }),
            Err(EnvelopeError::Invalid { id: oi, reason: or }),
        ) => {
            let dup = "each envelope key may appear once";
            ni == oi && (nr == or || nr.ends_with(dup) && or.ends_with(dup))
        }
        _ => false,
    };
    (!same).then(|| {
        format!(
            "{:?}\n scan:  {new:?}\n serde: {old:?}",
            String::from_utf8_lossy(line)
        )
    })
}

/// Where the raw values lie in the line (the same text at another place would be a bug).
fn spans(m: &MessageRef<'_>) -> Option<*const u8> {
    match m {
        MessageRef::Request { params, .. } | MessageRef::Notification { params, .. } => {
            params.map(|p| p.get().as_ptr())
        }
        MessageRef::Response { outcome, .. } => outcome.as_ref().ok().map(|r| r.get().as_ptr()),
    }
}
