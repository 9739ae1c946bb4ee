//! acpd's benchmarks: what acpd costs on top of a direct connection. Every figure is measured
//! side by side with its baseline in the same run and reported as a ratio, because these
//! machines are noisy; absolute numbers are printed too.
//!
//! `cargo bench -p acpd --bench acpd -- [--quick] [--json FILE]`

mod stream;

use std::path::PathBuf;

pub const ACPD: &str = env!("CARGO_BIN_EXE_acpd");

pub struct Opts {
    pub quick: bool,
    pub json: Option<PathBuf>,
}

fn main() {
    let mut opts = Opts {
        quick: false,
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--json" => opts.json = args.next().map(PathBuf::from),
            // cargo bench passes --bench; libtest filters are not used here.
            _ => {}
        }
    }
    let mut report = serde_json::Map::new();
    report.insert("streaming".into(), stream::run(&opts));
    let report = serde_json::Value::Object(report);
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        eprintln!("results written to {}", path.display());
    }
}
