use std::time::Duration;

use acpd_protocol::subagent::{Category, Failure, Stage, StopReason, SubagentResult};

use super::*;

fn ended(provider: &str, stop: StopReason, category: Option<Category>) -> SubagentResult {
    SubagentResult {
        run_id: "r".into(),
        provider: provider.into(),
        turn: 1,
        stop_reason: stop,
        output: Vec::new(),
        output_truncated: false,
        structured: None,
        diagnostic: None,
        failure: category.map(|category| Failure {
            stage: Stage::Prompt,
            category,
            code: None,
            exit_code: None,
            signal: None,
        }),
        workspace: None,
    }
}

#[test]
fn a_category_the_child_names_is_one_label_whatever_it_said() {
    for said in ["made-up-1", "made-up-2"] {
        let r = ended(
            "unit-reported",
            StopReason::Error,
            Some(Category::Reported(said.into())),
        );
        get().turn_ended(&r, Duration::from_millis(5));
    }
    let text = render(&Gauges::default());
    assert!(!text.contains("made-up"), "{text}");
    assert!(
        text.contains(
            r#"acpd_runs_ended_total{provider="unit-reported",stop_reason="error",category="reported"} 2"#
        ),
        "{text}"
    );
}

#[test]
fn every_family_has_help_and_type_and_the_gauges_read_at_render() {
    // A family labelled by provider appears with its first event.
    get().turn_started("unit-families");
    get().turn_ended(
        &ended("unit-families", StopReason::Completed, None),
        Duration::ZERO,
    );
    get().child_started("unit-families", Duration::from_millis(30));
    get().start_failed("unit-families", &Category::Spawn);
    let gauges = Gauges {
        children: vec![
            ("echo".into(), "running", 2),
            ("echo".into(), "starting", 0),
        ],
        sessions_attached: 1,
        sessions_detached: 3,
        spares: vec![("echo".into(), 1)],
        queued: 4,
        spans_exported: 7,
        spans_dropped: 2,
        spans_cut: 5,
    };
    let text = render(&gauges);
    for family in [
        "acpd_connections_total",
        "acpd_connections_open",
        "acpd_runs_started_total",
        "acpd_runs_ended_total",
        "acpd_child_start_failures_total",
        "acpd_child_start_seconds",
        "acpd_turn_seconds",
        "acpd_otel_spans_exported_total",
        "acpd_otel_spans_dropped_total",
        "acpd_otel_values_cut_total",
        "acpd_forwarded_messages_total",
        "acpd_forwarded_bytes_total",
        "acpd_limit_hits_total",
        "acpd_teardown_steps_total",
        "acpd_children",
        "acpd_sessions",
        "acpd_spares",
        "acpd_queued_starts",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family}: {text}"
        );
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family}: {text}"
        );
    }
    for line in [
        r#"acpd_children{provider="echo",state="running"} 2"#,
        r#"acpd_sessions{state="detached"} 3"#,
        r#"acpd_spares{provider="echo"} 1"#,
        "acpd_queued_starts 4",
        "acpd_otel_spans_exported_total 7",
        "acpd_otel_spans_dropped_total 2",
        "acpd_otel_values_cut_total 5",
        r#"acpd_teardown_steps_total{step="cgroup_kill"} "#,
        r#"acpd_limit_hits_total{limit="max_connections_per_child"} "#,
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}

#[test]
fn bridge_and_run_turns_share_the_histogram_apart_by_kind() {
    use acpd_protocol::outcome::{ChildStopReason, TurnEnd, map_outcome};
    let cancelled = TurnEnd::Stopped {
        reason: ChildStopReason::Cancelled,
        reported_failure: None,
    };
    let m = get();
    m.bridge_turn_ended("unit-kinds", &map_outcome(&cancelled, true), Duration::ZERO);
    let crashed = TurnEnd::ProcessExit {
        exit_code: Some(3),
        signal: None,
    };
    m.bridge_turn_ended("unit-kinds", &map_outcome(&crashed, false), Duration::ZERO);
    m.turn_ended(
        &ended("unit-kinds", StopReason::Completed, None),
        Duration::from_secs(1),
    );
    let text = render(&Gauges::default());
    for line in [
        r#"acpd_turn_seconds_count{provider="unit-kinds",kind="bridge",stop_reason="aborted",category="none"} 1"#,
        r#"acpd_turn_seconds_count{provider="unit-kinds",kind="bridge",stop_reason="error",category="process-exit"} 1"#,
        r#"acpd_turn_seconds_count{provider="unit-kinds",kind="run",stop_reason="completed",category="none"} 1"#,
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}
