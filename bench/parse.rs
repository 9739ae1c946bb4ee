//! (0d) The envelope parse on its own: ns per line of `envelope::parse_ref` (the single-pass
//! scan) against the serde_json parse it replaced (`envelope::oracle`, the tests' oracle), on
//! a typical 272-byte `session/update`, interleaved rounds in one process.

use std::hint::black_box;
use std::time::Instant;

use acpd_protocol::envelope::{self, oracle};
use serde_json::{Value, json};

use crate::Opts;
use crate::hotpath::median;

/// ns per call of `parse` over `n` calls on `line`.
fn per_line(n: u32, line: &[u8], parse: impl Fn(&[u8]) -> bool) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        black_box(parse(black_box(line)));
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

pub fn run(opts: &Opts) -> Value {
    let n: u32 = if opts.quick { 100_000 } else { 2_000_000 };
    let rounds = if opts.quick { 1 } else { 5 };
    let line = oracle::TYPICAL_UPDATE.as_bytes();
    println!(
        "\n(0d) envelope parse of a {}-byte session/update, ns per line, {n} calls, {rounds} interleaved rounds",
        line.len()
    );
    let (mut scan, mut serde, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let scan_first = round % 2 == 1;
        let run_scan = || per_line(n, line, |l| envelope::parse_ref(l).is_ok());
        let run_serde = || per_line(n, line, |l| oracle::parse_ref_serde(l).is_ok());
        let (a, b) = if scan_first {
            let a = run_scan();
            (a, run_serde())
        } else {
            let b = run_serde();
            (run_scan(), b)
        };
        println!(
            "{round:>5} scan {a:>8.1} ns   serde_json {b:>8.1} ns   {:>5.2}x",
            a / b
        );
        scan.push(a);
        serde.push(b);
        ratios.push(a / b);
    }
    let (ms, mo, mr) = (
        median(scan.clone()),
        median(serde.clone()),
        median(ratios.clone()),
    );
    println!(
        "median: scan {ms:.1} ns, serde_json {mo:.1} ns: the scan takes {mr:.2}x serde_json's time"
    );
    json!({
        "lineBytes": line.len(), "calls": n, "rounds": rounds,
        "scanNs": ms, "serdeNs": mo, "ratio": mr,
        "scanRounds": scan, "serdeRounds": serde,
    })
}
