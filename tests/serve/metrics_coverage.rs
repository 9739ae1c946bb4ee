//! The metric families the issue lists, driven by real processes through `acpd serve`: bridge
//! turns in the turn histogram (a real Prometheus and PromQL over its HTTP API), the labels
//! they carry, and every other listed family moving when its event happens.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::metrics::{Prometheus, daemon, prometheus_on_path, start_run};
use crate::common::daemon::Daemon;
use crate::common::raw::Raw;
use crate::common::{Env, eventually};

/// The value of the one sample `series` (its name and labels as printed) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// A real Prometheus scrapes `acpd serve` while an editor prompts through a bridge session:
/// PromQL over the turn histogram's `_count`, by how each turn ended, returns the five prompts
/// the test made (two answered, one cancelled by the editor, one the agent refused, one its
/// crash ended), under `kind="bridge"`, apart from the run's. The cancel is counted as a
/// message forwarded to the agent.
#[test]
fn prometheus_counts_bridge_turns_by_how_they_ended() {
    if !prometheus_on_path() {
        return;
    }
    let (d, metrics) = daemon();
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let s = raw.new_session(Path::new("/tmp"), "fast");
    let mut answers = Vec::new();
    for text in ["one", "two"] {
        let id = raw.send_prompt(&s, text);
        answers.push(raw.answer(&json!(id)).value);
    }
    let id = raw.send_prompt(&s, "hanging\n:hang");
    raw.until_chunk(&s, "hanging");
    let cancel = json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": s}});
    raw.line(&cancel.to_string());
    answers.push(raw.answer(&json!(id)).value);
    for text in [":error -32603 boom", ":crash 3"] {
        let id = raw.send_prompt(&s, text);
        answers.push(raw.answer(&json!(id)).value);
    }
    let said: Vec<String> = answers
        .iter()
        .map(|a| match a["result"]["stopReason"].as_str() {
            // A turn its agent's exit ended: `cancelled`, naming the exit.
            Some(_) if a["result"]["_meta"]["acpd"]["sessionEnded"].is_object() => {
                a["result"]["_meta"]["acpd"]["sessionEnded"]["data"]["category"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string()
            }
            Some(r) => r.to_string(),
            None => a["error"]["data"]["category"]
                .as_str()
                .unwrap_or("rpc")
                .to_string(),
        })
        .collect();
    assert_eq!(
        said,
        ["end_turn", "end_turn", "cancelled", "rpc", "process-exit"],
        "{answers:?}"
    );
    let run = start_run(&mut raw, "a run");
    assert_eq!(raw.wait_run(&run)["stopReason"], "completed");

    let dir = tempfile::tempdir().unwrap();
    let (prometheus, api) = Prometheus::start(dir.path(), metrics);
    let made: BTreeMap<(String, String), f64> = [
        (("completed", "none"), 2.0),
        (("aborted", "none"), 1.0),
        (("error", "rpc"), 1.0),
        (("error", "process-exit"), 1.0),
    ]
    .into_iter()
    .map(|((s, c), n)| ((s.to_string(), c.to_string()), n))
    .collect();
    let promql = "sum by (stop_reason, category) \
                  (acpd_turn_seconds_count{kind=\"bridge\",provider=\"fast\"})";
    prometheus.wait_for_outcomes(api, promql, &made);
    let runs = prometheus.query(api, "sum(acpd_turn_seconds_count{kind=\"run\"})");
    assert_eq!(runs.first().map(|s| s.1), Some(1.0), "{runs:?}");
    // Every bridge turn lies in some bucket: the +Inf bucket counts them all.
    let inf = prometheus.query(
        api,
        "sum(acpd_turn_seconds_bucket{kind=\"bridge\",le=\"+Inf\"})",
    );
    assert_eq!(inf.first().map(|s| s.1), Some(5.0), "{inf:?}");

    // Five prompts and one cancel went to the agent; nothing else did.
    let text = raw.ok("_acpd/metrics", json!({}))["text"]
        .as_str()
        .unwrap()
        .to_string();
    let to_child = r#"acpd_forwarded_messages_total{direction="parent_to_child"}"#;
    assert_eq!(sample(&text, to_child), Some(6.0), "{text}");
}

/// Each family the issue lists moves when real processes make its event: a warm spare, a
/// session its connection left (detached), a child that ignores EOF and SIGTERM (the ladder's
/// every rung), a refused depth, connections; and the span counters are there, at 0, with
/// export off.
#[test]
fn every_listed_family_moves_over_real_processes() {
    let d = Daemon::start(Env::new(&format!(
        "[providers.spare]\ncommand = [\"{}\", \"agent\", \"echo\"]\nwarm = 1\n",
        crate::common::BIN
    )));
    let metrics = || {
        let out = d.cli(&["status", "--metrics"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let until = |what: &str, series: &str, want: f64| {
        let mut text = String::new();
        let reached = eventually(Duration::from_secs(20), || {
            text = metrics();
            sample(&text, series).is_some_and(|v| v >= want)
        });
        assert!(reached, "{what}: {series} never reached {want}: {text}");
    };
    until("a warm spare", r#"acpd_spares{provider="spare"}"#, 1.0);
    until(
        "the spare's child",
        r#"acpd_children{provider="spare",state="spare"}"#,
        1.0,
    );

    let mut left = Raw::socket(&d.socket);
    left.initialize(json!({}));
    left.new_session(Path::new("/tmp"), "fast");
    drop(left);
    until(
        "a detached session",
        r#"acpd_sessions{state="detached"}"#,
        1.0,
    );
    until(
        "its child",
        r#"acpd_children{provider="fast",state="detached"}"#,
        1.0,
    );

    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let run = start_run(&mut raw, ":ignore-eof\n:ignore-term\nstubborn");
    assert_eq!(raw.wait_run(&run)["stopReason"], "completed");
    raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
    for step in ["eof", "term", "kill"] {
        let series = format!("acpd_teardown_steps_total{{step=\"{step}\"}}");
        until("a stubborn child's teardown", &series, 1.0);
    }
    let deep = raw.call(
        "_acpd/subagent/start",
        json!({"provider": "fast", "cwd": "/tmp", "prompt": [], "maxDepth": 0}),
    );
    assert_eq!(deep["error"]["data"]["code"], "DEPTH_EXCEEDED", "{deep}");
    until(
        "a refused depth",
        r#"acpd_limit_hits_total{limit="max_depth"}"#,
        1.0,
    );
    until(
        "the connections",
        r#"acpd_connections_total{kind="parent"}"#,
        2.0,
    );
    let text = metrics();
    for series in [
        "acpd_otel_spans_exported_total",
        "acpd_otel_spans_dropped_total",
        "acpd_otel_values_cut_total",
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series}: {text}");
    }
}

/// What an agent says never becomes a label, and a prompt whose editor left counts once:
/// an unknown stop reason and a failure category of the agent's own are fixed words, and a
/// prompt still running when its connection closed (the session detached) is `aborted`.
#[test]
fn bridge_turn_labels_are_acpds_words_and_a_left_prompt_counts_once() {
    let (d, _) = daemon();
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let s = raw.new_session(Path::new("/tmp"), "fast");
    for text in [":stop made-up-reason", ":meta-failure evil-words"] {
        let id = raw.send_prompt(&s, text);
        raw.answer(&json!(id));
    }
    raw.send_prompt(&s, "hanging\n:hang");
    raw.until_chunk(&s, "hanging");
    drop(raw);
    let series = |stop: &str, category: &str| {
        format!(
            "acpd_turn_seconds_count{{provider=\"fast\",kind=\"bridge\",\
             stop_reason=\"{stop}\",category=\"{category}\"}}"
        )
    };
    let mut text = String::new();
    let counted = eventually(Duration::from_secs(20), || {
        text = String::from_utf8(d.cli(&["status", "--metrics"]).stdout).unwrap();
        sample(&text, &series("aborted", "none")).is_some()
    });
    assert!(counted, "the left prompt was never counted: {text}");
    assert_eq!(
        sample(&text, &series("aborted", "none")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &series("error", "unknown-stop-reason")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &series("error", "reported")),
        Some(1.0),
        "{text}"
    );
    for word in ["made-up-reason", "evil-words"] {
        assert!(!text.contains(word), "{word}: {text}");
    }
    assert!(
        text.contains("acpd_sessions{state=\"detached\"} 1"),
        "{text}"
    );
}
