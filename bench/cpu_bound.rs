//! (0b) Throughput when both ends are CPU-bound: a Python agent (`bench/py/agent.py`, every
//! update built with `json.dumps` and written with its own write) streams 100-byte
//! `agent_message_chunk`s to a Python parent (`bench/py/parent.py`, every line decoded with
//! `json.loads`), directly and through `acpd stdio`, interleaved, best of 3 each; the ratio is
//! direct's time over acpd's (1.0: acpd costs the pair nothing). Skipped, with the reason
//! printed, when `python3` does not run.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use crate::Opts;
use crate::hotpath::Setup;

const CHUNK: usize = 100;

pub fn python_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/py")
}

/// One stream: the parent's own clock from the prompt to its answer, in seconds.
fn stream(agent_argv: &[String], n: u64) -> f64 {
    let out = Command::new("python3")
        .arg(python_dir().join("parent.py"))
        .arg(n.to_string())
        .arg(CHUNK.to_string())
        .args(agent_argv)
        .env(
            "STATE_DIRECTORY",
            std::env::temp_dir().join("acpd-bench-state"),
        )
        .env_remove("ACPD_CONFIG")
        .env_remove("ACPD_DEPTH")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "parent.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["chunks"], n, "every chunk arrives");
    report["secs"].as_f64().unwrap()
}

/// Whether `python3` runs here (the Python rows need it).
pub fn python_runs() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn run(opts: &Opts) -> Value {
    run_with(opts, &Setup::DEFAULT)
}

/// The row for `acpd stdio` configured by `setup` (its config gets the Python agent as the
/// default provider).
pub fn run_with(opts: &Opts, setup: &Setup<'_>) -> Value {
    if !python_runs() {
        println!("\n(0b) CPU-bound pair skipped: python3 does not run");
        return Value::Null;
    }
    let n: u64 = if opts.quick { 5_000 } else { 50_000 };
    let rounds = if opts.quick { 1 } else { 5 };
    let agent = vec![
        "python3".to_string(),
        python_dir().join("agent.py").to_string_lossy().into_owned(),
    ];
    let config = format!(
        "{}\ndefault_provider = \"py\"\n[providers.py]\ncommand = [{:?}, {:?}]\n",
        setup.config, agent[0], agent[1]
    );
    let dir = tempfile::tempdir().unwrap();
    let acpd = Setup {
        label: setup.label,
        config: &config,
    }
    .argv(dir.path());
    let relay = crate::hotpath::c_relay(&agent)
        .inspect_err(|why| println!("\n(0b) C relay column skipped: {why}"))
        .ok();
    println!(
        "\n(0b) CPU-bound pair, {}: a Python agent streams {n} {CHUNK}-byte chunks to a Python parent, best of {rounds}, interleaved; the C relay (bench/relay.c) is the floor of any process in between",
        setup.label
    );
    let (mut direct, mut through, mut relayed) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        // The order turns every round, so no path always runs first or last.
        let mut order: Vec<usize> = vec![0, 1, 2];
        order.rotate_left(round % 3);
        let mut secs = [f64::NAN; 3];
        for path in order {
            secs[path] = match path {
                0 => stream(&agent, n),
                1 => stream(&acpd, n),
                _ => relay.as_ref().map_or(f64::NAN, |r| stream(r, n)),
            };
        }
        let [d, a, r] = secs;
        println!(
            "{round:>5} direct {:>8.1} ms   acpd stdio {:>8.1} ms {:>5.2}x   C relay {:>8.1} ms {:>5.2}x",
            d * 1e3,
            a * 1e3,
            d / a,
            r * 1e3,
            d / r
        );
        direct.push(d);
        through.push(a);
        relayed.push(r);
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (bd, ba, br) = (best(&direct), best(&through), best(&relayed));
    println!(
        "best: direct {:.1} ms, acpd stdio {:.1} ms, C relay {:.1} ms: throughput {:.2}x direct (target ≥ 0.9x; the C relay {:.2}x)",
        bd * 1e3,
        ba * 1e3,
        br * 1e3,
        bd / ba,
        bd / br
    );
    json!({
        "setup": setup.label, "messages": n, "chunkBytes": CHUNK, "rounds": rounds,
        "directMs": bd * 1e3, "acpdMs": ba * 1e3, "throughputRatio": bd / ba,
        "relayMs": br * 1e3, "relayThroughputRatio": bd / br,
        "directRounds": direct, "acpdRounds": through, "relayRounds": relayed,
    })
}
