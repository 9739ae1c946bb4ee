//! (1) Streaming and (5) its memory: a parent (SDK client) receives N `agent_message_chunk`
//! updates from `acpd agent echo` directly, through `acpd stdio`, through `acpd serve` +
//! `acpd connect`, and through the SDK's conductor when it is installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::parent::{self, peak_rss_kib, percentile};
use crate::{ACPD, Opts};

/// `acpd serve` on a private socket, for the `serve + connect` path.
pub struct Daemon {
    pub child: std::process::Child,
    pub socket: PathBuf,
    /// Its config, state and socket: `acpd --config` here reaches this daemon's store.
    pub dir: tempfile::TempDir,
}

impl Daemon {
    pub fn start(config: &str) -> Daemon {
        Daemon::try_start(config).expect("acpd serve starts")
    }

    /// Starts `acpd serve` with `config`; `None` if it exits before its socket answers (a
    /// config it rejects).
    pub fn try_start(config: &str) -> Option<Daemon> {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("acpd.sock");
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).unwrap();
        let mut child = Command::new(ACPD)
            .arg("--config")
            .arg(&config_path)
            .args(["serve", "--socket"])
            .arg(&socket)
            .env("STATE_DIRECTORY", dir.path().join("state"))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        for _ in 0..500 {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                // Pass the daemon's log through from now on.
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut stderr, &mut std::io::stderr());
                });
                return Some(Daemon { child, socket, dir });
            }
            if child.try_wait().ok().flatten().is_some() {
                let mut err = String::new();
                let _ = stderr.read_to_string(&mut err);
                eprintln!("acpd serve refused the config: {}", err.trim());
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("acpd serve did not open its socket");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// The conductor binary, if the bench's setup installed it (or it is on PATH).
fn conductor() -> Option<String> {
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/bench-tools/bin/agent-client-protocol-conductor");
    if local.exists() {
        return Some(local.to_string_lossy().into_owned());
    }
    let found = Command::new("agent-client-protocol-conductor")
        .arg("--help")
        .output()
        .is_ok();
    found.then(|| "agent-client-protocol-conductor".to_string())
}

pub fn relay_argv() -> Vec<String> {
    let me = std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    vec![
        me,
        "--relay".into(),
        ACPD.into(),
        "agent".into(),
        "echo".into(),
    ]
}

pub async fn run(opts: &Opts) -> Value {
    let n: u64 = if opts.quick { 5_000 } else { 100_000 };
    let rounds = if opts.quick { 1 } else { 3 };
    let paced: u64 = if opts.quick { 200 } else { 2_000 };
    let daemon = Daemon::start("");
    let socket = daemon.socket.to_string_lossy().into_owned();
    let mut paths: Vec<(&str, Vec<String>, Option<u32>)> = vec![
        (
            "direct",
            vec![ACPD.into(), "agent".into(), "echo".into()],
            None,
        ),
        // The floor: the same agent behind one more process that only copies bytes.
        ("raw pipe hop", relay_argv(), None),
        ("acpd stdio", vec![ACPD.into(), "stdio".into()], None),
        (
            "acpd serve+connect",
            vec![ACPD.into(), "connect".into(), "--socket".into(), socket],
            Some(daemon.child.id()),
        ),
    ];
    match conductor() {
        Some(c) => paths.push((
            "conductor 5.0.0",
            vec![c, "agent".into(), format!("{ACPD} agent echo")],
            None,
        )),
        None => eprintln!("conductor not installed (bench/setup-conductor installs it): skipped"),
    }
    println!(
        "\n(1) streaming {n} agent_message_chunk updates to an SDK client (best of {rounds}); latency: {paced} stamped chunks 1 ms apart"
    );
    println!(
        "{:<20} {:>6} {:>11} {:>8} {:>11} {:>11} {:>11} {:>11}",
        "path", "chunk", "time", "ratio", "p50 µs", "p99 µs", "+p50 µs", "+p99 µs"
    );
    let mut out = Vec::new();
    for size in [100usize, 4096] {
        let mut base: Option<(f64, f64, f64)> = None;
        for (label, argv, watch) in &paths {
            let s = parent::stream(argv, n, size, rounds, paced, *watch).await;
            let mut lat = s.latencies.clone();
            lat.sort_by(f64::total_cmp);
            let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
            let secs = s.elapsed.as_secs_f64();
            let (b_secs, b50, b99) = *base.get_or_insert((secs, p50, p99));
            let ratio = b_secs / secs;
            println!(
                "{:<20} {:>5}B {:>8.1} ms {:>7.2}x {:>11.1} {:>11.1} {:>11.1} {:>11.1}",
                label,
                size,
                secs * 1e3,
                ratio,
                p50,
                p99,
                p50 - b50,
                p99 - b99
            );
            out.push(json!({
                "path": label, "chunkBytes": size, "messages": n,
                "ms": secs * 1e3, "throughputRatio": ratio,
                "latencyP50Us": p50, "latencyP99Us": p99,
                "addedP50Us": p50 - b50, "addedP99Us": p99 - b99,
                "peakRssKiB": if *label == "direct" { None } else { s.peak_kib },
            }));
        }
    }
    drop(daemon);
    let slow = slow_parent(if opts.quick { 5_000 } else { 51_200 });
    println!(
        "(5) acpd stdio peak RSS with a parent reading slowly: {} KiB after {} MiB",
        slow.0,
        slow.1 >> 20
    );
    json!({
        "messages": n, "rounds": rounds, "pacedMessages": paced,
        "runs": out, "slowParent": { "peakRssKiB": slow.0, "bytes": slow.1 },
    })
}

/// acpd stdio's peak RSS while a raw parent reads 4 KiB chunks slowly.
fn slow_parent(chunks: usize) -> (u64, usize) {
    let mut acpd = Command::new(ACPD)
        .arg("stdio")
        .env("XDG_CONFIG_HOME", "/nonexistent-acpd-bench")
        .env(
            "STATE_DIRECTORY",
            std::env::temp_dir().join("acpd-bench-state"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = acpd.stdin.take().unwrap();
    let mut stdout = BufReader::with_capacity(64 * 1024, acpd.stdout.take().unwrap());
    let mut send = |v: Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    let mut line = String::new();
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}),
    );
    stdout.read_line(&mut line).unwrap();
    send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": std::env::temp_dir(), "mcpServers": []}}),
    );
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let sid = serde_json::from_str::<Value>(&line).unwrap()["result"]["sessionId"].clone();
    send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": format!(":chunks {chunks} 4096")}]}}),
    );
    let mut buf = vec![0u8; 64 * 1024];
    let (mut total, mut tail) = (0usize, Vec::new());
    let mut reads = 0u64;
    loop {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0);
        total += n;
        tail.extend_from_slice(&buf[..n]);
        if tail.len() > 4096 {
            tail.drain(..tail.len() - 4096);
        }
        if String::from_utf8_lossy(&tail).contains("\"id\":3,\"result\"") {
            break;
        }
        reads += 1;
        if reads.is_multiple_of(8) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let peak = peak_rss_kib(acpd.id()).unwrap_or_default();
    drop(stdin);
    let _ = acpd.wait();
    (peak, total)
}
