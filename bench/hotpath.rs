//! (0) The hot path's CPU: acpd's own utime + stime (from `/proc/PID/stat`) per forwarded
//! `session/update`, next to a plain byte relay in the same position on the same stream, in the
//! same run: the baseline is `bench/relay.c` (two threads copying read → write, no parsing),
//! compiled with `cc -O2` into `target/bench-tools/` when the bench starts; the bench's own
//! Rust `--relay` is measured too. Without a C compiler the C relay is skipped (the reason is
//! printed) and the ratio is against the Rust relay.
//!
//! The parent here is raw: it reads acpd's stdout in large chunks and only counts newlines, so
//! it is never the bottleneck and spends nothing acpd would be charged for. acpd grows the pipe
//! it writes to the parent to 1 MiB (`runtime/stdio.rs::grow_pipe`); the relays copy through
//! the default 64 KiB pipe, as the floor the issue names does (given 1 MiB too, the C relay
//! measured 0.12–0.16 µs here where it took 0.13–0.17 µs).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
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

pub struct Sample {
    pub us_per_update: f64,
    /// The same from schedstat (ns resolution).
    pub fine_us_per_update: f64,
    line_bytes: f64,
    secs: f64,
}

/// What writes the stream. How often it writes decides how many lines each read of a relay
/// (or of acpd) carries, and so what a relay costs per line: the same relay costs several
/// times more per line when lines come one per write than when they come in bulk.
#[derive(Clone, Copy, PartialEq)]
pub enum Source {
    /// The echo agent (`:chunks`): its writer sends whatever queued since its last write, so
    /// under a flood a read carries many lines.
    Flood,
    /// `bench/py/agent.py`: every update its own `write(2)`, as ACP agents write (one message,
    /// one flush); slower than any relay, so a read carries one line or a few.
    PerMessage,
}

impl Source {
    /// The agent's argv.
    fn agent(self) -> Vec<String> {
        match self {
            Source::Flood => vec![ACPD.into(), "agent".into(), "echo".into()],
            Source::PerMessage => vec![
                "python3".into(),
                crate::cpu_bound::python_dir()
                    .join("agent.py")
                    .to_string_lossy()
                    .into_owned(),
            ],
        }
    }

    /// The prompt that makes the agent stream `n` updates of [`CHUNK`] text bytes.
    fn prompt(self, n: u64) -> String {
        match self {
            Source::Flood => format!(":chunks {n} {CHUNK}"),
            Source::PerMessage => format!("{n} {CHUNK}"),
        }
    }

    /// acpd's config for this source: `setup`'s, with the agent as the default provider.
    fn config(self, setup: &Setup<'_>) -> String {
        match self {
            Source::Flood => setup.config.to_string(),
            Source::PerMessage => {
                let agent = self.agent();
                format!(
                    "{}\ndefault_provider = \"py\"\n[providers.py]\ncommand = [{:?}, {:?}]\n",
                    setup.config, agent[0], agent[1]
                )
            }
        }
    }
}

/// [`measure_source`] for the echo agent's flood.
pub fn measure_charging(argv: &[String], n: u64, charged: Option<u32>) -> Sample {
    measure_source(argv, n, charged, Source::Flood)
}

/// Streams `n` updates from `source` through `argv` and charges `argv`'s own process (or
/// `charged`, a daemon `argv` only connects to) its CPU over the stream.
pub fn measure_source(argv: &[String], n: u64, charged: Option<u32>, source: Source) -> Sample {
    let mut raw = Raw::spawn(argv);
    raw.call("initialize", json!({"protocolVersion": 1}));
    let new = raw.call(
        "session/new",
        json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
    );
    let session = new["result"]["sessionId"].clone();
    // Warm-up: buffers, the blocking pool, the allocator.
    raw.prompt(&session, &source.prompt(n / 20 + 1));
    raw.drain_lines(n / 20 + 2);
    let pid = charged.unwrap_or_else(|| raw.child.id());
    let before = cpu_ticks(pid).unwrap();
    let before_ns = cpu_ns(pid);
    let started = Instant::now();
    raw.prompt(&session, &source.prompt(n));
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

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// How `acpd stdio` is configured in a hot-path row, so one row can be measured with a
/// feature on and with it off (`Setup { label: "metrics on", config: "metrics_listen = …" }`).
pub struct Setup<'a> {
    pub label: &'a str,
    /// `config.toml` text; empty for the built-in defaults.
    pub config: &'a str,
}

impl Setup<'_> {
    pub const DEFAULT: Setup<'static> = Setup {
        label: "acpd stdio",
        config: "",
    };

    /// `acpd --config FILE stdio`, its config file written into `dir`.
    pub fn argv(&self, dir: &Path) -> Vec<String> {
        let name: String = self
            .label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, self.config).unwrap();
        vec![
            ACPD.into(),
            "--config".into(),
            path.to_string_lossy().into_owned(),
            "stdio".into(),
        ]
    }
}

/// Where the bench keeps what it builds for itself (the C relay).
pub fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-tools")
}

