//! The `clientCapabilities` a child is initialized with, kept as JSON text.

use acpd_protocol::acp::ClientCapabilities;
use acpd_protocol::envelope;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A bridge child gets its editor's object exactly as the editor wrote it (a sandboxed one
/// without `terminal`, [`ClientCaps::without_terminal`]): capabilities and
/// sub-keys newer than acpd's schema, `_meta`, numbers and escapes as written. acpd adds and
/// overrides nothing there (the schema's defaults it used to add, `fs` and `terminal` off and
/// `auth.terminal: false`, say what an absent key says), since it serves the child exactly
/// what the editor serves: `fs/*`, `terminal/*` and `elicitation/*` only when the editor
/// advertised them, everything else passed on for the editor to answer. A run's child gets
/// acpd's own, typed (see `launch::collect_capabilities`).
#[derive(Debug, Clone)]
pub struct ClientCaps {
    raw: Box<RawValue>,
    key: String,
}

impl ClientCaps {
    /// `raw` when it is a JSON object; else acpd's default, everything off (an editor that sent
    /// none, or something no agent could read as capabilities).
    pub fn from_raw(raw: Option<Box<RawValue>>) -> Self {
        match raw {
            Some(raw) if raw.get().starts_with('{') => {
                let key = key_of(raw.get());
                ClientCaps { raw, key }
            }
            _ => Self::default(),
        }
    }

    /// These capabilities with `terminal` left out (an absent key says `false`), for a
    /// sandboxed child: a terminal the editor runs is outside the sandbox, so acpd refuses
    /// the child's `terminal/*` requests, and an agent told there is none runs its commands
    /// itself, inside it.
    pub fn without_terminal(self) -> Self {
        let Ok(mut map) = serde_json::from_str::<Map<String, Value>>(self.raw.get()) else {
            return self;
        };
        if map.remove("terminal").is_none() {
            return self;
        }
        let raw = envelope::to_raw(&map);
        ClientCaps {
            key: key_of(raw.get()),
            raw,
        }
    }

    /// acpd's own capabilities, as a client.
    pub fn typed(caps: &ClientCapabilities) -> Self {
        let raw = envelope::to_raw(caps);
        ClientCaps {
            key: key_of(raw.get()),
            raw,
        }
    }

    /// What goes in `initialize`.
    pub fn as_raw(&self) -> &RawValue {
        &self.raw
    }

    /// Equal for two sets an agent reads alike (a warm spare made with one serves the other):
    /// the value with every `false` and `null` left out, and every object that leaves empty
    /// (`fs: {"readTextFile": false}` says what no `fs` says; `plan: {}` as written says
    /// "supported" and stays), keys sorted. Text serde_json cannot read is its own key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Default for ClientCaps {
    fn default() -> Self {
        ClientCaps::typed(&ClientCapabilities::default())
    }
}

fn key_of(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => prune(value)
            .unwrap_or_else(|| Value::Object(Map::new()))
            .to_string(),
        Err(_) => text.to_string(),
    }
}

/// `value` without its `false` and `null` leaves and the objects they leave empty.
fn prune(value: Value) -> Option<Value> {
    match value {
        Value::Bool(false) | Value::Null => None,
        Value::Object(map) if !map.is_empty() => {
            let mut kept: Vec<(String, Value)> = map
                .into_iter()
                .filter_map(|(k, v)| prune(v).map(|v| (k, v)))
                .collect();
            // Sorted here: serde_json's map keeps insertion order when a dependency asks it to.
            kept.sort_by(|a, b| a.0.cmp(&b.0));
            (!kept.is_empty()).then(|| Value::Object(kept.into_iter().collect()))
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(text: &str) -> ClientCaps {
        ClientCaps::from_raw(RawValue::from_string(text.to_string()).ok())
    }

    #[test]
    fn sets_an_agent_reads_alike_share_a_key_and_keep_their_text() {
        let default = ClientCaps::default();
        for same in [
            "{}",
            r#"{"fs":{"readTextFile":false,"writeTextFile":false},"terminal":false}"#,
            r#"{"auth":{"terminal":false},"elicitation":null}"#,
        ] {
            let c = caps(same);
            assert_eq!(c.key(), default.key(), "{same}");
            assert_eq!(c.as_raw().get(), same);
        }
        for other in [
            r#"{"plan":{}}"#,
            r#"{"fs":{"readTextFile":true}}"#,
            r#"{"session":{"foo":{}}}"#,
            r#"{"futureCap":{"a":1e2}}"#,
        ] {
            assert_ne!(caps(other).key(), default.key(), "{other}");
            assert_eq!(caps(other).as_raw().get(), other);
        }
        assert_eq!(
            caps(r#"{"b":true,"a":{"x":1}}"#).key(),
            caps(r#"{"a":{"x":1},"b":true}"#).key()
        );
        assert_eq!(caps("[1]").as_raw().get(), default.as_raw().get());
    }
}
