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

use crate::session_routes::names_a_session;

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
    let fields = crate::session_routes::entries(text)?;
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
    // `…SessionId` keys name sessions too (they are remapped on the slow path).
    static NAMED: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"SessionId\""));
    let bytes = rest.as_bytes();
    KEY.find(bytes).is_none() && ESCAPE.find(bytes).is_none() && NAMED.find(bytes).is_none()
}

/// The first key that appears twice in one object on a message's routing path: `sessionId`
/// and `update` of the top-level params object, and at any depth any key that names a session
/// (`sessionId`, `…SessionId`) or `sessionUpdate` (an update's kind decides whether a session
/// is announced). Keys are compared decoded (`"session\u0049d"` is `sessionId`). A peer
/// that writes such a key twice means one thing to a reader that takes the first and another
/// to one that takes the last, so acpd refuses the message instead of guessing.
///
/// Cheap when nothing is doubled: without a `\u` escape, a key can only be doubled if its
/// plain spelling occurs twice, so text where each occurs at most once needs no parse.
pub fn duplicate_routing_key(params: &str) -> Option<String> {
    if !params.contains("\\u")
        && [
            r#""sessionId""#,
            r#"SessionId""#,
            r#""sessionUpdate""#,
            r#""update""#,
        ]
        .iter()
        .all(|k| params.matches(k).nth(1).is_none())
    {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(params);
    // Not JSON: whoever parses it next refuses it; nothing here to route on.
    serde::de::DeserializeSeed::deserialize(Walk { top: true }, &mut de)
        .ok()
        .flatten()
}

/// Walks one JSON value for [`duplicate_routing_key`]; `top` for the params object itself.
struct Walk {
    top: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for Walk {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Option<String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(f) = seq.next_element_seed(Walk { top: false })? {
            found = found.or(f);
        }
        Ok(found)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen: Vec<std::borrow::Cow<'de, str>> = Vec::new();
        let mut found = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let routing =
                names_a_session(&key) || key == "sessionUpdate" || (self.top && key == "update");
            if routing {
                if found.is_none() && seen.contains(&key) {
                    found = Some(key.to_string());
                }
                seen.push(key);
            }
            let inner = map.next_value_seed(Walk { top: false })?;
            found = found.or(inner);
        }
        Ok(found)
    }
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
    fn no_session_id_is_none() {
        assert!(with_session_id(&raw(r#"{"a":1}"#), "m").is_none());
        assert!(with_session_id(&raw(r#"[1]"#), "m").is_none());
        assert!(session_id(&raw(r#"{"a":1}"#)).is_none());
        // Regression (fuzz): an array is read by position by serde's derived deserialiser.
        assert!(session_id(&raw(r#"["] "]"#)).is_none());
        assert!(session_id(&raw(r#"["acpd-1",{"sessionUpdate":"x"}]"#)).is_none());
        assert!(session_id(&raw(r#"{"sessionId":5}"#)).is_none());
    }

    #[test]
    fn doubled_routing_keys_are_found_however_spelled_and_wherever_they_route() {
        for (text, key) in [
            (
                r#"{"sessionId":"a","update":{},"sessionId":"b"}"#,
                "sessionId",
            ),
            (r#"{"sessionId":"a","session\u0049d":"b"}"#, "sessionId"),
            (
                r#"{"sessionId":"a","update":{"x":1},"update":{"y":2}}"#,
                "update",
            ),
            (
                r#"{"sessionId":"a","update":{"sessionUpdate":"x","sessionUpdate":"subagent_update"}}"#,
                "sessionUpdate",
            ),
            (
                r#"{"sessionId":"a","update":{"senderSessionId":"x","senderSessionId":"y"}}"#,
                "senderSessionId",
            ),
            (
                r#"{"list":[{"sessionId":"a","sessionId":"b"}]}"#,
                "sessionId",
            ),
            (r#"[{"sessionId":"a","sessionId":"b"}]"#, "sessionId"),
        ] {
            assert_eq!(duplicate_routing_key(text).as_deref(), Some(key), "{text}");
        }
        for text in [
            r#"{"sessionId":"a","update":{"sessionUpdate":"x","sessionId":"b"}}"#,
            r#"{"sessionId":"a","update":{"text":"\"sessionId\":1,\"sessionId\":2 \u0041"}}"#,
            r#"{"sessionId":"a","update":{"content":{"a":1,"a":2}}}"#,
            r#"{"senderSessionId":"a","recipientSessionId":"b"}"#,
            r#"{"sessionId":"a","x":{"update":1,"update":2}}"#,
            "not json",
        ] {
            assert_eq!(duplicate_routing_key(text), None, "{text}");
        }
    }

    /// `key` as a JSON string, plain or with the character at `escape` written as `\uXXXX`.
    fn spell(key: &str, escape: Option<usize>) -> String {
        match escape {
            None => format!("\"{key}\""),
            Some(i) => {
                let i = i % key.len();
                format!(
                    "\"{}\\u{:04x}{}\"",
                    &key[..i],
                    key.as_bytes()[i],
                    &key[i + 1..]
                )
            }
        }
    }

    proptest::proptest! {
        /// A routing key written twice into any object of the path (the params, or an object
        /// nested at any depth) is always found, whatever else the object holds and however
        /// the key is spelled; the same message with the key once is never refused.
        #[test]
        fn a_doubled_routing_key_is_always_found(
            key in proptest::prop_oneof![
                proptest::strategy::Just("sessionId"),
                proptest::strategy::Just("senderSessionId"),
                proptest::strategy::Just("sessionUpdate"),
            ],
            depth in 0usize..4,
            filler in proptest::collection::vec(("[a-z]{1,6}", "[a-z0-9 ]{0,8}"), 0..4),
            first in 0usize..5,
            esc_a in proptest::option::of(0usize..16),
            esc_b in proptest::option::of(0usize..16),
        ) {
            let a = spell(key, esc_a);
            let b = spell(key, esc_b);
            let mut fields: Vec<String> = filler
                .iter()
                .filter(|(k, _)| !names_a_session(k) && k != "update")
                .map(|(k, v)| format!("\"{k}\":\"{v}\""))
                .collect();
            let once = fields.clone();
            let at = first.min(fields.len());
            fields.insert(at, format!("{a}:\"one\""));
            fields.push(format!("{b}:\"two\""));
            let mut twice = format!("{{{}}}", fields.join(","));
            let mut single = {
                let mut f = once;
                f.insert(at.min(f.len()), format!("{a}:\"one\""));
                format!("{{{}}}", f.join(","))
            };
            for _ in 0..depth {
                twice = format!("{{\"sessionId\":\"own\",\"update\":{twice}}}");
                single = format!("{{\"sessionId\":\"own\",\"update\":{single}}}");
            }
            let found = duplicate_routing_key(&twice);
            proptest::prop_assert_eq!(found.as_deref(), Some(key), "{}", twice);
            proptest::prop_assert_eq!(duplicate_routing_key(&single), None, "{}", single);
        }
    }
}
