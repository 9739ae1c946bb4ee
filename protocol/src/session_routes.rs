//! Where a child's params name sessions, and those names rewritten in place.
//!
//! ACP names a session in a few places only: the params' own `sessionId` (and any other
//! top-level `…SessionId`), the update's own keys (`subagent_update`'s `sessionId`, a
//! `session_message`'s `senderSessionId` / `recipientSessionId`), and a tool call's `session`
//! content (`update.content[].sessionId`). Everything else — a tool's `rawInput` and
//! `rawOutput`, `_meta`, text — is the agent's own data, forwarded as written even when a key
//! in it happens to be called `sessionId`.
//!
//! Two checks look further, on purpose: a routing key written twice anywhere
//! (`session_id::duplicate_routing_key`) is refused, and the scan's `ParamsKeys` counts naming
//! keys at any depth, so the hot path leaves every update that has one to the slow path, which
//! decides here.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::Deserializer;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// One place that names a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Where the value lies in the params text.
    pub span: Range<usize>,
    /// The session id, when the value is a string.
    pub id: Option<String>,
    /// The params' own top-level `sessionId`.
    pub own: bool,
}

/// Whether a key names a session: `sessionId` itself or any `…SessionId`
/// (`senderSessionId`, `recipientSessionId`, …).
pub(crate) fn names_a_session(key: &str) -> bool {
    key == "sessionId" || key.ends_with("SessionId")
}

/// Every place in `params` that names a session, in the order of the text; `None` when
/// `params` is not a JSON object.
pub fn routes(params: &str) -> Option<Vec<Route>> {
    let mut out = Vec::new();
    for (key, value) in entries(params)? {
        if names_a_session(&key) {
            out.push(route(params, value, key == "sessionId"));
        } else if key == "update" {
            for (key, value) in entries(value.get()).unwrap_or_default() {
                if names_a_session(&key) {
                    out.push(route(params, value, false));
                } else if key == "content" {
                    let items: Vec<&RawValue> =
                        serde_json::from_str(value.get()).unwrap_or_default();
                    for item in items {
                        for (key, value) in entries(item.get()).unwrap_or_default() {
                            if key == "sessionId" {
                                out.push(route(params, value, false));
                            }
                        }
                    }
                }
            }
        }
    }
    Some(out)
}

/// Whether `params` names a session anywhere but in its own top-level `sessionId` (see the
/// module's doc for where). `false` for text that is not a JSON object.
pub fn names_other_sessions(params: &str) -> bool {
    // Past a leading `"sessionId"` (the params' own), text with no naming key spelled plainly
    // and no escape names no other session.
    let rest = params
        .trim_start()
        .strip_prefix('{')
        .map(str::trim_start)
        .and_then(|r| r.strip_prefix("\"sessionId\""))
        .unwrap_or(params);
    if crate::session_id::surely_no_session_id_key(rest) {
        return false;
    }
    routes(params).is_some_and(|routes| routes.iter().any(|r| !r.own))
}

/// Whether any key in `value`, at any depth, names a session (decoded); `true` as well for a
/// value nested too deep to look into (128 levels) or that is not JSON, so a caller that
/// refuses what names a session refuses what it cannot check.
pub fn names_a_session_anywhere(value: &str) -> bool {
    if !value.contains("essionId") && !value.contains("\\u") {
        return false;
    }
    fn walk(text: &str, depth: usize) -> bool {
        if depth > 128 {
            return true;
        }
        if text.starts_with('[') {
            return match serde_json::from_str::<Vec<&RawValue>>(text) {
                Ok(items) => items.iter().any(|i| walk(i.get(), depth + 1)),
                Err(_) => true,
            };
        }
        if !text.starts_with('{') {
            return false;
        }
        match entries(text) {
            Some(entries) => entries
                .iter()
                .any(|(k, v)| names_a_session(k) || walk(v.get(), depth + 1)),
            None => true,
        }
    }
    walk(value.trim_start(), 0)
}

/// `params` with every session id at its routing places (the own one included) replaced by
/// what `map` gives for it; the rest of the text stays as written. `Err` names the first id
/// `map` does not know. A value there that is not a string is left as it is.
pub fn remap_routes(
    params: &str,
    mut map: impl FnMut(&str) -> Option<String>,
) -> Result<String, String> {
    let routes = routes(params).ok_or_else(|| "the params are not a JSON object".to_string())?;
    let mut out = String::with_capacity(params.len() + 32);
    let mut done = 0;
    for r in routes {
        let Some(id) = r.id else { continue };
        let to = map(&id).ok_or(id)?;
        out.push_str(&params[done..r.span.start]);
        out.push_str(&crate::envelope::json_string(&to));
        done = r.span.end;
    }
    out.push_str(&params[done..]);
    Ok(out)
}

fn route(params: &str, value: &RawValue, own: bool) -> Route {
    let text = value.get();
    Route {
        span: span_in(params, text).unwrap_or(0..0),
        id: serde_json::from_str::<String>(text).ok(),
        own,
    }
}

