//! W3C trace context in ACP's `_meta` (`traceparent`, `tracestate`): read from what a parent
//! sent, written into what a child gets. Parsing and formatting are the SDK's
//! `TraceContextPropagator`, which follows the W3C rules: an invalid `traceparent` is ignored
//! (and its `tracestate` with it), so the span that reads it starts a new trace.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde_json::{Map, Value};

pub(super) const TRACEPARENT: &str = "traceparent";
pub(super) const TRACESTATE: &str = "tracestate";

struct Read<'a>(&'a Map<String, Value>);

impl Extractor for Read<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct Write<'a>(&'a mut Map<String, Value>);

impl Injector for Write<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_string(), Value::String(value));
    }
}

/// The parent a span continues: the remote span `meta` names, or none (a new trace).
pub(super) fn parent(meta: Option<&Map<String, Value>>) -> Context {
    match meta {
        Some(m)
            if m.get(TRACEPARENT)
                .and_then(Value::as_str)
                .is_some_and(valid) =>
        {
            TraceContextPropagator::new().extract_with_context(&Context::new(), &Read(m))
        }
        _ => Context::new(),
    }
}

/// A `traceparent` as W3C Trace Context level 1 has it (the SDK's parser takes short ids and
/// pads them): `version-traceid-parentid-flags`, lowercase hex of exactly 2, 32, 16 and 2
/// digits, neither id all zeros, version not `ff`; a later version may append `-` and more.
fn valid(tp: &str) -> bool {
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    let (Some(head), rest) = (tp.get(..55), tp.get(55..).unwrap_or("")) else {
        return false;
    };
    let mut parts = head.split('-');
    let (Some(version), Some(trace), Some(parent), Some(flags), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    hex(version, 2)
        && version != "ff"
        && (rest.is_empty() || (version != "00" && rest.starts_with('-')))
        && hex(trace, 32)
        && nonzero(trace)
        && hex(parent, 16)
        && nonzero(parent)
        && hex(flags, 2)
}

/// Writes `cx`'s span into `meta` as `traceparent` (and `tracestate`, which the span carries
/// over from its parent, or none: a `tracestate` that came with an invalid `traceparent` is
/// not passed on). Other keys (`baggage` among them) stay as they are.
pub(super) fn inject(cx: &Context, meta: &mut Map<String, Value>) {
    meta.remove(TRACESTATE);
    TraceContextPropagator::new().inject_context(cx, &mut Write(meta));
    if meta.get(TRACESTATE).and_then(Value::as_str) == Some("") {
        meta.remove(TRACESTATE);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt;

    use super::*;

    fn meta(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn a_valid_traceparent_is_the_parent() {
        let m = meta(serde_json::json!({
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "vendor=opaque"}));
        let cx = parent(Some(&m));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(sc.trace_state().header(), "vendor=opaque");
        // A later version's longer form is read by its level-1 prefix.
        let later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-follows";
        assert!(valid(later));
    }

    #[test]
    fn an_invalid_traceparent_is_ignored() {
        for bad in [
            "00-abc-def-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
            "",
        ] {
            let m = meta(serde_json::json!({"traceparent": bad, "tracestate": "v=1"}));
            let cx = parent(Some(&m));
            assert!(!cx.span().span_context().is_valid(), "{bad} was taken");
        }
    }
}
