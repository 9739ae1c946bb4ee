//! acpd's benchmarks: what acpd costs on top of a direct connection, and how it scales. Every
//! figure is measured side by side with its baseline in the same run and reported as a ratio or
//! a difference, because these machines are noisy; absolute numbers are printed too.
//!
//! `cargo bench -p acpd --bench acpd -- [--quick] [--json FILE] [--readme]`
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

mod parent;
mod report;
mod scale;
mod stream;

use std::path::PathBuf;

pub const ACPD: &str = env!("CARGO_BIN_EXE_acpd");

pub struct Opts {
    pub quick: bool,
    pub json: Option<PathBuf>,
    /// Rewrite README.md's results table from this run.
    pub readme: bool,
}

/// `--relay CMD…`: a plain byte relay between this process's stdio and CMD's, one thread per
/// direction. The bench puts it in the path as the floor for "one more process hop".
fn relay(argv: &[String]) -> ! {
    use std::process::{Command, Stdio};
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the relayed command");
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_child);
    });
    let _ = copy_unbuffered(&mut from_child, &mut std::io::stdout());
    let _ = child.kill();
    std::process::exit(0)
}

/// `io::copy` into a locked, line-buffered stdout would hold bytes back; write each read.
fn copy_unbuffered(
    from: &mut impl std::io::Read,
    to: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--relay") {
        relay(&args[i + 1..]);
    }
    bench();
}

#[tokio::main]
async fn bench() {
    let mut opts = Opts {
        quick: false,
        json: None,
        readme: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--readme" => opts.readme = true,
            // Relative to the workspace root (cargo runs benches from the package directory).
            "--json" => {
                let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
                opts.json = args.next().map(|p| root.join(p));
            }
            // cargo passes --bench; there are no libtest filters here.
            _ => {}
        }
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "acpd {} bench on {cores} cores{}",
        env!("CARGO_PKG_VERSION"),
        if opts.quick { " (quick)" } else { "" }
    );
    let report = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "cores": cores,
        "quick": opts.quick,
        "streaming": stream::run(&opts).await,
        "start": scale::start(&opts).await,
        "scale": scale::scale(&opts).await,
        "teardown": scale::teardown(&opts).await,
    });
    if opts.readme {
        let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
        report::update_readme(&readme, &report::markdown(&report)).unwrap();
        println!("README.md results table regenerated");
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        println!("\nresults written to {}", path.display());
    }
}
