//! What acpd accepts from a child (a child is untrusted input): an update must carry exactly
//! one `sessionId`, the child's own; any other method of ACP (stable, unstable, or one acpd has
//! never heard of) and any extension passes, as a transparent bridge's must, except acpd's own
//! (`_acpd/…`), which only acpd speaks. Which capability a method needs of the parent is the
//! relay's to check.

use std::borrow::Cow;
use std::fmt;

use acpd_protocol::envelope::ParamsKeys;
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

/// The hot path's check of a `session/update`'s params (their keys as the envelope's scan
/// counted them): they name exactly one session, the child's own, written as `own` (the id
/// as a JSON string), and no routing key twice; no key holds an escape. Such an update goes to
/// the parent with only that value changed, which is what the slow path (`own_update`'s
/// checks, then the splice) makes of it too; anything else goes the slow way.
pub(super) fn names_only_its_own(keys: &ParamsKeys<'_>, own: &str) -> bool {
    keys.session_ids == 1
        && keys.session_id == Some(own)
        && keys.other_sessions == 0
        && keys.session_updates <= 1
        && keys.updates <= 1
        && !keys.escaped
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

    /// The keys of an update with `params`, as the relay's scan counts them.
    fn keys_of(params: &str) -> bool {
        let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
        let (_, keys) = acpd_protocol::envelope::parse_keyed(line.as_bytes()).unwrap();
        names_only_its_own(&keys, r#""s1""#)
    }

    #[test]
    fn the_fast_path_never_admits_what_the_slow_path_rejects() {
        for text in [
            r#"{"sessionId":"s1","update":{"a":1}}"#,
            // As Python's json.dumps writes it: spaces, escapes in values.
            r#"{"sessionId": "s1", "update": {"text": "caf\u00e9 \u001b"}}"#,
            r#"{"update":{"text":"ends in SessionId"},"sessionId":"s1"}"#,
        ] {
            assert!(keys_of(text), "{text}");
            let p = raw(text);
            assert!(own_update(Some(&p), "s1").is_ok(), "{text}");
        }
        for text in [
            r#"{"sessionId":"s1","update":{},"sessionId":"s2"}"#,
            r#"{"sessionId":"s1","session\u0049d":"s2"}"#,
            r#"{"sessionId":"s1","update":{"k\u0061":1}}"#,
            r#"{"sessionId":"s10","update":{}}"#,
            r#"{"sessionId":"s\u0031","update":{}}"#,
            r#"{"sessionId":"s1","update":{"a":1},"update":{"b":2}}"#,
            r#"{"sessionId":"s1","update":{"sessionUpdate":"a","sessionUpdate":"b"}}"#,
            r#"{"sessionId":"s1","update":{"senderSessionId":"x"}}"#,
            r#"{"sessionId":"s1","update":{"x":[{"sessionId":"x"}]}}"#,
            r#"{"sessionId": "s1", "update": {}, "sessionId": "s2"}"#,
            r#"{"sessionId":1,"update":{}}"#,
            r#"{"update":{}}"#,
        ] {
            assert!(!keys_of(text), "{text}");
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
