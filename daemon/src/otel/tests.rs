use opentelemetry::trace::TracerProvider as _;
use serde_json::json;

use super::*;

/// An exporter-less `Otel`: spans get ids and parents as when exporting.
fn otel() -> Otel {
    let provider = SdkTracerProvider::builder().build();
    Otel {
        tracer: provider.tracer("test"),
        provider,
        health: Health::new("test".into()),
    }
}

fn raw(v: Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(&v).unwrap()
}

const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn hopped(params: Value) -> Option<(Value, Span)> {
    let (p, span) = otel().hop("session/prompt", &raw(params), Vec::new())?;
    Some((serde_json::from_str(p.get()).unwrap(), span))
}

#[test]
fn a_hop_keeps_the_trace_and_flags_with_its_own_span_id() {
    let (p, span) = hopped(json!({"sessionId": "s", "prompt": [],
        "_meta": {"traceparent": PARENT, "tracestate": "vendor=opaque", "baggage": "user=ada",
                  "other": 1}}))
    .unwrap();
    let (trace, id) = span.ids();
    assert_eq!(trace, "0af7651916cd43dd8448eb211c80319c");
    assert_ne!(id, "b7ad6b7169203331");
    assert_eq!(
        p["_meta"],
        json!({"traceparent": format!("00-{trace}-{id}-01"), "tracestate": "vendor=opaque",
               "baggage": "user=ada", "other": 1})
    );
    assert_eq!(p["sessionId"], "s");
}

#[test]
fn a_hop_changes_nothing_but_the_trace_keys() {
    let text = format!(
        r#"{{"n":123456789012345678901234567890,"f":1.0000000000000000001,"_meta":{{"traceparent":"{PARENT}","big":18446744073709551616}}}}"#
    );
    let params: Box<RawValue> = serde_json::from_str(&text).unwrap();
    let (p, _) = otel().hop("x", &params, Vec::new()).unwrap();
    let p = p.get();
    assert!(p.contains(r#""n":123456789012345678901234567890"#), "{p}");
    assert!(p.contains(r#""f":1.0000000000000000001"#), "{p}");
    assert!(p.contains(r#""big":18446744073709551616"#), "{p}");
}

#[test]
fn trace_context_of_another_type_is_replaced() {
    for odd in [
        json!(7),
        json!({"a": 1}),
        json!("x".repeat(100_000)),
        json!(null),
    ] {
        let (p, span) = hopped(json!({"_meta": {"traceparent": odd, "tracestate": 5}})).unwrap();
        let (trace, id) = span.ids();
        assert_eq!(
            p["_meta"],
            json!({"traceparent": format!("00-{trace}-{id}-01")})
        );
    }
    // `_meta` that is not an object is not trace context.
    assert!(hopped(json!({"_meta": ["traceparent"]})).is_none());
    assert!(hopped(json!({"_meta": "\"traceparent\""})).is_none());
}

#[test]
fn an_unsampled_parent_stays_unsampled() {
    let unsampled = PARENT.replace("-01", "-00");
    let (p, span) = hopped(json!({"_meta": {"traceparent": unsampled}})).unwrap();
    let (trace, id) = span.ids();
    assert_eq!(p["_meta"]["traceparent"], format!("00-{trace}-{id}-00"));
}

#[test]
fn a_malformed_traceparent_starts_a_new_trace_and_its_tracestate_is_not_passed_on() {
    let (p, span) =
        hopped(json!({"_meta": {"traceparent": "00-abc-def-01", "tracestate": "v=1"}})).unwrap();
    let (trace, id) = span.ids();
    assert_ne!(trace, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(
        p["_meta"],
        json!({"traceparent": format!("00-{trace}-{id}-01")})
    );
}

#[test]
fn a_message_without_trace_context_is_not_touched() {
    assert!(
        hopped(json!({"sessionId": "s", "prompt": [{"type": "text", "text": "traceparent"}]}))
            .is_none()
    );
    assert!(hopped(json!({"sessionId": "s", "_meta": {"x": {"traceparent": PARENT}}})).is_none());
    assert!(hopped(json!({"sessionId": "s", "traceparent": PARENT})).is_none());
}

#[test]
fn a_span_of_a_new_trace_and_its_child_share_the_trace() {
    let o = otel();
    let run = o.span("acpd.run", None, Vec::new());
    let meta = run.meta();
    let tp = meta["traceparent"].as_str().unwrap();
    let (trace, id) = run.ids();
    assert_eq!(tp, format!("00-{trace}-{id}-01"));
    // A span continuing that `_meta` is in the same trace, under the run.
    let next = o.span("acpd.run", Some(&meta), Vec::new());
    assert_eq!(next.ids().0, trace);
}

#[test]
fn texts_are_cut_at_a_character_boundary() {
    // 'é' is two bytes and '€' three: neither fits whole at byte 256 from an odd start.
    for text in ["x".to_string() + &"é".repeat(200), "€".repeat(100)] {
        let kept = export::cut(&text);
        assert!(kept.len() <= export::MAX_TEXT && kept.len() > export::MAX_TEXT - 4);
        assert!(text.starts_with(kept));
    }
    assert_eq!(export::cut("session/prompt"), "session/prompt");
    assert_eq!(export::cut(""), "");
}
