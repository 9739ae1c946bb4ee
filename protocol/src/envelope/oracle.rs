//! The envelope parse as it was before the single-pass scan: serde_json reads the line into the
//! six raw fields. Kept as the oracle the scan is held to, by the unit tests and (feature
//! `oracle`) by the fuzz target.

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::value::RawValue;

use super::parse::{EnvelopeError, MessageRef, classify};
use super::scan::{Fields, ParamsKeys};

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
        keys: Default::default(),
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
    let keys = match super::parse_keyed(line) {
        Ok((_, keys)) => keys_disagree(keys, line),
        Err(_) => None,
    };
    if let Some(why) = keys {
        return Some(format!("{:?}\n {why}", String::from_utf8_lossy(line)));
    }
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

/// Why the scan's count of the params' keys differs from serde_json's, if it does.
fn keys_disagree(scanned: ParamsKeys<'_>, line: &[u8]) -> Option<String> {
    let wire: Wire<'_> = serde_json::from_slice(line).ok()?;
    let expected = match wire
        .params
        .map(RawValue::get)
        .filter(|p| p.starts_with('{'))
    {
        None => Ok(ParamsKeys::default()),
        Some(text) => params_keys_serde(text),
    };
    match expected {
        Ok(e) if e == scanned => None,
        // serde_json could not decode a key (a lone surrogate): it was written with an escape.
        Err(Unread::Undecodable) if scanned.escaped => None,
        Err(Unread::TooDeep) => None,
        e => Some(format!("keys: scan {scanned:?}, serde {e:?}")),
    }
}

/// Why serde_json's count of the keys is not known.
#[derive(Debug)]
pub enum Unread {
    /// A key cannot be decoded (a lone surrogate).
    Undecodable,
    /// Nested deeper than this walk recurses.
    TooDeep,
}

/// [`ParamsKeys`] of a params object as serde_json reads its keys.
pub fn params_keys_serde(params: &str) -> Result<ParamsKeys<'_>, Unread> {
    let mut keys = ParamsKeys::default();
    walk(params, 0, &mut keys)?;
    Ok(keys)
}

/// Counts the keys of one value (objects and arrays at any depth) into `keys`; values stay
/// raw, so a string value is never decoded.
fn walk<'a>(text: &'a str, depth: usize, keys: &mut ParamsKeys<'a>) -> Result<(), Unread> {
    if depth > 100 {
        return Err(Unread::TooDeep);
    }
    let top = depth == 0;
    if text.starts_with('[') {
        let items =
            serde_json::from_str::<Vec<&RawValue>>(text).map_err(|_| Unread::Undecodable)?;
        for item in items {
            walk(item.get(), depth + 1, keys)?;
        }
        return Ok(());
    }
    if !text.starts_with('{') {
        return Ok(());
    }
    // A key serde_json had to decode (it held an escape) comes owned.
    let entries = crate::session_routes::entries(text).ok_or(Unread::Undecodable)?;
    for (key, value) in entries {
        match key {
            std::borrow::Cow::Owned(_) => keys.escaped = true,
            std::borrow::Cow::Borrowed("sessionId") if top => {
                if keys.session_ids == 0 && value.get().starts_with('"') {
                    keys.session_id = Some(value.get());
                }
                keys.session_ids += 1;
            }
            std::borrow::Cow::Borrowed("update") if top => keys.updates += 1,
            std::borrow::Cow::Borrowed("sessionUpdate") => keys.session_updates += 1,
            std::borrow::Cow::Borrowed(k) if crate::session_routes::names_a_session(k) => {
                keys.other_sessions += 1
            }
            std::borrow::Cow::Borrowed(_) => {}
        }
        walk(value.get(), depth + 1, keys)?;
    }
    Ok(())
}