/// Where `inner`, a slice of `outer` (a raw value borrowed from its text, say), lies in it.
pub fn span_in(outer: &str, inner: &str) -> Option<Range<usize>> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some(start..end)
}

/// The entries of a JSON object as written (keys decoded, values raw and borrowed, in order,
/// duplicates kept); `None` when `text` is not one.
pub fn entries(text: &str) -> Option<Vec<(Cow<'_, str>, &RawValue)>> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<(Cow<'de, str>, &'de RawValue)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(key) = map.next_key::<Key<'de>>()? {
                out.push((key.0, map.next_value()?));
            }
            Ok(out)
        }
    }
    if !text.starts_with('{') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    (&mut de).deserialize_map(Entries).ok()
}

/// A key, borrowed from the text when it holds no escape.
struct Key<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E>(self, k: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(k)))
            }
            fn visit_str<E>(self, k: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(k.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_routing_places_name_other_sessions() {
        for (params, names) in [
            (
                r#"{"sessionId":"s","update":{"text":"caf\u00e9 \u001b[31m"}}"#,
                false,
            ),
            (
                r#"{"sessionId":"s","update":{"text":"let parentSessionId"}}"#,
                false,
            ),
            (
                r#"{"sessionId":"s","update":{"text":"\"sessionId\": 2"}}"#,
                false,
            ),
            (
                r#"{"update":{"a":["sessionId","xSessionId"]},"sessionId":"s"}"#,
                false,
            ),
            // A tool's own data: its input, its output, `_meta`.
            (
                r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call","rawInput":{"sessionId":"abc"}}}"#,
                false,
            ),
            (
                r#"{"sessionId":"s","update":{"rawOutput":{"parentSessionId":"z"},"_meta":{"c":{"sessionId":1}}}}"#,
                false,
            ),
            (
                r#"{"sessionId":"s","update":{"content":[{"type":"content","content":{"x":{"sessionId":"t"}}}]}}"#,
                false,
            ),
            (r#"{"sessionId":"s","sessionId":"t"}"#, false),
            ("[\"sessionId\",\"x\\u0041\"]", false),
            // The places that route.
            (
                r#"{"sessionId":"s","update":{"sessionUpdate":"subagent_update","sessionId":"t"}}"#,
                true,
            ),
            (
                r#"{"sessionId":"s","update":{"senderSessionId":"t"}}"#,
                true,
            ),
            (r#"{"sessionId":"s","update":{"session\u0049d":"t"}}"#, true),
            (r#"{"sessionId":"s","parentSessionId":"p"}"#, true),
            (
                r#"{"sessionId":"s","update":{"content":[{"type":"session","sessionId":"t"}]}}"#,
                true,
            ),
            // One plain `sessionId`, not the params' own.
            (
                r#"{"update":{"sessionUpdate":"subagent_update","sessionId":"t"}}"#,
                true,
            ),
            (r#" { "sessionId" : "s", "update":{}}"#, false),
        ] {
            assert_eq!(names_other_sessions(params), names, "{params}");
        }
    }

    #[test]
    fn a_session_named_anywhere_is_found_and_what_cannot_be_looked_into_counts_as_named() {
        for (value, named) in [
            (r#"[1,{"a":[{"toolSessionId":"x"}]}]"#, true),
            (r#"[{"session\u0049d":"x"}]"#, true),
            (r#"[{"x":"sessionId"},"parentSessionId"]"#, false),
            (r#"[1,2,{"a":"\u0041"}]"#, false),
        ] {
            assert_eq!(names_a_session_anywhere(value), named, "{value}");
        }
        let deep = format!("{}\"sessionId\"{}", "[".repeat(200), "]".repeat(200));
        assert!(names_a_session_anywhere(&deep));
    }

    #[test]
    fn remapping_rewrites_only_the_ids_at_routing_places_and_names_an_unknown_one() {
        let params = r#"{ "sessionId" : "own", "update":{"sessionUpdate":"session_message","senderSessionId":"sub","n":1e2,"rawInput":{"sessionId":"own","big":12345678901234567890123},"content":[{"type":"session","sessionId":"sub"}],"text":"sessionId"}}"#;
        let map = |id: &str| match id {
            "own" => Some("A".to_string()),
            "sub" => Some("A.1".to_string()),
            _ => None,
        };
        assert_eq!(
            remap_routes(params, map).unwrap(),
            r#"{ "sessionId" : "A", "update":{"sessionUpdate":"session_message","senderSessionId":"A.1","n":1e2,"rawInput":{"sessionId":"own","big":12345678901234567890123},"content":[{"type":"session","sessionId":"A.1"}],"text":"sessionId"}}"#
        );
        assert_eq!(
            remap_routes(
                r#"{"sessionId":"own","update":{"recipientSessionId":"other"}}"#,
                map
            ),
            Err("other".to_string())
        );
        assert_eq!(
            remap_routes(r#"{"sessionId":"own","update":{"sessionId":7}}"#, map).unwrap(),
            r#"{"sessionId":"A","update":{"sessionId":7}}"#
        );
    }
}
