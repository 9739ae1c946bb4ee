//! The JSON-RPC request id, kept exactly as the peer wrote it.

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::json_string;

/// A JSON-RPC request id. ACP peers use both numbers and strings (the SDK sends UUID strings).
///
/// An id is echoed exactly as the peer wrote it: a parsed id whose JSON text is the canonical
/// form of an `i64` (`7`, `-3`) is [`Id::Num`], one that is a string serde_json would write back
/// the same way (`"a-1"`, `"é"`) is [`Id::Str`], and every other number or string (`1.0`, `1e2`,
/// `-0`, `12345678901234567890`, `"\u0041"`) is [`Id::Raw`], which keeps its text and is
/// written back byte for byte. Two ids are equal when their JSON text is equal, so a peer that
/// echoes acpd's own `Id::Num(7)` as `7` matches it, and `"A"` and `"\u0041"` are two ids (each
/// answered with its own text).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Id {
    Num(i64),
    Str(String),
    Raw(RawId),
}

/// The JSON text of an id that is neither a canonical `i64` nor a canonically written string.
/// Only [`Id::from_json`] (and so [`parse`](fn@super::parse)) makes one, so its text is always a
/// valid JSON number or string.
#[derive(Clone)]
pub struct RawId(Box<RawValue>);

impl RawId {
    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl std::fmt::Debug for RawId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawId({})", self.0.get())
    }
}

impl PartialEq for RawId {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for RawId {}

impl std::hash::Hash for RawId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.get().hash(state)
    }
}

/// Why an id value cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("id must be a number or a string")]
    WrongType,
}

impl Id {
    /// The id written as JSON `text` (already valid JSON, such as a [`RawValue`]'s). `Ok(None)` for
    /// `null`; an object, array or boolean is [`IdError::WrongType`]. Leading and trailing JSON
    /// whitespace is not part of the id.
    pub fn from_json(text: &str) -> Result<Option<Id>, IdError> {
        let text = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        match text.as_bytes().first() {
            Some(b'"') => Ok(Some(Self::from_string_text(text)?)),
            Some(b'-' | b'0'..=b'9') => Ok(Some(Self::from_number_text(text)?)),
            Some(b'n') if text == "null" => Ok(None),
            _ => Err(IdError::WrongType),
        }
    }

    fn raw(text: &str) -> Result<Id, IdError> {
        RawValue::from_string(text.to_owned())
            .map(|r| Id::Raw(RawId(r)))
            .map_err(|_| IdError::WrongType)
    }

    fn from_number_text(text: &str) -> Result<Id, IdError> {
        match canonical_i64(text) {
            Some(n) => Ok(Id::Num(n)),
            // `RawValue` checks that it is one JSON value; it must be a number, not `-"x"`.
            None if text
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
            {
                Self::raw(text)
            }
            None => Err(IdError::WrongType),
        }
    }

    fn from_string_text(text: &str) -> Result<Id, IdError> {
        let inner = text
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .ok_or(IdError::WrongType)?;
        if !inner.contains('\\') && !inner.contains('"') && !inner.bytes().any(|b| b < 0x20) {
            return Ok(Id::Str(inner.to_owned()));
        }
        match serde_json::from_str::<String>(text) {
            Ok(s) if json_string(&s) == text => Ok(Id::Str(s)),
            // Escapes written another way than serde_json writes them (`\u0041`, `\/`), and
            // escapes that decode to no Rust string (a lone surrogate): kept as written.
            Ok(_) => Self::raw(text),
            Err(_) => match serde_json::from_str::<&RawValue>(text) {
                Ok(_) => Self::raw(text),
                Err(_) => Err(IdError::WrongType),
            },
        }
    }

    /// The id as JSON text, exactly as it goes on the wire.
    pub fn to_json(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Id::Num(n) => n.to_string().into(),
            Id::Str(s) => json_string(s),
            Id::Raw(r) => r.as_str().into(),
        }
    }
}

/// `text` as an `i64` when it is exactly how that `i64` is written (no `-0`, `+`, leading zero).
fn canonical_i64(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let leading_zero = digits.starts_with('0') && (digits.len() > 1 || digits.len() < text.len());
    if digits.is_empty() || leading_zero || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
            Id::Raw(r) => f.write_str(r.as_str()),
        }
    }
}

/// Exact with serde_json's writers (`to_string`, `to_vec`, `to_writer`, and so the `encode_*`
/// functions here). `serde_json::to_value` and `json!` turn a raw id back into a `Value` and may
/// rewrite it (`1e2` becomes `100.0`, `-0` becomes `-0.0`, `"\u0041"` becomes `"A"`): never build
/// a message that carries a peer's id that way.
impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Id::Num(n) => s.serialize_i64(*n),
            Id::Str(v) => s.serialize_str(v),
            // serde_json writes a RawValue verbatim.
            Id::Raw(r) => r.0.serialize(s),
        }
    }
}

/// Reads an id through its raw JSON text, so it is kept exactly (serde_json deserialisers only).
impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        match Id::from_json(raw.get()) {
            Ok(Some(id)) => Ok(id),
            Ok(None) => Err(serde::de::Error::custom("id must not be null")),
            Err(e) => Err(serde::de::Error::custom(e)),
        }
    }
}
