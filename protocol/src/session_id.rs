//! Rewriting the `sessionId` of a message's params without re-serialising anything else.
//!
//! A bridge maps one parent-facing session id to one child session id; every forwarded
//! `session/*` message differs from its original only in that field. The common shape —
//! `sessionId` first, a plain string — is spliced as text; anything else goes through an
//! order-preserving parse of the top-level object whose values stay raw.

use std::fmt;

use serde::Deserializer;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

const PREFIX: &str = "{\"sessionId\":\"";

/// The `sessionId` of `params`, if it is an object with exactly one top-level `sessionId` key,
/// a string.
pub fn session_id(params: &RawValue) -> Option<String> {
    // The derived deserialiser would also read a JSON array by position (found by the fuzz
    // target: `["x"]` had the session id `x`).
    if !params.get().starts_with('{') {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Only {
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
    }
    serde_json::from_str::<Only>(params.get()).ok()?.session_id
}

/// `params` with its top-level `sessionId` set to `to`. `None` when `params` is not an object
/// or has no `sessionId`.
pub fn with_session_id(params: &RawValue, to: &str) -> Option<Box<RawValue>> {
    RawValue::from_string(splice_session_id(params.get(), to)?).ok()
}

/// The text of `params` (valid JSON) with its top-level `sessionId` set to `to`. The result is
/// valid JSON by construction, so the hot path can send it without parsing it again. `None` when
/// `text` is not an object, has no top-level `sessionId`, or has more than one (however the
/// keys are spelled: `"session\u0049d"` is `sessionId` too), so a message never leaves with a
/// second session id beside the one written here.
pub fn splice_session_id(text: &str, to: &str) -> Option<String> {
    if let Some(rest) = text.strip_prefix(PREFIX)
        && let Some(end) = rest.find('"')
        && !rest[..end].contains('\\')
        && surely_no_session_id_key(&rest[end + 1..])
    {
        let mut out = String::with_capacity(text.len() + to.len());
        out.push_str("{\"sessionId\":");
        out.push_str(&crate::envelope::json_string(to));
        out.push_str(&rest[end + 1..]);
        return Some(out);
    }
    let fields = parse_fields(text)?;
    let mut found = 0;
    let mut out = String::with_capacity(text.len() + to.len());
    out.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(key).ok()?);
        out.push(':');
        if key == "sessionId" {
            found += 1;
            out.push_str(&serde_json::to_string(to).ok()?);
        } else {
            out.push_str(value.get());
        }
    }
    out.push('}');
    (found == 1).then_some(out)
}

/// Whether the text after a leading `"sessionId":"…"` surely holds no other key that decodes to
/// `sessionId`: such a key is either spelled plainly or uses a `\u` escape, so text with neither
/// (anywhere, nested or inside strings included) needs no parse. A hot path that splices a
/// known prefix itself must check the rest with this (or fall back to [`splice_session_id`]).
pub fn surely_no_session_id_key(rest: &str) -> bool {
    use memchr::memmem::Finder;
    use std::sync::LazyLock;
    // Built once: on the hot path a finder's set-up costs more than the search.
    static KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"sessionId\""));
    static ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\\u"));
    let bytes = rest.as_bytes();
    KEY.find(bytes).is_none() && ESCAPE.find(bytes).is_none()
}

/// Whether a key names a session: `sessionId` itself or any `…SessionId`
/// (`senderSessionId`, `recipientSessionId`, …).
fn names_a_session(key: &str) -> bool {
    key == "sessionId" || key.ends_with("SessionId")
}

/// Rewrites every session id in `value`, at any depth: each string under a key that names a
/// session goes through `map`. The slow path of a relay whose child reports sessions of its
/// own (Subagent Sessions), where ids appear nested (`subagent_update`, `session_message`).
/// `Err` names the first id `map` does not know; `value` is then partly rewritten and must
/// not be sent.
pub fn remap_session_ids(
    value: &mut serde_json::Value,
    map: &mut impl FnMut(&str) -> Option<String>,
) -> Result<(), String> {
    match value {
        serde_json::Value::Object(fields) => {
            for (key, v) in fields.iter_mut() {
                if names_a_session(key)
                    && let serde_json::Value::String(id) = v
                {
                    *id = map(id).ok_or_else(|| id.clone())?;
                } else {
                    remap_session_ids(v, map)?;
                }
            }
            Ok(())
        }
        serde_json::Value::Array(items) => {
            items.iter_mut().try_for_each(|v| remap_session_ids(v, map))
        }
        _ => Ok(()),
    }
}

