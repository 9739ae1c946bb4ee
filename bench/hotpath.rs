//! (0) The hot path's CPU: acpd's own utime + stime (from `/proc/PID/stat`) per forwarded
//! `session/update`, next to a plain byte relay (the bench's `--relay`: two threads copying
//! read → write, no parsing) in the same position on the same stream, in the same run.
//!
//! The parent here is raw: it reads acpd's stdout in large chunks and only counts newlines, so
//! it is never the bottleneck and spends nothing acpd would be charged for.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

use crate::{ACPD, Opts};

/// Filler bytes per chunk: the echo agent's `session/update` line is then 272 bytes.
const CHUNK: usize = 112;

/// `utime + stime` of `pid` (all its threads, live and exited), in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // Fields 14 and 15 of stat(5); the slice starts at field 3.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// CPU time of `pid`'s live threads in ns (`/proc/PID/task/*/schedstat`): finer than clock
/// ticks, but blind to threads that exited meanwhile, so it only cross-checks `cpu_ticks`.
pub fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

pub fn ticks_per_sec() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

struct Raw {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Raw {
    fn spawn(argv: &[String]) -> Raw {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env("XDG_CONFIG_HOME", "/nonexistent-acpd-bench")
            .env(
                "STATE_DIRECTORY",
                std::env::temp_dir().join("acpd-bench-state"),
            )
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::with_capacity(256 * 1024, child.stdout.take().unwrap());
        Raw {
            child,
            stdin,
            stdout,
            next_id: 0,
        }
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let stdin = self.stdin.as_mut().unwrap();
        let msg = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
        self.next_id
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params);
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{method}: {e}: {line}"))
    }

    /// Reads until `lines` newlines have gone by, as fast as it can; the last line must be the
    /// prompt's answer. Returns the bytes read.
    fn drain_lines(&mut self, lines: u64) -> u64 {
        let (mut seen, mut bytes) = (0u64, 0u64);
        let mut tail: Vec<u8> = Vec::new();
        while seen < lines {
            let buf = self.stdout.fill_buf().unwrap();
            assert!(!buf.is_empty(), "the stream ended after {seen} lines");
            let mut used = buf.len();
            for (i, _) in buf.iter().enumerate().filter(|(_, b)| **b == b'\n') {
                seen += 1;
                if seen == lines {
                    used = i + 1;
                    break;
                }
            }
            tail.extend_from_slice(&buf[used.saturating_sub(512)..used]);
            if tail.len() > 1024 {
                tail.drain(..tail.len() - 512);
            }
            bytes += used as u64;
            self.stdout.consume(used);
        }
        let tail = String::from_utf8_lossy(&tail);
        assert!(
            tail.contains("stopReason"),
            "the last line answers the prompt"
        );
        bytes
    }

    fn prompt(&mut self, session: &Value, text: &str) {
        self.send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        );
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

struct Sample {
    us_per_update: f64,
    /// The same from schedstat (ns resolution).
    fine_us_per_update: f64,
    line_bytes: f64,
    secs: f64,
}

/// Streams `n` updates through `argv` and charges it its own CPU over the stream.
fn measure(argv: &[String], n: u64) -> Sample {
    let mut raw = Raw::spawn(argv);
    raw.call("initialize", json!({"protocolVersion": 1}));
    let new = raw.call(
        "session/new",
        json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    let session = new["result"]["sessionId"].clone();
    // Warm-up: buffers, the blocking pool, the allocator.
    raw.prompt(&session, &format!(":chunks {} {CHUNK}", n / 20 + 1));
    raw.drain_lines(n / 20 + 2);
    let pid = raw.child.id();
    let before = cpu_ticks(pid).unwrap();
    let before_ns = cpu_ns(pid);
    let started = Instant::now();
    raw.prompt(&session, &format!(":chunks {n} {CHUNK}"));
    let bytes = raw.drain_lines(n + 1);
    let secs = started.elapsed().as_secs_f64();
    let after = cpu_ticks(pid).unwrap();
    let after_ns = cpu_ns(pid);
    Sample {
        fine_us_per_update: after_ns.saturating_sub(before_ns) as f64 / 1e3 / n as f64,
        us_per_update: (after - before) as f64 / ticks_per_sec() * 1e6 / n as f64,
        line_bytes: bytes as f64 / (n + 1) as f64,
        secs,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(opts: &Opts) -> Value {
    let n: u64 = if opts.quick { 50_000 } else { 2_000_000 };
    let rounds = if opts.quick { 1 } else { 3 };
    let acpd: Vec<String> = vec![ACPD.into(), "stdio".into()];
    let relay = crate::stream::relay_argv();
    println!(
        "\n(0) hot path: CPU per forwarded session/update (utime+stime from /proc/PID/stat; schedstat in brackets), {n} updates of {CHUNK} B text, {rounds} alternating rounds"
    );
    println!(
        "{:>5} {:>24} {:>24} {:>16} {:>8} {:>8}",
        "round", "acpd µs/update", "relay µs/update", "ratio", "acpd s", "relay s"
    );
    let (mut a, mut r, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fa, mut fr, mut fine_ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut line_bytes = 0.0;
    for round in 1..=rounds {
        let sa = measure(&acpd, n);
        let sr = measure(&relay, n);
        // A short stream can leave the relay under one clock tick: no ratio then.
        let ratio = if sr.us_per_update > 0.0 {
            sa.us_per_update / sr.us_per_update
        } else {
            f64::NAN
        };
        let fine = sa.fine_us_per_update / sr.fine_us_per_update;
        println!(
            "{:>5} {:>10.3} [{:>9.3}] {:>10.3} [{:>9.3}] {:>6.2}x [{:>5.2}x] {:>8.2} {:>8.2}",
            round,
            sa.us_per_update,
            sa.fine_us_per_update,
            sr.us_per_update,
            sr.fine_us_per_update,
            ratio,
            fine,
            sa.secs,
            sr.secs
        );
        line_bytes = sa.line_bytes;
        a.push(sa.us_per_update);
        r.push(sr.us_per_update);
        ratios.push(ratio);
        fa.push(sa.fine_us_per_update);
        fr.push(sr.fine_us_per_update);
        fine_ratios.push(fine);
    }
    let (ma, mr, mx) = (median(a.clone()), median(r.clone()), median(ratios.clone()));
    let (fma, fmr, fmx) = (
        median(fa.clone()),
        median(fr.clone()),
        median(fine_ratios.clone()),
    );
    println!(
        "median: acpd {ma:.3} µs [{fma:.3}], relay {mr:.3} µs [{fmr:.3}] per update ({line_bytes:.0}-byte lines to the parent): acpd = {mx:.2}x [{fmx:.2}x] the relay (target ≤ 1.5x)"
    );
    json!({
        "updates": n, "rounds": rounds, "chunkBytes": CHUNK, "lineBytes": line_bytes,
        "acpdUsPerUpdate": ma, "relayUsPerUpdate": mr, "ratio": mx,
        "acpdSchedUsPerUpdate": fma, "relaySchedUsPerUpdate": fmr, "schedRatio": fmx,
        "acpdRounds": a, "relayRounds": r, "ratioRounds": ratios,
    })
}
