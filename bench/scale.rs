//! (2) start latency, (3) scale, (4) teardown, and (5) memory under scale, measured through a
//! real `acpd stdio` driven over its pipes (start, teardown) or one `acpd serve` daemon over
//! its socket (scale).

use std::process::Stdio;
use std::time::{Duration, Instant};

use acpd::testing::{self as wire, Peer};
use serde_json::{Value, json};

use crate::parent::peak_rss_kib;
use crate::stream::Daemon;
use crate::{ACPD, Opts};

/// A numeric field of `/proc/PID/status` (`VmRSS:` in KiB, `Threads:` …).
pub fn status_field(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or_default()
}

/// What a `Ctl` drives: an `acpd stdio` it spawned, or an `acpd serve` daemon.
enum Proc {
    Stdio {
        _child: Box<tokio::process::Child>,
        _dir: tempfile::TempDir,
    },
    Serve(std::sync::Arc<Daemon>),
}

pub struct Ctl {
    proc: Proc,
    pid: u32,
    pub peer: Peer,
}

impl Ctl {
    async fn spawn(config: &str) -> Ctl {
        Ctl::spawn_env(config, &[]).await
    }

    /// `acpd stdio` with `config` and these variables set (a data directory of its own).
    pub async fn spawn_env(config: &str, env: &[(&str, &std::path::Path)]) -> Ctl {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = tokio::process::Command::new(ACPD);
        cmd.arg("--config")
            .arg(&path)
            .arg("stdio")
            .current_dir(dir.path())
            .env("STATE_DIRECTORY", dir.path().join("state"))
            .envs(env.iter().copied());
        let (child, conn) = wired(&mut cmd);
        let pid = child.id().unwrap();
        let ctl = Ctl::over(
            conn,
            Proc::Stdio {
                _child: Box::new(child),
                _dir: dir,
            },
            pid,
        );
        ctl.call("initialize", json!({"protocolVersion": 1})).await;
        ctl
    }

    /// One `acpd serve` with `config` plus, if it accepts them, the limits that let one
    /// connection hold `max` runs and requests (keys of the newer config).
    pub async fn serve(config: &str, max: usize) -> Ctl {
        let limits = format!(
            "max_connections = {max}\nmax_sessions_per_connection = {max}\nmax_pending_requests = {max}\n"
        );
        let daemon = Daemon::try_start(&format!("{limits}{config}"))
            .or_else(|| {
                eprintln!("(retrying without the connection limit keys)");
                Daemon::try_start(config)
            })
            .expect("acpd serve starts");
        Ctl::connect(std::sync::Arc::new(daemon)).await
    }

    /// Another initialized connection to the same daemon.
    pub async fn connect(daemon: std::sync::Arc<Daemon>) -> Ctl {
        let stream = tokio::net::UnixStream::connect(&daemon.socket)
            .await
            .unwrap();
        let (r, w) = stream.into_split();
        let conn = wire::connect(r, w, 1 << 24);
        let pid = daemon.child.id();
        let ctl = Ctl::over(conn, Proc::Serve(daemon), pid);
        ctl.call("initialize", json!({"protocolVersion": 1})).await;
        ctl
    }

    pub fn daemon(&self) -> Option<std::sync::Arc<Daemon>> {
        match &self.proc {
            Proc::Serve(d) => Some(d.clone()),
            Proc::Stdio { .. } => None,
        }
    }

    fn over(conn: wire::Connection, proc: Proc, pid: u32) -> Ctl {
        let mut incoming = conn.incoming;
        // Lifecycle notifications must be read, or the bounded queue would stall the replies.
        tokio::spawn(async move { while incoming.recv().await.is_some() {} });
        Ctl {
            proc,
            pid,
            peer: conn.peer,
        }
    }

