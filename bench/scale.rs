//! (2) start latency, (3) scale, (4) teardown, and (5) memory under scale, measured through a
//! real `acpd stdio` driven over its pipes.

use std::process::Stdio;
use std::time::{Duration, Instant};

use acpd::wire::{self, Peer};
use serde_json::{Value, json};

use crate::parent::peak_rss_kib;
use crate::{ACPD, Opts};

struct Ctl {
    child: tokio::process::Child,
    peer: Peer,
    _dir: tempfile::TempDir,
}

impl Ctl {
    async fn spawn(config: &str) -> Ctl {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = tokio::process::Command::new(ACPD);
        cmd.arg("--config")
            .arg(&path)
            .arg("stdio")
            .current_dir(dir.path())
            .env("STATE_DIRECTORY", dir.path().join("state"));
        let (child, conn) = wired(&mut cmd);
        let mut incoming = conn.incoming;
        // Lifecycle notifications must be read, or the bounded queue would stall the replies.
        tokio::spawn(async move { while incoming.recv().await.is_some() {} });
        let ctl = Ctl {
            child,
            peer: conn.peer,
            _dir: dir,
        };
        ctl.call("initialize", json!({"protocolVersion": 1})).await;
        ctl
    }

    async fn call(&self, method: &str, params: Value) -> Value {
        let raw = self
            .peer
            .request(method, &params)
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        serde_json::from_str(raw.get()).unwrap()
    }

    async fn start(&self, provider: &str, text: &str) -> String {
        let r = self
            .call(
                "_acpd/subagent/start",
                json!({"provider": provider, "prompt": [{"type": "text", "text": text}]}),
            )
            .await;
        r["runId"].as_str().unwrap().to_string()
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_default()
    }

    /// Children of acpd still around, and how many of them are zombies.
    fn children(&self) -> (usize, usize) {
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
            if fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(me) {
                all += 1;
                if fields[0] == "Z" {
                    zombies += 1;
                }
            }
        }
        (all, zombies)
    }
}

/// Spawns `cmd` with piped stdio and speaks JSON-RPC to it with acpd's own engine.
fn wired(cmd: &mut tokio::process::Command) -> (tokio::process::Child, wire::Connection) {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (2) Start: `_acpd/subagent/start` to published vs the child's own spawn + initialize +
/// session/new done directly.
pub async fn start(opts: &Opts) -> Value {
    let reps = if opts.quick { 5 } else { 30 };
    let mut direct = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let (mut child, conn) = wired(tokio::process::Command::new(ACPD).args(["agent", "echo"]));
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
        direct.push(started.elapsed().as_secs_f64() * 1e3);
        conn.peer.close();
        let _ = child.wait().await;
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

/// (3) Scale and (5) memory under it: K live children idle after one turn.
pub async fn scale(opts: &Opts) -> Value {
    let sizes: &[usize] = if opts.quick {
        &[1, 16]
    } else {
        &[1, 16, 64, 256]
    };
    println!("\n(3) scale: K concurrent live children (idle after one turn)");
    println!(
        "{:>5} {:>12} {:>12} {:>14} {:>12} {:>12} {:>8}",
        "K", "start all", "dispose all", "RSS", "per run", "peak RSS", "zombies"
    );
    let mut out = Vec::new();
    for &k in sizes {
        let ctl = Ctl::spawn(&config(k.max(1))).await;
        let base = ctl.rss_kib();
        let started = Instant::now();
        let runs: Vec<String> =
            futures::future::join_all((0..k).map(|_| ctl.start("echo", "x"))).await;
        let start_all = started.elapsed();
        futures::future::join_all(
            runs.iter()
                .map(|r| ctl.call("_acpd/subagent/wait", json!({"runId": r}))),
        )
        .await;
        let rss = ctl.rss_kib();
        let per_run = (rss.saturating_sub(base)) as f64 / k as f64;
        let started = Instant::now();
        futures::future::join_all(
            runs.iter()
                .map(|r| ctl.call("_acpd/subagent/dispose", json!({"runId": r}))),
        )
        .await;
        let dispose_all = started.elapsed();
        let peak = peak_rss_kib(ctl.pid()).unwrap_or_default();
        let (left, zombies) = ctl.children();
        println!(
            "{:>5} {:>9.1} ms {:>9.1} ms {:>10} KiB {:>8.1} KiB {:>8} KiB {:>8}",
            k,
            start_all.as_secs_f64() * 1e3,
            dispose_all.as_secs_f64() * 1e3,
            rss,
            per_run,
            peak,
            zombies
        );
        assert_eq!(left, 0, "every child of acpd is gone after dispose");
        out.push(json!({
            "children": k, "startAllMs": start_all.as_secs_f64() * 1e3,
            "disposeAllMs": dispose_all.as_secs_f64() * 1e3, "rssKiB": rss, "baseRssKiB": base,
            "perRunKiB": per_run, "peakRssKiB": peak, "leftAfterDispose": left, "zombies": zombies,
        }));
    }
    Value::Array(out)
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