/// `bench/relay.c` compiled with `cc -O2` (again when the source is newer), as the argv that
/// relays to `agent`; `Err` says why there is none.
pub fn c_relay(agent: &[String]) -> Result<Vec<String>, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/relay.c");
    let bin = tools_dir().join("relay");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&bin).is_none() || modified(&bin) < modified(&src) {
        std::fs::create_dir_all(tools_dir())
            .map_err(|e| format!("{}: {e}", tools_dir().display()))?;
        let out = Command::new("cc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .map_err(|e| format!("no C compiler (cc: {e})"))?;
        if !out.status.success() {
            return Err(format!(
                "cc -O2 {} failed: {}",
                src.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let mut argv = vec![bin.to_string_lossy().into_owned()];
    argv.extend_from_slice(agent);
    Ok(argv)
}

pub fn run(opts: &Opts) -> Value {
    let mut row = cpu_row(opts, &Setup::DEFAULT, Source::Flood);
    row["perMessage"] = if crate::cpu_bound::python_runs() {
        cpu_row(opts, &Setup::DEFAULT, Source::PerMessage)
    } else {
        println!("\n(0) per-message hot path skipped: python3 does not run");
        Value::Null
    };
    row["cpuBound"] = crate::cpu_bound::run(opts);
    row["parse"] = crate::parse::run(opts);
    row
}

/// Row (0) for `setup` and `source`: acpd's CPU per update against the relays, interleaved
/// rounds.
pub fn cpu_row(opts: &Opts, setup: &Setup<'_>, source: Source) -> Value {
    // A million: the relay spends only a few clock ticks of utime + stime on them. The Python
    // agent takes about 5 µs per update: 200 000 are a second.
    let n: u64 = match (source, opts.quick) {
        (Source::Flood, false) => 1_000_000,
        (Source::Flood, true) => 50_000,
        (Source::PerMessage, false) => 200_000,
        (Source::PerMessage, true) => 20_000,
    };
    let rounds = if opts.quick { 1 } else { 5 };
    let dir = tempfile::tempdir().unwrap();
    let acpd = Setup {
        label: setup.label,
        config: &source.config(setup),
    }
    .argv(dir.path());
    let mut rust_relay = crate::stream::relay_argv()[..2].to_vec();
    rust_relay.extend(source.agent());
    let c_relay = c_relay(&source.agent())
        .inspect_err(|why| println!("\nC relay skipped: {why}; the baseline is the Rust relay"))
        .ok();
    let measure = |argv: &[String], n| measure_source(argv, n, None, source);
    let stream = match source {
        Source::Flood => "the echo agent's flood (many lines per write)",
        Source::PerMessage => "a Python agent writing each update with its own write(2)",
    };
    let baseline = if c_relay.is_some() {
        "C relay"
    } else {
        "Rust relay"
    };
    println!(
        "\n(0) hot path, {}, {stream}: CPU per forwarded session/update (utime+stime from /proc/PID/stat; schedstat in brackets), {n} updates of {CHUNK} B text, {rounds} interleaved rounds; ratio to the {baseline}",
        setup.label
    );
    println!(
        "{:>5} {:>22} {:>22} {:>22} {:>16} {:>7}",
        "round", "acpd µs/update", "C relay µs/update", "Rust relay µs/update", "ratio", "acpd s"
    );
    let (mut a, mut c, mut r, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut fa, mut fb, mut fine_ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut line_bytes = 0.0;
    let fmt = |s: Option<&Sample>| {
        s.map_or("–".into(), |s| {
            format!("{:.3} [{:.3}]", s.us_per_update, s.fine_us_per_update)
        })
    };
    for round in 1..=rounds {
        // The order turns every round, so no path always runs first or last.
        let (sa, sc, sr) = if round % 2 == 1 {
            let sa = measure(&acpd, n);
            let sc = c_relay.as_ref().map(|argv| measure(argv, n));
            (sa, sc, measure(&rust_relay, n))
        } else {
            let sr = measure(&rust_relay, n);
            let sc = c_relay.as_ref().map(|argv| measure(argv, n));
            (measure(&acpd, n), sc, sr)
        };
        let base = sc.as_ref().unwrap_or(&sr);
        // A short stream can leave the relay under one clock tick: no ratio then.
        let ratio = if base.us_per_update > 0.0 {
            sa.us_per_update / base.us_per_update
        } else {
            f64::NAN
        };
        let fine = sa.fine_us_per_update / base.fine_us_per_update;
        println!(
            "{:>5} {:>22} {:>22} {:>22} {:>6.2}x [{:>5.2}x] {:>7.2}",
            round,
            fmt(Some(&sa)),
            fmt(sc.as_ref()),
            fmt(Some(&sr)),
            ratio,
            fine,
            sa.secs,
        );
        line_bytes = sa.line_bytes;
        fa.push(sa.fine_us_per_update);
        fb.push(base.fine_us_per_update);
        a.push(sa.us_per_update);
        if let Some(sc) = &sc {
            c.push(sc.us_per_update);
        }
        r.push(sr.us_per_update);
        ratios.push(ratio);
        fine_ratios.push(fine);
    }
    let (ma, mb, mx) = (
        median(a.clone()),
        median(if c.is_empty() { r.clone() } else { c.clone() }),
        median(ratios.clone()),
    );
    let (fma, fmb, fmx) = (median(fa), median(fb), median(fine_ratios));
    println!(
        "median: acpd {ma:.3} µs [{fma:.3}], {baseline} {mb:.3} µs [{fmb:.3}], Rust relay {:.3} µs per update ({line_bytes:.0}-byte lines to the parent): acpd = {mx:.2}x [{fmx:.2}x] the {baseline} (target ≤ 2x)",
        median(r.clone())
    );
    json!({
        "setup": setup.label, "config": setup.config,
        "source": if source == Source::Flood { "flood" } else { "perMessage" },
        "updates": n, "rounds": rounds, "chunkBytes": CHUNK, "lineBytes": line_bytes,
        "baseline": baseline,
        "acpdUsPerUpdate": ma, "relayUsPerUpdate": mb, "ratio": mx,
        "rustRelayUsPerUpdate": median(r.clone()),
        "acpdSchedUsPerUpdate": fma, "relaySchedUsPerUpdate": fmb, "schedRatio": fmx,
        "acpdRounds": a, "cRelayRounds": c, "rustRelayRounds": r, "ratioRounds": ratios,
    })
}
