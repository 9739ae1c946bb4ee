//! The teardown ladder end to end: after `acpd run` returns, no process of the child's tree is
//! left — a zombie counts as a survivor — and each rung took about as long as its grace.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

mod common;

use std::time::{Duration, Instant};

use common::*;

const GRACE: Duration = Duration::from_millis(300);
/// Generous: catches a missing SIGKILL (which would hang for ever), not a slow machine.
const MARGIN: Duration = Duration::from_secs(5);

/// Runs a script on the `fast` provider (eof and term graces 300 ms) and returns the pids it
/// printed and how long the whole run took.
fn run_tree(script: &str) -> (Vec<i32>, Duration) {
    let env = Env::new("");
    let started = Instant::now();
    let (v, code, stderr) =
        run_json(
            env.acpd()
                .args(["run", "--json", "--provider", "fast", script]),
        );
    let elapsed = started.elapsed();
    assert_eq!(code, 0, "{v} {stderr}");
    let text = output_text(&v);
    let mut pids = vec![pid_after(&text, "pid ")];
    if script.contains(":grandchild") {
        pids.push(pid_after(&text, "grandchild "));
    }
    (pids, elapsed)
}

fn assert_gone(pids: &[i32]) {
    for &pid in pids {
        assert!(!exists(pid), "process {pid} survived teardown");
    }
}

#[test]
fn cooperative_child_exits_on_eof() {
    let (pids, elapsed) = run_tree(":pid");
    assert_gone(&pids);
    assert!(elapsed < GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn eof_deaf_child_is_terminated() {
    let (pids, elapsed) = run_tree(":pid\n:ignore-eof");
    assert_gone(&pids);
    assert!(
        elapsed >= GRACE,
        "SIGTERM came before eof_grace: {elapsed:?}"
    );
    assert!(elapsed < 2 * GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn sigterm_trapping_child_is_killed() {
    let (pids, elapsed) = run_tree(":pid\n:ignore-eof\n:ignore-term");
    assert_gone(&pids);
    assert!(
        elapsed >= 2 * GRACE,
        "SIGKILL came before eof_grace + term_grace: {elapsed:?}"
    );
    assert!(elapsed < 2 * GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn grandchild_holding_the_pipes_goes_with_the_tree() {
    let (pids, elapsed) = run_tree(":pid\n:grandchild\n:ignore-eof\n:ignore-term");
    assert_gone(&pids);
    assert!(elapsed < 2 * GRACE + MARGIN, "{elapsed:?}");
}

#[test]
fn cooperative_leader_with_a_term_deaf_grandchild_leaves_nothing() {
    // The leader exits on EOF at once; the grandchild (same group, SIGTERM ignored) outlives it
    // and is orphaned to acpd, which must still kill and reap it.
    let (pids, elapsed) = run_tree(":pid\n:grandchild");
    assert_gone(&pids);
    assert!(
        elapsed >= 2 * GRACE,
        "the orphaned grandchild needed SIGKILL: {elapsed:?}"
    );
}
