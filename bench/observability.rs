//! (0c) What metrics and tracing cost on the hot path: the CPU per forwarded update of row (0),
//! each with the feature on against off, measured in interleaved rounds of the same run.
//!
//! - Metrics: `acpd serve` (the only face with `metrics_listen`) with the listener on and a
//!   scraper fetching `/metrics` every 100 ms through the stream, against the same daemon
//!   without it; the parent is `acpd connect`, and the daemon's own CPU is what is charged.
//!   The counters themselves are always kept (two relaxed atomic adds per message), so "off"
//!   is the daemon nobody scrapes.
//! - Tracing: `acpd stdio` with `OTEL_EXPORTER_OTLP_ENDPOINT` set (export on, to a port that
//!   refuses, so no collector's speed is measured), against it unset.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::hotpath::{measure_charging, median};
use crate::stream::Daemon;
use crate::{ACPD, Opts};

/// Fetches `/metrics` from `port` every 100 ms until `stop`; counts the answers that were 200.
fn scraper(port: u16, stop: Arc<AtomicBool>, scrapes: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ =
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n");
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            if answer.starts_with(b"HTTP/1.1 200") {
                scrapes.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A port nothing listens on now (the kernel's pick, released at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(9464)
}

pub fn run(opts: &Opts) -> Value {
    let n: u64 = if opts.quick { 50_000 } else { 500_000 };
    let rounds = if opts.quick { 1 } else { 5 };
    let port = free_port();
    let plain = Daemon::start("");
    let metered = Daemon::start(&format!("metrics_listen = \"127.0.0.1:{port}\"\n"));
    let connect = |d: &Daemon| {
        vec![
            ACPD.to_string(),
            "connect".into(),
            "--socket".into(),
            d.socket.to_string_lossy().into_owned(),
        ]
    };
    let stdio: Vec<String> = vec![ACPD.into(), "stdio".into()];
    // `env` execs acpd in place: the pid measured is acpd's.
    let traced: Vec<String> = ["env", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9"]
        .into_iter()
        .map(String::from)
        .chain(stdio.iter().cloned())
        .collect();
    println!(
        "\n(0c) metrics and tracing on the hot path: CPU per forwarded update (utime+stime), {n} updates, {rounds} interleaved rounds"
    );
    println!(
        "{:>5} {:>14} {:>14} {:>8} {:>14} {:>14} {:>8} {:>8}",
        "round",
        "serve off µs",
        "scraped µs",
        "ratio",
        "stdio off µs",
        "OTLP on µs",
        "ratio",
        "scrapes"
    );
    let (mut m_ratio, mut t_ratio) = (Vec::new(), Vec::new());
    let (mut m_off, mut m_on, mut t_off, mut t_on) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut total_scrapes = 0;
    for round in 1..=rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let scrapes = Arc::new(AtomicU64::new(0));
        let scraping = {
            let (stop, scrapes) = (stop.clone(), scrapes.clone());
            std::thread::spawn(move || scraper(port, stop, scrapes))
        };
        let go = |argv: &[String], charged: Option<u32>| {
            measure_charging(argv, n, charged).us_per_update
        };
        // The order turns every round, so no setup always runs first.
        let (a, b, c, d) = if round % 2 == 1 {
            let a = go(&connect(&plain), Some(plain.child.id()));
            let b = go(&connect(&metered), Some(metered.child.id()));
            let c = go(&stdio, None);
            (a, b, c, go(&traced, None))
        } else {
            let d = go(&traced, None);
            let c = go(&stdio, None);
            let b = go(&connect(&metered), Some(metered.child.id()));
            (go(&connect(&plain), Some(plain.child.id())), b, c, d)
        };
        stop.store(true, Ordering::Relaxed);
        let _ = scraping.join();
        let scraped = scrapes.load(Ordering::Relaxed);
        total_scrapes += scraped;
        println!(
            "{round:>5} {a:>14.3} {b:>14.3} {:>7.3}x {c:>14.3} {d:>14.3} {:>7.3}x {scraped:>8}",
            b / a,
            d / c
        );
        m_ratio.push(b / a);
        t_ratio.push(d / c);
        m_off.push(a);
        m_on.push(b);
        t_off.push(c);
        t_on.push(d);
    }
    let (mr, tr) = (median(m_ratio.clone()), median(t_ratio.clone()));
    println!(
        "median: metrics served and scraped = {mr:.3}x the same daemon unscraped; OTLP export on = {tr:.3}x off ({total_scrapes} scrapes answered)"
    );
    json!({
        "updates": n, "rounds": rounds,
        "metricsOffUs": median(m_off), "metricsOnUs": median(m_on), "metricsRatio": mr,
        "tracingOffUs": median(t_off), "tracingOnUs": median(t_on), "tracingRatio": tr,
        "metricsRatioRounds": m_ratio, "tracingRatioRounds": t_ratio, "scrapes": total_scrapes,
    })
}
