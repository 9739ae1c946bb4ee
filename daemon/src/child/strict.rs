//! What acpd accepts from a child (a child is untrusted input): an update must carry exactly
//! one `sessionId`, the child's own; any other method of ACP (stable, unstable, or one acpd has
//! never heard of) and any extension passes, as a transparent bridge's must, except acpd's own
//! (`_acpd/…`), which only acpd speaks. Which capability a method needs of the parent is the
//! relay's to check.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// Whether a child's notification may be forwarded at all: anything but acpd's own.
pub(super) fn forwardable(method: &str) -> bool {
    !method.starts_with("_acpd/")
}

/// Whether a child may send this request to a parent at all: anything but acpd's own.
pub(super) fn forwardable_request(method: &str) -> bool {
    !method.starts_with("_acpd/")
}

/// A client capability a method of the child's needs the parent to have advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    /// `fs.readTextFile`
    ReadTextFile,
    /// `fs.writeTextFile`
    WriteTextFile,
    /// `terminal`
    Terminal,
    /// `elicitation`
    Elicitation,
}

/// What a parent must have advertised before a child may send it `method` (a request or a
/// notification); `None`: nothing (every other method, `session/update`'s kinds included, is
/// the parent's to take or answer with -32601).
pub(super) fn needs_of_parent(method: &str) -> Option<Need> {
    match method {
        "fs/read_text_file" => Some(Need::ReadTextFile),
        "fs/write_text_file" => Some(Need::WriteTextFile),
        m if m.starts_with("terminal/") => Some(Need::Terminal),
        m if m.starts_with("elicitation/") => Some(Need::Elicitation),
        _ => None,
    }
}

/// The `sessionId` keys of a params object: how many, and the first one's string value.
pub(super) struct SessionKeys<'a> {
    pub count: usize,
    pub value: Option<Cow<'a, str>>,
    pub update: Option<&'a RawValue>,
}

/// Reads the top-level keys of `params` (values stay raw). `None` when it is not an object.
pub(super) fn session_keys(params: &RawValue) -> Option<SessionKeys<'_>> {
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
pub(super) fn own_update<'a>(
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

/// The rest of a `session/update`'s params text after its leading `{"sessionId":<own>` (JSON
/// whitespace allowed around the key, the colon and the value, as `json.dumps` writes it), when
/// it certainly has no other `sessionId` key: the hot path's check, with no JSON parse. `own` is
/// the child's session id as a JSON string literal. Anything unusual (another `"sessionId"`
/// anywhere, any `\u` escape that could spell one) is `None` and goes the slow way through
/// [`own_update`].
pub(super) fn fast_own<'a>(params: &'a str, own: &str) -> Option<&'a str> {
    const WS: [char; 4] = [' ', '\t', '\n', '\r'];
    let after = |text: &'a str, token: &str| text.trim_start_matches(WS).strip_prefix(token);
    let value = after(after(after(params, "{")?, "\"sessionId\"")?, ":")?;
    // `own` is a whole string token: its closing quote is the value's.
    let rest = after(value, own)?;
    let next = rest.trim_start_matches(WS);
    (matches!(next.as_bytes().first(), Some(b',' | b'}'))
        && acpd_protocol::session_id::surely_no_session_id_key(rest)
        && at_most_once(rest, &UPDATE)
        && at_most_once(rest, &KIND))
    .then_some(rest)
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
pub(super) fn doubled(params: &RawValue) -> Option<String> {
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
        let own = r#""s1""#;
        assert!(fast_own(r#"{"sessionId":"s1","update":{"a":1}}"#, own).is_some());
        // As Python's json.dumps writes it.
        assert_eq!(
            fast_own(r#"{"sessionId": "s1", "update": {"a": 1}}"#, own),
            Some(r#", "update": {"a": 1}}"#)
        );
        for text in [
            r#"{"sessionId":"s1","update":{},"sessionId":"s2"}"#,
            r#"{"sessionId":"s1","session\u0049d":"s2"}"#,
            r#"{"sessionId":"s10","update":{}}"#,
            r#"{"update":{},"sessionId":"s1"}"#,
            r#"{"sessionId":"s1","update":{"a":1},"update":{"b":2}}"#,
            r#"{"sessionId":"s1","update":{"sessionUpdate":"a","sessionUpdate":"b"}}"#,
            r#"{"sessionId":"s1","update":{"senderSessionId":"x"}}"#,
            r#"{"sessionId": "s1", "update": {}, "sessionId": "s2"}"#,
            r#"{"sessionId":"s1"x,"update":{}}"#,
            r#"{"sessionId""s1","update":{}}"#,
        ] {
            assert!(fast_own(text, own).is_none(), "{text}");
        }
    }

    #[test]
    fn acpd_methods_never_come_from_a_child() {
        assert!(forwardable("session/update"));
        assert!(forwardable("_zed/thing"));
        assert!(!forwardable("_acpd/subagent/ended"));
        // Everything else passes, methods newer than acpd included.
        assert!(forwardable("elicitation/complete"));
        assert!(forwardable("$/cancel_request"));
        assert!(forwardable("session/some_future_notification"));
        assert!(!forwardable_request("_acpd/subagent/start"));
        assert!(forwardable_request("elicitation/create"));
        assert!(forwardable_request("session/some_future_request"));
    }

    #[test]
    fn capability_gated_methods_name_what_they_need() {
        assert_eq!(
            needs_of_parent("fs/read_text_file"),
            Some(Need::ReadTextFile)
        );
        assert_eq!(
            needs_of_parent("fs/write_text_file"),
            Some(Need::WriteTextFile)
        );
        assert_eq!(needs_of_parent("terminal/create"), Some(Need::Terminal));
        assert_eq!(
            needs_of_parent("elicitation/create"),
            Some(Need::Elicitation)
        );
        assert_eq!(
            needs_of_parent("elicitation/complete"),
            Some(Need::Elicitation)
        );
        assert_eq!(needs_of_parent("session/update"), None);
        assert_eq!(needs_of_parent("_zed/thing"), None);
    }
}
