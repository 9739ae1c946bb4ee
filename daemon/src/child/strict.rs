//! What acpd accepts from a child (a child is untrusted input): an update must carry exactly
//! one `sessionId`, the child's own; a child's notification goes anywhere only if it is ACP's
//! (`session/update`) or an extension (`_…`), and never acpd's own (`_acpd/…`).

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// Whether a child's notification may be forwarded at all.
pub fn forwardable(method: &str) -> bool {
    method == "session/update" || (method.starts_with('_') && !method.starts_with("_acpd/"))
}

/// Whether a child may send this request to a parent at all (beyond the ACP client methods).
pub fn forwardable_request(method: &str) -> bool {
    method.starts_with('_') && !method.starts_with("_acpd/")
}

/// The `sessionId` keys of a params object: how many, and the first one's string value.
pub struct SessionKeys<'a> {
    pub count: usize,
    pub value: Option<Cow<'a, str>>,
    pub update: Option<&'a RawValue>,
}

/// Reads the top-level keys of `params` (values stay raw). `None` when it is not an object.
pub fn session_keys(params: &RawValue) -> Option<SessionKeys<'_>> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = SessionKeys<'de>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut keys = SessionKeys {
                count: 0,
                value: None,
                update: None,
            };
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                let value: &'de RawValue = map.next_value()?;
                match key.as_ref() {
                    "sessionId" => {
                        keys.count += 1;
                        if keys.count == 1 {
                            keys.value = serde_json::from_str::<Cow<'de, str>>(value.get())
                                .ok()
                                .map(|s| Cow::Owned(s.into_owned()));
                        }
                    }
                    "update" if keys.update.is_none() => keys.update = Some(value),
                    _ => {}
                }
            }
            Ok(keys)
        }
    }
    let mut de = serde_json::Deserializer::from_str(params.get());
    de.deserialize_map(Keys).ok()
}

/// The `update` object of a child's `session/update`, when the params carry exactly one
/// `sessionId` and it is `own`; else why the update is dropped.
pub fn own_update<'a>(
    params: Option<&'a RawValue>,
    own: &str,
) -> Result<&'a RawValue, &'static str> {
    let params = params.ok_or("no params")?;
    let keys = session_keys(params).ok_or("params are not an object")?;
    match (keys.count, keys.value.as_deref()) {
        (0, _) => Err("no sessionId"),
        (1, Some(sid)) if sid == own => {
            if acpd_protocol::session_id::duplicate_routing_key(params.get()).is_some() {
                return Err("a routing key appears twice");
            }
            keys.update.ok_or("no update")
        }
        (1, _) => Err("another session's sessionId"),
        _ => Err("more than one sessionId"),
    }
}

/// Whether a `session/update`'s params text has `prefix` (`{"sessionId":"<own>"`) and
/// certainly no other `sessionId` key: the hot path's check, with no JSON parse. Anything
/// unusual (another `"sessionId"` anywhere, any `\u` escape that could spell one) returns false
/// and goes the slow way through [`own_update`].
pub fn fast_own(params: &str, prefix: &str) -> bool {
    let Some(rest) = params.strip_prefix(prefix) else {
        return false;
    };
    matches!(rest.as_bytes().first(), Some(b',' | b'}'))
        && acpd_protocol::session_id::surely_no_session_id_key(rest)
        && at_most_once(rest, &UPDATE)
        && at_most_once(rest, &KIND)
}

static UPDATE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"update\""));
static KIND: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"sessionUpdate\""));

/// Whether `finder`'s needle occurs at most once in `text` (a key written twice needs the slow
/// path's duplicate check).
fn at_most_once(text: &str, finder: &memchr::memmem::Finder<'_>) -> bool {
    let bytes = text.as_bytes();
    match finder.find(bytes) {
        None => true,
        Some(at) => finder.find(&bytes[at + 1..]).is_none(),
    }
}

/// Why a child's params are refused for a key written twice on the routing path (see
/// [`acpd_protocol::session_id::duplicate_routing_key`]).
pub fn doubled(params: &RawValue) -> Option<String> {
    acpd_protocol::session_id::duplicate_routing_key(params.get())
        .map(|key| format!("the key \"{key}\" appears twice"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn only_the_childs_own_single_session_id_passes() {
        let ok = raw(r#"{"sessionId":"s1","update":{"sessionUpdate":"x"}}"#);
        assert_eq!(
            own_update(Some(&ok), "s1").unwrap().get(),
            r#"{"sessionUpdate":"x"}"#
        );
        let cases = [
            (r#"{"update":{}}"#, "no sessionId"),
            (
                r#"{"sessionId":"s2","update":{}}"#,
                "another session's sessionId",
            ),
            (
                r#"{"sessionId":"s1","update":{},"sessionId":"s2"}"#,
                "more than one sessionId",
            ),
            (
                r#"{"sessionId":"s1","session\u0049d":"s2","update":{}}"#,
                "more than one sessionId",
            ),
            (
                r#"{"sessionId":7,"update":{}}"#,
                "another session's sessionId",
            ),
            (r#"[1]"#, "params are not an object"),
            (
                r#"{"sessionId":"s1","update":{"a":1},"update":{"b":2}}"#,
                "a routing key appears twice",
            ),
            (
                r#"{"sessionId":"s1","update":{"sessionUpdate":"x","sessionUpdate":"y"}}"#,
                "a routing key appears twice",
            ),
        ];
        for (text, why) in cases {
            assert_eq!(
                own_update(Some(&raw(text)), "s1").unwrap_err(),
                why,
                "{text}"
            );
        }
    }

    #[test]
    fn the_fast_path_never_admits_what_the_slow_path_rejects() {
        let prefix = r#"{"sessionId":"s1""#;
        assert!(fast_own(r#"{"sessionId":"s1","update":{"a":1}}"#, prefix));
        for text in [
            r#"{"sessionId":"s1","update":{},"sessionId":"s2"}"#,
            r#"{"sessionId":"s1","session\u0049d":"s2"}"#,
            r#"{"sessionId":"s10","update":{}}"#,
            r#"{"update":{},"sessionId":"s1"}"#,
            r#"{"sessionId":"s1","update":{"a":1},"update":{"b":2}}"#,
            r#"{"sessionId":"s1","update":{"sessionUpdate":"a","sessionUpdate":"b"}}"#,
            r#"{"sessionId":"s1","update":{"senderSessionId":"x"}}"#,
        ] {
            assert!(!fast_own(text, prefix), "{text}");
        }
    }

    #[test]
    fn acpd_methods_never_come_from_a_child() {
        assert!(forwardable("session/update"));
        assert!(forwardable("_zed/thing"));
        assert!(!forwardable("_acpd/subagent/ended"));
        assert!(!forwardable("session/cancel"));
        assert!(!forwardable_request("_acpd/subagent/start"));
    }
}
