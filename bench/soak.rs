//! The soak: 2 000 sequential runs and 200 bridge sessions (each over its own connection) in
//! one `acpd serve`, with the daemon's open descriptors, threads and RSS before and after, and
//! a check that no zombie or stray process is left. Not part of `--quick` or the table:
//! `cargo bench -p acpd --bench acpd -- soak`.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::ACPD;
use crate::scale::{Ctl, settle_children};

const RUNS: usize = 2_000;
const SESSIONS: usize = 200;

struct Figures {
    fds: usize,
    threads: u64,
    rss: u64,
}

impl Figures {
    fn of(ctl: &Ctl) -> Figures {
        Figures {
            fds: ctl.fds(),
            threads: ctl.threads(),
            rss: ctl.rss_kib(),
        }
    }

    fn line(&self, label: &str) {
        println!(
            "{label:<34} fds {:>4}   threads {:>3}   RSS {:>7} KiB",
            self.fds, self.threads, self.rss
        );
    }
}

/// Live `acpd agent echo` processes of this build anywhere on the machine (any a dead parent
/// let go of included), and how many are zombies.
fn echo_agents() -> (usize, usize) {
    let (mut all, mut zombies) = (0, 0);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if argv.first() == Some(&ACPD.as_bytes()) && argv.get(1) == Some(&&b"agent"[..]) {
            all += 1;
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat
                .rfind(')')
                .is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'))
            {
                zombies += 1;
            }
        }
    }
    (all, zombies)
}

pub async fn run() {
    let began = Instant::now();
    let config = format!(
        "[providers.echo]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\nkeep_alive = \"1h\"\n"
    );
    let ctl = Ctl::serve(&config, 64).await;
    let daemon = ctl.daemon().unwrap();
    println!(
        "\nsoak: {RUNS} sequential runs, then {SESSIONS} bridge sessions, in one acpd serve (pid {})",
        ctl.pid()
    );
    let start = Figures::of(&ctl);
    start.line("at start (initialized)");
    // A few runs first, so one-time allocations are not counted as growth.
    for _ in 0..20 {
        one_run(&ctl).await;
    }
    settle_children(&ctl, 5).await;
    let before = Figures::of(&ctl);
    before.line("before (after 20 warm-up runs)");
    let t = Instant::now();
    for i in 1..=RUNS {
        one_run(&ctl).await;
        if i % 500 == 0 {
            let f = Figures::of(&ctl);
            f.line(&format!(
                "  after {i} runs ({:.1} s)",
                t.elapsed().as_secs_f64()
            ));
        }
    }
    let runs_secs = t.elapsed().as_secs_f64();
    let (left, _) = settle_children(&ctl, 10).await;
    let after_runs = Figures::of(&ctl);
    after_runs.line(&format!("after {RUNS} runs"));
    assert_eq!(left, 0, "every run's child is gone");
    let t = Instant::now();
    for i in 1..=SESSIONS {
        let parent = Ctl::connect(daemon.clone()).await;
        let new = parent
            .call(
                "session/new",
                json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
            )
            .await;
        let answer = parent
            .call(
                "session/prompt",
                json!({"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "x"}]}),
            )
            .await;
        assert_eq!(answer["stopReason"], "end_turn");
        parent.peer.close();
        drop(parent);
        if i % 50 == 0 {
            settle_children(&ctl, 10).await;
            let f = Figures::of(&ctl);
            f.line(&format!(
                "  after {i} sessions ({:.1} s)",
                t.elapsed().as_secs_f64()
            ));
        }
    }
    let sessions_secs = t.elapsed().as_secs_f64();
    let (left, zombies) = settle_children(&ctl, 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = Figures::of(&ctl);
    after.line(&format!("after {SESSIONS} sessions"));
    let listed = ctl.call("_acpd/subagent/list", json!({})).await;
    let (agents, agent_zombies) = echo_agents();
    println!(
        "runs {runs_secs:.1} s ({:.2} ms each), sessions {sessions_secs:.1} s ({:.2} ms each), total {:.1} s",
        runs_secs * 1e3 / RUNS as f64,
        sessions_secs * 1e3 / SESSIONS as f64,
        began.elapsed().as_secs_f64()
    );
    println!(
        "growth over the soak: fds {:+}, threads {:+}, RSS {:+} KiB; children of acpd left {left} (zombies {zombies}); echo agents of this build alive anywhere {agents} (zombies {agent_zombies}); runs listed {}",
        after.fds as i64 - before.fds as i64,
        after.threads as i64 - before.threads as i64,
        after.rss as i64 - before.rss as i64,
        listed
            .get("runs")
            .and_then(|r| r.as_array())
            .map_or_else(|| listed.to_string(), |r| r.len().to_string())
    );
}

async fn one_run(ctl: &Ctl) {
    let run = ctl.start("echo", "x").await;
    ctl.call("_acpd/subagent/wait", json!({"runId": run})).await;
    ctl.call("_acpd/subagent/dispose", json!({"runId": run}))
        .await;
}
