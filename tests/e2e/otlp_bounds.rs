//! What OTLP export holds while the collector does not answer: bounded in bytes whatever the
//! editor sends. A real `acpd stdio` exports to a 127.0.0.1 listener that accepts and never
//! answers, and an editor floods a session with notifications whose method names are 100 KiB
//! and whose `tracestate` is as large as the SDK keeps (32 members of 256 + 256 bytes): each
//! becomes one hop span, none can leave, and acpd's memory must stay flat.

use std::time::{Duration, Instant};

use serde_json::json;

use super::otlp::{new_session, stalled_collector, stdio, traceparent};
use crate::common::raw::{peak_kib, rss_kib};
use crate::common::{Env, eventually};

/// Notifications sent: enough that today's unbounded spans (two copies of a 100 KiB name
/// each, plus the `tracestate`) hold hundreds of MiB, few enough to finish in seconds.
const FLOOD: usize = 600;
const METHOD: usize = 100 * 1024;
/// How far acpd's peak may rise over its resident size before the flood. What export may
/// hold is 4 MiB; the rest is the reader's buffers for 100 KiB lines and the allocator's slack.
const GROWTH_KIB: u64 = 48 * 1024;

/// A sample of acpd's `/metrics` text (`_acpd/metrics`).
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[test]
fn a_stalled_collector_and_huge_method_names_hold_bounded_memory() {
    let endpoint = stalled_collector();
    let env = Env::new("");
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
    ];
    let mut raw = stdio(&env, &otel);
    let s = new_session(&mut raw, &env, json!({}));
    let pid = raw.pid();
    let before = rss_kib(pid);

    let tracestate: Vec<String> = (0..32)
        .map(|i| format!("k{i:03}{}={}", "k".repeat(250), "v".repeat(256)))
        .collect();
    let started = Instant::now();
    for n in 0..FLOOD {
        let method = format!("{n:06}{}", "m".repeat(METHOD));
        let msg = json!({"jsonrpc": "2.0", "method": method,
            "params": {"sessionId": s, "_meta": {
                "traceparent": traceparent("7777777777777777"),
                "tracestate": tracestate.join(",")}}});
        raw.write(format!("{msg}\n").as_bytes()).unwrap();
    }
    // The flood is read and relayed: acpd answers a request sent after it.
    let mut text = String::new();
    let dropped = eventually(Duration::from_secs(15), || {
        text = raw.ok("_acpd/metrics", json!({}))["text"]
            .as_str()
            .unwrap()
            .to_string();
        sample(&text, "acpd_otel_spans_dropped_total") > 0
    });
    let peak = peak_kib(pid);
    eprintln!(
        "flood of {FLOOD} in {:?}: rss {before} KiB before, peak {peak} KiB",
        started.elapsed()
    );
    assert!(dropped, "no span was dropped: {text}");
    assert!(
        sample(&text, "acpd_otel_values_cut_total") > 0,
        "no name was cut: {text}"
    );
    assert!(
        peak < before + GROWTH_KIB,
        "acpd's peak grew from {before} KiB to {peak} KiB while the collector stalled"
    );
}