    pub async fn call(&self, method: &str, params: Value) -> Value {
        let raw = self
            .peer
            .request(method, &params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        serde_json::from_str(raw.get()).unwrap()
    }

    pub async fn start(&self, provider: &str, text: &str) -> String {
        let r = self
            .call(
                "_acpd/subagent/start",
                json!({"provider": provider, "cwd": std::env::temp_dir(),
                    "prompt": [{"type": "text", "text": text}]}),
            )
            .await;
        r["runId"].as_str().unwrap().to_string()
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn rss_kib(&self) -> u64 {
        status_field(self.pid, "VmRSS:")
    }

    pub fn threads(&self) -> u64 {
        status_field(self.pid, "Threads:")
    }

    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(0, |d| d.count())
    }

    /// Children of acpd still around (its sentinel aside), and how many of them are zombies.
    pub fn children(&self) -> (usize, usize) {
        let me = self.pid() as i32;
        let (mut all, mut zombies) = (0, 0);
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(me)
                && !is_sentinel(&entry.path())
            {
                all += 1;
                if fields[0] == "Z" {
                    zombies += 1;
                }
            }
        }
        (all, zombies)
    }
}

/// acpd's sentinel (`acpd sentinel`, one per acpd, not a child agent).
pub(crate) fn is_sentinel(proc_dir: &std::path::Path) -> bool {
    std::fs::read(proc_dir.join("cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"sentinel".as_slice()))
}

/// Spawns `cmd` with piped stdio and speaks JSON-RPC to it with acpd's own engine.
pub(crate) fn wired(
    cmd: &mut tokio::process::Command,
) -> (tokio::process::Child, wire::Connection) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let conn = wire::connect(
        child.stdout.take().unwrap(),
        child.stdin.take().unwrap(),
        1 << 24,
    );
    (child, conn)
}

fn config(max: usize) -> String {
    format!(
        "max_children = {max}\n[providers.echo]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\nmax_concurrent = {max}\n\
         [providers.deaf]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\neof_grace = \"200ms\"\nterm_grace = \"200ms\"\n"
    )
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// An agent's own cold start, in ms: spawn `acpd ARGS`, initialize, session/new.
pub(crate) async fn cold_start(args: &[&str]) -> f64 {
    let started = Instant::now();
    let (mut child, conn) = wired(tokio::process::Command::new(ACPD).args(args));
    conn.peer
        .request("initialize", &json!({"protocolVersion": 1}))
        .await
        .unwrap();
    conn.peer
        .request(
            "session/new",
            &json!({"cwd": std::env::temp_dir(), "mcpServers": []}),
        )
        .await
        .unwrap();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    conn.peer.close();
    let _ = child.wait().await;
    ms
}

/// (2) Start: `_acpd/subagent/start` to published vs the child's own spawn + initialize +
/// session/new done directly.
pub async fn start(opts: &Opts) -> Value {
    let reps = if opts.quick { 5 } else { 30 };
    let mut direct = Vec::new();
    for _ in 0..reps {
        direct.push(cold_start(&["agent", "echo"]).await);
    }
    let ctl = Ctl::spawn(&config(16)).await;
    let mut via = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let run = ctl.start("echo", "").await;
        via.push(started.elapsed().as_secs_f64() * 1e3);
        ctl.call("_acpd/subagent/dispose", json!({"runId": run}))
            .await;
    }
    let (d, v) = (median(direct), median(via));
    println!(
        "\n(2) start (median of {reps}): direct spawn+initialize+session/new {d:.2} ms, through acpd {v:.2} ms, added {:.2} ms",
        v - d
    );
    json!({ "directMs": d, "acpdMs": v, "addedMs": v - d })
}

/// The config of the scale rows: room for `max` children, all of them runs of one connection.
fn scale_config(max: usize) -> String {
    format!(
        "max_children = {max}\nmax_sessions_per_connection = {max}\nmax_pending_requests = {max}\n\
         [providers.echo]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\nmax_concurrent = {max}\nkeep_alive = \"1h\"\n"
    )
}

fn serve_config(max: usize) -> String {
    format!(
        "max_children = {max}\n[providers.echo]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\nmax_concurrent = {max}\nkeep_alive = \"1h\"\n"
    )
}

/// CPU (utime + stime, ms) of `pid`'s thread named `name`.
fn thread_cpu_ms(pid: u32, name: &str) -> f64 {
    let tick_ms = 1e3 / crate::hotpath::ticks_per_sec();
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .sum::<f64>()
        * tick_ms
}

/// Waits (up to `secs`) until acpd has no child left; returns (children, zombies) then.
pub async fn settle_children(ctl: &Ctl, secs: u64) -> (usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let c = ctl.children();
        if c.0 == 0 || Instant::now() >= deadline {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where the scale rows' children live: one `acpd stdio` (the parent is its stdin/stdout), or
/// one `acpd serve` daemon over one socket connection.
#[derive(Clone, Copy)]
enum Host {
    Stdio,
    Serve,
}

impl Host {
    fn name(self) -> &'static str {
        match self {
            Host::Stdio => "stdio",
            Host::Serve => "serve",
        }
    }

    async fn start(self, max: usize) -> Ctl {
        match self {
            Host::Stdio => Ctl::spawn(&scale_config(max)).await,
            Host::Serve => Ctl::serve(&serve_config(max), max).await,
        }
    }
}

/// (3) Scale and (5) memory under it: K live children idle after one turn in one `acpd stdio`
/// and in one `acpd serve`, against the same process warm with none, and one cooperative
/// dispose in it as the baseline. acpd raises its own `RLIMIT_NOFILE` to the hard limit (about
/// four descriptors per child); the config raises `max_children`,
/// `max_sessions_per_connection`, `max_pending_requests` and the provider's `max_concurrent`
/// (defaults 256, 16, 64, 64) to K + 8.
pub async fn scale(opts: &Opts) -> Value {
    let sizes: &[usize] = match &opts.sizes {
        Some(sizes) => sizes,
        None if opts.quick => &[16],
        None => &[64, 256, 1024],
    };
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(0, |(_, hard)| hard);
    let needed = sizes.iter().max().copied().unwrap_or(0) as u64 * 5 + 64;
    if nofile < needed {
        println!(
            "\n(3) scale: RLIMIT_NOFILE hard limit {nofile} is below the {needed} descriptors the largest K needs; raise it (ulimit -Hn)"
        );
    }
    println!(
        "\n(3) scale: K live children (idle after one turn) in one acpd; baseline: the same acpd with 0, and one cooperative dispose"
    );
    println!(
        "{:>5} {:>5} {:>11} {:>11} {:>11} {:>11} {:>12} {:>12} {:>10} {:>9} {:>9} {:>6} {:>10}",
        "host",
        "K",
        "start all",
        "RSS 0",
        "RSS K",
        "per child",
        "dispose all",
        "per child",
        "one alone",
        "ratio",
        "thr/fds",
        "left",
        "reaper CPU"
    );
    let mut out = Vec::new();
    for host in [Host::Stdio, Host::Serve] {
        if opts.host.as_deref().is_some_and(|h| h != host.name()) {
            continue;
        }
        for &k in sizes {
            out.push(scale_row(host, k).await);
        }
    }
    Value::Array(out)
}

/// One row of (3): K children in a fresh acpd of `host`.
async fn scale_row(host: Host, k: usize) -> Value {
    let ctl = host.start(k + 8).await;
    // Warm acpd with a few cooperative runs: their dispose is the baseline, and the one-time
    // costs of the first run stay out of the per-child figure.
    let mut alone = Vec::new();
    for _ in 0..5 {
        let run = ctl.start("echo", "x").await;
        ctl.call("_acpd/subagent/wait", json!({"runId": run})).await;
        let started = Instant::now();
        ctl.call("_acpd/subagent/dispose", json!({"runId": run}))
            .await;
        alone.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let alone = median(alone);
    settle_children(&ctl, 5).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (base, base_threads, base_fds) = (ctl.rss_kib(), ctl.threads(), ctl.fds());
    let started = Instant::now();
    let runs: Vec<String> = futures::future::join_all((0..k).map(|_| ctl.start("echo", "x"))).await;
    let start_all = started.elapsed();
    futures::future::join_all(
        runs.iter()
            .map(|r| ctl.call("_acpd/subagent/wait", json!({"runId": r}))),
    )
    .await;
    // Idle: measured after a second with nothing going on.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss, threads, fds) = (ctl.rss_kib(), ctl.threads(), ctl.fds());
    let per_child = rss.saturating_sub(base) as f64 / k as f64;
    let reaper_before = thread_cpu_ms(ctl.pid(), "acpd-reaper");
    let started = Instant::now();
    futures::future::join_all(
        runs.iter()
            .map(|r| ctl.call("_acpd/subagent/dispose", json!({"runId": r}))),
    )
    .await;
    let dispose_all = started.elapsed().as_secs_f64() * 1e3;
    let reaper_ms = thread_cpu_ms(ctl.pid(), "acpd-reaper") - reaper_before;
    let per_dispose = dispose_all / k as f64;
    let peak = peak_rss_kib(ctl.pid()).unwrap_or_default();
    let (left, zombies) = settle_children(&ctl, 5).await;
    // What acpd gives back once idle again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = ctl.rss_kib();
    println!(
        "{:>5} {:>5} {:>8.0} ms {:>7} KiB {:>7} KiB {:>7.1} KiB {:>9.0} ms {:>9.2} ms {:>7.2} ms {:>8.2}x {:>4}/{:<4} {:>5} {:>7.0} ms",
        host.name(),
        k,
        start_all.as_secs_f64() * 1e3,
        base,
        rss,
        per_child,
        dispose_all,
        per_dispose,
        alone,
        per_dispose / alone,
        threads,
        fds,
        left,
        reaper_ms
    );
    assert_eq!(left, 0, "every child of acpd is gone after dispose");
    json!({
        "host": host.name(), "children": k, "startAllMs": start_all.as_secs_f64() * 1e3,
        "baseRssKiB": base, "rssKiB": rss, "perChildKiB": per_child,
        "rssAfterDisposeKiB": rss_after, "peakRssKiB": peak,
        "disposeAllMs": dispose_all, "disposePerChildMs": per_dispose,
        "disposeAloneMs": alone, "disposeRatio": per_dispose / alone,
        "threads": threads, "baseThreads": base_threads, "fds": fds, "baseFds": base_fds,
        "leftAfterDispose": left, "zombies": zombies, "reaperCpuMs": reaper_ms,
    })
}

/// (4) Teardown: dispose of a cooperative child, and of an EOF-deaf, SIGTERM-ignoring one
/// against its eof_grace + term_grace (200 ms + 200 ms).
pub async fn teardown(opts: &Opts) -> Value {
    let reps = if opts.quick { 3 } else { 10 };
    let ctl = Ctl::spawn(&config(16)).await;
    let mut coop = Vec::new();
    let mut deaf = Vec::new();
    for _ in 0..reps {
        for (provider, text, into) in [
            ("echo", "x", &mut coop),
            ("deaf", ":ignore-eof\n:ignore-term", &mut deaf),
        ] {
            let run = ctl.start(provider, text).await;
            ctl.call("_acpd/subagent/wait", json!({"runId": run})).await;
            let started = Instant::now();
            ctl.call("_acpd/subagent/dispose", json!({"runId": run}))
                .await;
            into.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let (c, d) = (median(coop), median(deaf));
    let graces = Duration::from_millis(400).as_secs_f64() * 1e3;
    println!(
        "\n(4) teardown (median of {reps}): cooperative {c:.2} ms; EOF-deaf + SIGTERM-ignoring {d:.2} ms = graces {graces:.0} ms + {:.2} ms",
        d - graces
    );
    json!({ "cooperativeMs": c, "deafMs": d, "gracesMs": graces, "deafOverGracesMs": d - graces })
}
