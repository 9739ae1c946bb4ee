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

fn python_dir() -> PathBuf {
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

pub fn run(opts: &Opts) -> Value {
    run_with(opts, &Setup::DEFAULT)
}

/// The row for `acpd stdio` configured by `setup` (its config gets the Python agent as the
/// default provider).
pub fn run_with(opts: &Opts, setup: &Setup<'_>) -> Value {
    if let Err(why) = Command::new("python3").arg("--version").output() {
        println!("\n(0b) CPU-bound pair skipped: python3 does not run ({why})");
        return Value::Null;
    }
    let n: u64 = if opts.quick { 5_000 } else { 50_000 };
    let rounds = if opts.quick { 1 } else { 3 };
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
    println!(
        "\n(0b) CPU-bound pair, {}: a Python agent streams {n} {CHUNK}-byte chunks to a Python parent, best of {rounds}, interleaved",
        setup.label
    );
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (d, a) = if round % 2 == 1 {
            let d = stream(&agent, n);
            (d, stream(&acpd, n))
        } else {
            let a = stream(&acpd, n);
            (stream(&agent, n), a)
        };
        println!(
            "{round:>5} direct {:>8.1} ms   acpd stdio {:>8.1} ms   {:>5.2}x",
            d * 1e3,
            a * 1e3,
            d / a
        );
        direct.push(d);
        through.push(a);
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (bd, ba) = (best(&direct), best(&through));
    println!(
        "best: direct {:.1} ms, acpd stdio {:.1} ms: throughput {:.2}x direct (target ≥ 0.9x)",
        bd * 1e3,
        ba * 1e3,
        bd / ba
    );
    json!({
        "setup": setup.label, "messages": n, "chunkBytes": CHUNK, "rounds": rounds,
        "directMs": bd * 1e3, "acpdMs": ba * 1e3, "throughputRatio": bd / ba,
        "directRounds": direct, "acpdRounds": through,
    })
}
