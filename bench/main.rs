//! acpd's benchmarks: what acpd costs on top of a direct connection, and how it scales. Every
//! figure is measured side by side with its baseline in the same run and reported as a ratio or
//! a difference, because these machines are noisy; absolute numbers are printed too.
//!
//! `cargo bench -p acpd --bench acpd -- [--quick] [--json FILE] [--readme]`, and
//! `cargo bench -p acpd --bench acpd -- soak` for the long-running soak (not part of the table).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

mod containment;
mod cpu_bound;
mod hotpath;
mod isolation;
mod netclient;
mod network;
mod observability;
mod parent;
mod parse;
mod report;
mod scale;
mod soak;
mod stream;
mod warm;

use std::path::PathBuf;

pub const ACPD: &str = env!("CARGO_BIN_EXE_acpd");

pub struct Opts {
    pub quick: bool,
    pub json: Option<PathBuf>,
    /// Rewrite the results table in docs/src/benchmarks.md from this run.
    pub readme: bool,
    /// `--only SECTION` (hotpath, observability, streaming, start, scale, teardown, warm,
    /// containment, isolation, network): run just that one.
    pub only: Option<String>,
    /// `--sizes 64,1024`: the scale rows' K values instead of the defaults.
    pub sizes: Option<Vec<usize>>,
    /// `--host stdio` or `--host serve`: the scale rows of that one only.
    pub host: Option<String>,
}

impl Opts {
    fn runs(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == section)
    }
}

/// `--relay CMD…`: a plain byte relay between this process's stdio and CMD's, one thread per
/// direction, each copying read → write on the raw descriptors (no parsing, no line
/// buffering). The bench puts it in the path as the floor for "one more process hop", and
/// measures its CPU per update next to acpd's.
fn relay(argv: &[String]) -> ! {
    use nix::libc;
    use std::os::fd::FromRawFd;
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};
    let zero = libc::sched_param { sched_priority: 0 };
    // Scheduled as acpd is (supervise::sched): batch itself, the default back for its child.
    // SAFETY: plain syscalls with a valid parameter; the pre_exec closure makes one.
    let batch = unsafe {
        libc::sched_getscheduler(0) == libc::SCHED_OTHER
            && libc::sched_setscheduler(0, libc::SCHED_BATCH, &zero) == 0
    };
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if batch {
        unsafe {
            cmd.pre_exec(move || {
                libc::sched_setscheduler(0, libc::SCHED_OTHER, &zero);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("spawn the relayed command");
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = child.stdout.take().unwrap();
    // SAFETY: fds 0 and 1 are this process's stdio, open for its whole life; ManuallyDrop keeps
    // them from being closed twice.
    let mut stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
    let mut stdout = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
    std::thread::spawn(move || {
        let _ = copy_raw(&mut *stdin, &mut to_child);
        drop(to_child);
    });
    let _ = copy_raw(&mut from_child, &mut *stdout);
    let _ = child.kill();
    std::process::exit(0)
}

/// One `write` per `read`, nothing held back.
fn copy_raw(from: &mut impl std::io::Read, to: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
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
        only: None,
        sizes: None,
        host: None,
    };
    let mut soak = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "soak" => soak = true,
            "--only" => opts.only = args.next(),
            "--sizes" => {
                opts.sizes = args
                    .next()
                    .map(|s| s.split(',').filter_map(|k| k.parse().ok()).collect())
            }
            "--host" => opts.host = args.next(),
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
    if soak {
        soak::run().await;
        return;
    }
    let none = serde_json::Value::Null;
    let report = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "cores": cores,
        "quick": opts.quick,
        "hotPath": if opts.runs("hotpath") { hotpath::run(&opts) } else { none.clone() },
        "observability": if opts.runs("observability") { observability::run(&opts) } else { none.clone() },
        "streaming": if opts.runs("streaming") { stream::run(&opts).await } else { none.clone() },
        "start": if opts.runs("start") { scale::start(&opts).await } else { none.clone() },
        "scale": if opts.runs("scale") { scale::scale(&opts).await } else { none.clone() },
        "teardown": if opts.runs("teardown") { scale::teardown(&opts).await } else { none.clone() },
        "warm": if opts.runs("warm") { warm::run(&opts).await } else { none.clone() },
        "warmAgents": if opts.runs("warm") { warm::agents(&opts).await } else { none.clone() },
        "containment": if opts.runs("containment") { containment::run(&opts).await } else { none.clone() },
        "isolation": if opts.runs("isolation") { isolation::run(&opts).await } else { none.clone() },
        "network": if opts.runs("network") { network::run(&opts) } else { none },
    });
    if opts.only.is_some() {
        return;
    }
    if opts.readme {
        let readme = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/benchmarks.md");
        report::update_readme(&readme, &report::markdown(&report)).unwrap();
        println!("docs/src/benchmarks.md results table regenerated");
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        println!("\nresults written to {}", path.display());
    }
}
