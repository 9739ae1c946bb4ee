//! The registry through its library API, with the real echo agent as the child: the lifecycle
//! pair per turn, follow-ups, dispose semantics, capacity, and the process-level guarantees that
//! need an in-process view (PDEATHSIG thread, restored RLIMIT_NOFILE).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::time::Duration;

use acpd::testing::{Config, ProviderConfig};
use acpd::testing::{DepthContext, Registry, RunEvent, StartOptions};
use acpd_protocol::acp::ContentBlock;
use acpd_protocol::errors::ErrorName;
use acpd_protocol::subagent::{StartRequest, StopReason};
use common::*;
use tokio::sync::mpsc;

fn registry(max_concurrent: usize, keep_alive: Duration) -> Registry {
    let mut config = Config::builtin(vec![BIN.into(), "agent".into(), "echo".into()]);
    let mut p =
        ProviderConfig::with_defaults("fast", vec![BIN.into(), "agent".into(), "echo".into()]);
    p.max_concurrent = max_concurrent;
    p.keep_alive = keep_alive;
    p.cancel_grace = Duration::from_millis(300);
    p.eof_grace = Duration::from_millis(300);
    p.term_grace = Duration::from_millis(300);
    config.providers.insert("fast".into(), p.into());
    acpd::testing::init();
    Registry::new(config, DepthContext::default())
}

fn request(text: &str) -> StartRequest {
    StartRequest {
        provider: Some("fast".into()),
        prompt: vec![ContentBlock::from(text.to_string())],
        ..Default::default()
    }
}

