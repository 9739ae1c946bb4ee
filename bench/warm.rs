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

/// The real agents of the differential harness (issue 19), by name: where each one's entry
/// point lies under `tests/interop/node_modules` once `npm ci` has run there.
const AGENTS: [(&str, &str); 4] = [
    (
        "claude",
        "@agentclientprotocol/claude-agent-acp/dist/index.js",
    ),
    ("codex", "@agentclientprotocol/codex-acp/dist/index.js"),
    ("gemini", "@google/gemini-cli/bundle/gemini.js"),
    ("opencode", "opencode-ai/bin/opencode.exe"),
];

/// How long one agent's measurement may take (its cold starts, then acpd's).
const AGENT_RUN: Duration = Duration::from_secs(400);

/// (6b) Warm start for every real agent: `session/new` through `acpd stdio` with `warm = 1`
/// once the spare is ready, against the agent's own cold start (spawn + initialize +
/// session/new, directly), both offline against the harness's mock model. Measured by
/// `tests/interop/agents.mjs --bench N` (the harness knows how each agent runs offline);
/// skipped, saying why, when node, the harness or an agent is not installed.
pub async fn agents(opts: &Opts) -> Value {
    let interop = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/interop");
    let harness = interop.join("agents.mjs");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let why = if !node {
        Some("node is not on PATH".to_string())
    } else if !harness.exists() {
        Some(format!("{} is missing", harness.display()))
    } else {
        None
    };
    if let Some(why) = why {
        println!("\n(6b) warm start with the real agents: skipped ({why})");
        return json!({ "skipped": why });
    }
    let n = if opts.quick { 3 } else { 7 };
    println!(
        "\n(6b) warm start with the real agents (median of {n}, offline against the mock model; target <= 0.15):"
    );
    let mut rows = Vec::new();
    for (agent, entry) in AGENTS {
        if !interop.join("node_modules").join(entry).exists() {
            let why = format!("not installed (run `npm ci` in {})", interop.display());
            println!("  {agent:<9} skipped: {why}");
            rows.push(json!({ "agent": agent, "skipped": why }));
            continue;
        }
        let work = tempfile::tempdir().unwrap();
        let run = tokio::process::Command::new("node")
            .arg(&harness)
            .args(["--agent", agent, "--work"])
            .arg(work.path())
            .args(["--acpd", ACPD, "--sides", "", "--bench", &n.to_string()])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let report: Value = match tokio::time::timeout(AGENT_RUN, run).await {
            Ok(Ok(out)) => serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
            Ok(Err(e)) => json!({ "error": e.to_string() }),
            Err(_) => json!({ "error": format!("no report within {AGENT_RUN:?}") }),
        };
        let bench = &report["bench"];
        match (bench["coldMs"].as_f64(), bench["warmMs"].as_f64()) {
            (Some(c), Some(w)) => println!(
                "  {agent:<9} cold spawn+initialize+session/new {c:.0} ms (its session/new {} ms), session/new through acpd stdio {w:.0} ms: ratio {:.3}",
                bench["coldSessionNewMs"],
                w / c
            ),
            _ => println!(
                "  {agent:<9} failed: {}",
                [
                    &bench["error"],
                    &report["error"],
                    &bench["raw"]["warmError"],
                    &bench["raw"]["coldError"]
                ]
                .into_iter()
                .find(|e| !e.is_null())
                .map_or("no figures".to_string(), |e| e.to_string())
            ),
        }
        rows.push(json!({
            "agent": agent,
            "coldMs": bench["coldMs"],
            "coldSessionNewMs": bench["coldSessionNewMs"],
            "warmMs": bench["warmMs"],
            "ratio": bench["ratio"],
            "warmRunsMs": bench["raw"]["warm"],
        }));
    }
    json!({ "n": n, "agents": rows })
}