fn parse_fields(text: &str) -> Option<Vec<(String, &RawValue)>> {
    struct Fields;
    impl<'de> Visitor<'de> for Fields {
        type Value = Vec<(String, &'de RawValue)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    (&mut de).deserialize_map(Fields).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn fast_path_splices_the_leading_id() {
        let p =
            raw(r#"{"sessionId":"child-1","update":{"sessionUpdate":"x","sessionId":"inner"}}"#);
        let out = with_session_id(&p, "acpd-9").unwrap();
        assert_eq!(
            out.get(),
            r#"{"sessionId":"acpd-9","update":{"sessionUpdate":"x","sessionId":"inner"}}"#
        );
    }

    #[test]
    fn slow_path_keeps_order_and_raw_values() {
        let p = raw(r#"{ "prompt": [ {"type":"text","text":"a\"b"} ], "sessionId" : "c\u0031" }"#);
        let out = with_session_id(&p, "m").unwrap();
        assert_eq!(
            out.get(),
            r#"{"prompt":[ {"type":"text","text":"a\"b"} ],"sessionId":"m"}"#
        );
        assert_eq!(session_id(&p).as_deref(), Some("c1"));
    }

    #[test]
    fn a_second_session_id_is_refused_however_it_is_spelled() {
        for text in [
            r#"{"sessionId":"a","x":1,"sessionId":"b"}"#,
            r#"{"sessionId":"a","session\u0049d":"b"}"#,
            r#"{"x":1,"sessionId":"a","sessionId":"b"}"#,
            r#"{"sessionId":5,"sessionId":"b"}"#,
        ] {
            assert_eq!(splice_session_id(text, "m"), None, "{text}");
            assert_eq!(session_id(&raw(text)), None, "{text}");
        }
        // Nested or quoted mentions are not keys of the top-level object.
        let text = r#"{"sessionId":"a","update":{"sessionId":"b","t":"\"sessionId\" \u0041"}}"#;
        assert_eq!(
            splice_session_id(text, "m").as_deref(),
            Some(r#"{"sessionId":"m","update":{"sessionId":"b","t":"\"sessionId\" \u0041"}}"#)
        );
    }

    #[test]
    fn remap_rewrites_nested_ids_and_names_an_unknown_one() {
        let mut v: serde_json::Value = serde_json::from_str(
            r#"{"sessionId":"own","update":{"sessionUpdate":"session_message","senderSessionId":"sub","list":[{"sessionId":"own"}],"text":"sessionId"}}"#,
        )
        .unwrap();
        let mut map = |id: &str| match id {
            "own" => Some("A".to_string()),
            "sub" => Some("A.1".to_string()),
            _ => None,
        };
        remap_session_ids(&mut v, &mut map).unwrap();
        assert_eq!(
            v.to_string(),
            r#"{"sessionId":"A","update":{"sessionUpdate":"session_message","senderSessionId":"A.1","list":[{"sessionId":"A"}],"text":"sessionId"}}"#
        );
        let mut v =
            serde_json::json!({"sessionId": "own", "update": {"recipientSessionId": "other"}});
        assert_eq!(
            remap_session_ids(&mut v, &mut map),
            Err("other".to_string())
        );
    }

    #[test]
    fn no_session_id_is_none() {
        assert!(with_session_id(&raw(r#"{"a":1}"#), "m").is_none());
        assert!(with_session_id(&raw(r#"[1]"#), "m").is_none());
        assert!(session_id(&raw(r#"{"a":1}"#)).is_none());
        // Regression (fuzz): an array is read by position by serde's derived deserialiser.
        assert!(session_id(&raw(r#"["] "]"#)).is_none());
        assert!(session_id(&raw(r#"["acpd-1",{"sessionUpdate":"x"}]"#)).is_none());
        assert!(session_id(&raw(r#"{"sessionId":5}"#)).is_none());
    }
}