fn opts(text: &str, events: Option<mpsc::Sender<RunEvent>>) -> StartOptions {
    StartOptions {
        request: request(text),
        caller_cwd: Some(std::env::temp_dir()),
        events,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_started_and_one_ended_per_turn_in_order() {
    let reg = registry(4, Duration::from_secs(30));
    let (tx, mut rx) = mpsc::channel(8);
    let published = reg.start(opts("first", Some(tx))).await.unwrap();
    let first = reg.wait(0, &published.run_id).await.unwrap();
    assert_eq!(
        (first.stop_reason, first.turn, first.output_text()),
        (StopReason::Completed, 1, "first".into())
    );

    let turn = reg
        .send(
            0,
            &published.run_id,
            vec![ContentBlock::from("second".to_string())],
        )
        .await
        .unwrap();
    assert_eq!(turn, 2);
    let second = reg.wait(0, &published.run_id).await.unwrap();
    assert_eq!((second.turn, second.output_text()), (2, "second".into()));
    reg.dispose(0, &published.run_id).await.unwrap();

    let mut seen = Vec::new();
    while let Ok(event) = rx.try_recv() {
        seen.push(match event {
            RunEvent::Started(s) => {
                assert_eq!(s.session_id, published.session_id);
                format!("started {}", s.turn)
            }
            RunEvent::Ended(e) => format!("ended {} {}", e.turn, e.result.stop_reason),
            _ => continue,
        });
    }
    assert_eq!(
        seen,
        [
            "started 1",
            "ended 1 completed",
            "started 2",
            "ended 2 completed"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_start_emits_nothing_and_leaves_no_run() {
    let reg = registry(4, Duration::from_secs(30));
    let (tx, mut rx) = mpsc::channel(8);
    let mut o = opts("x", Some(tx));
    o.request.provider = Some("nope".into());
    let err = reg.start(o).await.unwrap_err();
    assert_eq!(err.name(), ErrorName::NoProvider);
    let mut o = opts("x", None);
    o.request.tool_filter = serde_json::from_value(serde_json::json!({"allow": ["read"]})).ok();
    assert_eq!(
        reg.start(o).await.unwrap_err().name(),
        ErrorName::UnsupportedCapability
    );
    assert!(
        rx.try_recv().is_err(),
        "no lifecycle event for a failed start"
    );
    assert!(reg.runs().is_empty());
    assert_eq!(reg.live_children(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispose_is_idempotent_and_unknown_runs_are_typed() {
    let reg = registry(4, Duration::from_secs(30));
    let (sink, mut streamed) = mpsc::channel(8);
    let mut o = opts(":pid\n:hang", None);
    o.sink = Some(sink);
    let published = reg.start(o).await.unwrap();
    let pid = reg.runs()[0].pid().unwrap();
    assert_eq!(
        streamed.recv().await.unwrap(),
        format!("pid {pid}\n"),
        "the turn is under way"
    );
    assert_eq!(
        reg.send(0, &published.run_id, vec![])
            .await
            .unwrap_err()
            .name(),
        ErrorName::RunBusy
    );
    assert_eq!(
        reg.wait(7, &published.run_id).await.unwrap_err().name(),
        ErrorName::UnknownRun,
        "another owner"
    );
    let waiting = {
        let (reg, run_id) = (reg.clone(), published.run_id.clone());
        tokio::spawn(async move { reg.wait(0, &run_id).await })
    };
    reg.dispose(0, &published.run_id).await.unwrap();
    reg.dispose(0, &published.run_id).await.unwrap();
    assert!(!exists(pid));
    let result = waiting.await.unwrap().unwrap();
    assert_eq!(
        result.stop_reason,
        StopReason::Aborted,
        "dispose cancels the running turn"
    );
    assert_eq!(result.output_text(), format!("pid {pid}\n"));
    assert_eq!(
        reg.wait(0, &published.run_id).await.unwrap_err().name(),
        ErrorName::RunEnded,
        "a disposed run is forgotten"
    );
    assert!(reg.runs().iter().all(|r| r.run_id != published.run_id));
    assert_eq!(
        reg.send(0, &published.run_id, vec![])
            .await
            .unwrap_err()
            .name(),
        ErrorName::RunEnded
    );
    assert_eq!(
        reg.dispose(0, "no-such-run").await.unwrap_err().name(),
        ErrorName::UnknownRun
    );
    assert_eq!(reg.live_children(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_counts_live_children() {
    let reg = registry(1, Duration::from_secs(30));
    let first = reg.start(opts("a", None)).await.unwrap();
    reg.wait(0, &first.run_id).await.unwrap();
    let err = reg.start(opts("b", None)).await.unwrap_err();
    assert_eq!(
        err.name(),
        ErrorName::Capacity,
        "a settled, undisposed run still holds its child"
    );
    reg.dispose(0, &first.run_id).await.unwrap();
    let second = reg.start(opts("b", None)).await.unwrap();
    reg.dispose(0, &second.run_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_ends_an_idle_child_and_frees_its_slot() {
    let reg = registry(1, Duration::from_millis(200));
    let published = reg.start(opts(":pid", None)).await.unwrap();
    let pid = reg.runs()[0].pid().unwrap();
    reg.wait(0, &published.run_id).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || !exists(pid)
        && reg.live_children() == 0));
    assert_eq!(
        reg.send(0, &published.run_id, vec![])
            .await
            .unwrap_err()
            .name(),
        ErrorName::RunEnded
    );
}

#[test]
fn children_survive_idle_runtime_threads_and_get_the_original_nofile() {
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    // Blocking-pool threads that idle out after 10 ms would kill a child forked from them
    // (PDEATHSIG follows the forking thread); children are forked from a dedicated thread.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_keep_alive(Duration::from_millis(10))
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let reg = registry(4, Duration::from_secs(30));
        let published = reg.start(opts("x", None)).await.unwrap();
        reg.wait(0, &published.run_id).await.unwrap();
        let pid = reg.runs()[0].pid().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(exists(pid), "the child died with an idle thread");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let child_soft: u64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert_eq!(child_soft, soft, "{line}");
        reg.dispose(0, &published.run_id).await.unwrap();
    });
}

/// The child's pid, from a `:pid` turn's output.
fn pid_of(result: &acpd_protocol::subagent::SubagentResult) -> i32 {
    result
        .output_text()
        .trim()
        .strip_prefix("pid ")
        .and_then(|p| p.parse().ok())
        .expect("a :pid turn prints its pid")
}

/// `send` and `dispose` raced against each other, again and again: every call returns, the send
/// either ran a turn (settled, then aborted or completed) or was refused as ended or busy, and
/// no child outlives the dispose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_racing_dispose_never_leaks_a_child_or_hangs() {
    let reg = registry(8, Duration::from_secs(30));
    for round in 0..20 {
        let published = reg.start(opts(":pid", None)).await.unwrap();
        let first = reg.wait(0, &published.run_id).await.unwrap();
        let pid = pid_of(&first);
        let send = {
            let (reg, run_id) = (reg.clone(), published.run_id.clone());
            tokio::spawn(async move {
                reg.send(
                    0,
                    &run_id,
                    vec![ContentBlock::from(":sleep 50\nsecond".to_string())],
                )
                .await
            })
        };
        if round % 2 == 0 {
            tokio::task::yield_now().await;
        }
        let dispose = reg.dispose(0, &published.run_id);
        tokio::time::timeout(Duration::from_secs(10), dispose)
            .await
            .expect("dispose returns")
            .unwrap();
        let sent = tokio::time::timeout(Duration::from_secs(10), send)
            .await
            .expect("send returns")
            .unwrap();
        if let Err(e) = sent {
            assert!(
                matches!(e.name(), ErrorName::RunEnded | ErrorName::RunBusy),
                "round {round}: {e}"
            );
        }
        assert!(!exists(pid), "round {round}: child {pid} outlived dispose");
        assert_eq!(
            reg.live_children(),
            0,
            "round {round}: a slot is still held"
        );
    }
}

/// keep_alive expiring while a follow-up arrives: the follow-up either runs on the still-live
/// child or is refused as ended, never hangs; and the expired child is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_racing_keep_alive_expiry_runs_or_is_refused() {
    let keep_alive = Duration::from_millis(200);
    let reg = registry(8, keep_alive);
    let (mut ran, mut refused) = (0, 0);
    for round in 0..20 {
        let published = reg.start(opts(":pid", None)).await.unwrap();
        let pid = pid_of(&reg.wait(0, &published.run_id).await.unwrap());
        // Around the expiry: a little before, at, or after it.
        tokio::time::sleep(
            keep_alive - Duration::from_millis(20) + Duration::from_millis(4 * round),
        )
        .await;
        let prompt = vec![ContentBlock::from("again".to_string())];
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            reg.send(0, &published.run_id, prompt),
        )
        .await
        .expect("send returns");
        match sent {
            Ok(turn) => {
                assert_eq!(turn, 2);
                let r =
                    tokio::time::timeout(Duration::from_secs(10), reg.wait(0, &published.run_id))
                        .await
                        .expect("the follow-up settles")
                        .unwrap();
                assert_eq!(r.output_text(), "again", "round {round}");
                ran += 1;
            }
            Err(e) => {
                assert_eq!(e.name(), ErrorName::RunEnded, "round {round}: {e}");
                assert!(
                    eventually(Duration::from_secs(5), || !exists(pid)),
                    "round {round}: an expired child {pid} lives on"
                );
                refused += 1;
            }
        }
        reg.dispose(0, &published.run_id).await.unwrap();
        assert!(!exists(pid), "round {round}: child {pid} outlived dispose");
    }
    assert_eq!(ran + refused, 20);
    assert_eq!(reg.live_children(), 0);
}
