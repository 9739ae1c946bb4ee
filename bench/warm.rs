//! (6) Warm start: a bridge `session/new` through acpd with a ready spare (`warm = 1`) against
//! the same agent's cold start done directly (spawn + initialize + session/new), for an agent
//! whose initialize dominates (the echo agent with `--init-delay`, standing in for codex-acp's
//! ≈ 0.6 s start).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::scale::{Ctl, cold_start, median};
use crate::{ACPD, Opts};

/// How long the stand-in agent takes to answer initialize.
const INIT_MS: u64 = 300;

pub async fn run(opts: &Opts) -> Value {
    let reps = if opts.quick { 3 } else { 15 };
    let init = INIT_MS.to_string();
    let mut cold = Vec::new();
    for _ in 0..reps {
        cold.push(cold_start(&["agent", "echo", "--init-delay", &init]).await);
    }
    let config = format!(
        "default_provider = \"slow\"\n[providers.slow]\ncommand = [\"{ACPD}\", \"agent\", \"echo\", \"--init-delay\", \"{INIT_MS}\"]\nwarm = 1\n"
    );
    let ctl = Ctl::serve(&config, 16).await;
    let mut warm = Vec::new();
    for _ in 0..reps {
        wait_for_spare(&ctl).await;
        let started = Instant::now();
        // Left open (the agent has no session/close): at most 15, under the connection's 16.
        ctl.call(
            "session/new",
            json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await;
        warm.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let (c, w) = (median(cold), median(warm));
    println!(
        "\n(6) warm start (median of {reps}, initialize takes {INIT_MS} ms): cold spawn+initialize+session/new {c:.1} ms, session/new through acpd with a ready spare {w:.1} ms, ratio {:.3} (target <= 0.15)",
        w / c
    );
    json!({ "initMs": INIT_MS, "coldMs": c, "warmMs": w, "ratio": w / c })
}

/// Waits until the daemon reports a ready spare (the one taken last time is replaced in the
/// background).
async fn wait_for_spare(ctl: &Ctl) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = ctl.call("_acpd/status", json!({})).await;
        if status["spares"]["slow"].as_u64().unwrap_or(0) >= 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no warm spare within 30 s: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
