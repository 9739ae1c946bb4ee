//! (6) The network face against the Unix socket, measured in the same run on one `acpd serve`:
//!
//! - CPU per forwarded update: the echo agent streams `:chunks N 112` to a client reading as
//!   fast as it can through each door (Unix socket, WSS, HTTPS + SSE); the daemon's own utime +
//!   stime (`/proc/PID/stat`) over the stream, per update, as row (0) charges acpd (the client
//!   and the agent are not charged). Interleaved rounds, the median.
//! - First chunk: prompt sent → first `agent_message_chunk` read, median of several.
//! - RSS per idle connection: 1 000 connections initialized and left idle, (VmRSS with them −
//!   VmRSS before) / 1 000, over WSS and over the Unix socket.
//! - The peer: the same turns through `acpremote expose` (a plain WebSocket, no TLS) +
//!   `acpremote mirror` (a stdio agent again), PyPI acpremote 1.10 from target/acpremote/venv
//!   (installed from tests/interop/acpremote-requirements.txt when missing); both processes'
//!   CPU is charged. Skipped with the reason when python3 or its venv is missing.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::hotpath::{cpu_ticks, median, ticks_per_sec};
use crate::netclient::{Cert, Conn, Face};
use crate::stream::Daemon;
use crate::{ACPD, Opts};

const CHUNK: usize = 112;

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The soft descriptor limit raised to the hard one (1 000 connections are 1 000 descriptors
/// here and in the daemon, which inherits it).
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

fn start_face() -> (Daemon, Face) {
    let dir = tempfile::tempdir().unwrap();
    let cert = Cert::new(dir.path());
    let config = format!(
        "{}max_connections = 4096\nmax_network_connections = 4096\nmax_connections_per_token = 4096\nrequests_per_second = 100000\n",
        cert.config
    );
    let daemon = Daemon::start(&config);
    let acpd = |args: &[&str]| {
        let out = Command::new(ACPD)
            .arg("--config")
            .arg(daemon.dir.path().join("config.toml"))
            .args(args)
            .arg("--socket")
            .arg(&daemon.socket)
            .env("STATE_DIRECTORY", daemon.dir.path().join("state"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "acpd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let mut url = String::new();
    for _ in 0..200 {
        let status: Value = serde_json::from_str(&acpd(&["status", "--json"])).unwrap();
        url = status["listening"][0].as_str().unwrap_or("").to_owned();
        if !url.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!url.is_empty(), "acpd status lists no endpoint");
    let addr = url
        .trim_start_matches("https://")
        .trim_end_matches("/acp")
        .to_owned();
    let token = acpd(&["token", "create", "bench"]).trim().to_owned();
    (
        daemon,
        Face {
            cert,
            addr,
            token,
            _certs: dir,
        },
    )
}

/// Streams `n` chunks through `conn`, charging `pids` their CPU: µs per update, each pid's.
fn cpu_per_update(conn: &mut Conn, n: u64, pids: &[u32]) -> Vec<f64> {
    let ticks =
        |pids: &[u32]| -> Vec<u64> { pids.iter().map(|p| cpu_ticks(*p).unwrap()).collect() };
    let before = ticks(pids);
    conn.prompt(&format!(":chunks {n} {CHUNK}"));
    let (got, _) = conn.drain();
    assert_eq!(got, n, "chunks received");
    ticks(pids)
        .iter()
        .zip(before)
        .map(|(a, b)| (a - b) as f64 / ticks_per_sec() * 1e6 / n as f64)
        .collect()
}

/// Prompt sent → first chunk read, `rounds` times: the median in µs.
fn first_chunk_us(conn: &mut Conn, rounds: usize) -> f64 {
    let mut v = Vec::new();
    for _ in 0..rounds {
        let sent = Instant::now();
        conn.prompt(&format!(":chunks 1 {CHUNK}"));
        let (_, first) = conn.drain();
        v.push(first.unwrap().duration_since(sent).as_secs_f64() * 1e6);
    }
    median(v)
}

/// `acpremote expose` of the echo agent on a free port, and the argv of `acpremote mirror` to
/// it; or why not.
struct Peer {
    expose: std::process::Child,
    mirror: Vec<String>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.expose.kill();
        let _ = self.expose.wait();
    }
}

const PEER_TOKEN: &str = "bench-peer-token";

fn acpremote() -> Result<PathBuf, String> {
    let ok = Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("python3 does not run ({e})"))?;
    if !ok.success() {
        return Err("python3 has no venv or ensurepip module (Debian: python3-venv)".into());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = root.join("target/acpremote/venv");
    let pins = root.join("tests/interop/acpremote-requirements.txt");
    let wanted = std::fs::read(&pins).map_err(|e| format!("{}: {e}", pins.display()))?;
    let stamp = venv.join("installed-requirements.txt");
    let bin = venv.join("bin/acpremote");
    if bin.exists() && std::fs::read(&stamp).ok().as_ref() == Some(&wanted) {
        return Ok(bin);
    }
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "python3 -m venv",
    )?;
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&pins),
        "pip install -r tests/interop/acpremote-requirements.txt",
    )?;
    std::fs::write(&stamp, &wanted).map_err(|e| e.to_string())?;
    Ok(bin)
}

fn peer() -> Result<Peer, String> {
    let bin = acpremote()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let mut expose = Command::new(&bin)
        .args(["expose", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--token-env", "T", "--", ACPD, "agent", "echo"])
        .env("T", PEER_TOKEN)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("acpremote expose: {e}"))?;
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let mirror = vec![
                bin.to_string_lossy().into_owned(),
                "mirror".into(),
                format!("ws://127.0.0.1:{port}/acp/ws"),
                "--token-env".into(),
                "T".into(),
            ];
            return Ok(Peer { expose, mirror });
        }
        if let Ok(Some(st)) = expose.try_wait() {
            return Err(format!("acpremote expose exited: {st}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("acpremote expose did not listen within 10 s".into())
}

pub fn run(opts: &Opts) -> Value {
    raise_fd_limit();
    let n: u64 = if opts.quick { 20_000 } else { 200_000 };
    let rounds = if opts.quick { 1 } else { 5 };
    let pings = if opts.quick { 5 } else { 21 };
    let idle = if opts.quick { 100 } else { 1000 };
    let (daemon, face) = start_face();
    let pid = daemon.child.id();
    let peer = peer();
    if let Err(why) = &peer {
        println!("acpremote peer skipped: {why}");
    }
    let mut doors: Vec<(&str, Conn)> = vec![
        ("unix socket", Conn::unix(&daemon.socket)),
        ("wss", Conn::ws(&face)),
        ("https+sse", Conn::sse(&face)),
    ];
    let mut peer_pids = Vec::new();
    if let Ok(p) = &peer {
        let conn = Conn::stdio(&p.mirror, &[("T", PEER_TOKEN)]);
        peer_pids = vec![p.expose.id(), conn.pid().unwrap()];
        doors.push(("acpremote expose+mirror", conn));
    }
    let charged = |label: &str| {
        if label.starts_with("acpremote") {
            peer_pids.clone()
        } else {
            vec![pid]
        }
    };
    // Warm-up: buffers, pools, the allocator.
    for (label, conn) in doors.iter_mut() {
        cpu_per_update(conn, n / 20 + 1, &charged(label));
    }
    // Per door, per round, per charged process.
    let mut each: Vec<Vec<Vec<f64>>> = vec![Vec::new(); doors.len()];
    println!(
        "\n(6) the network face: CPU per forwarded update (acpd serve's utime+stime; acpremote: expose + mirror), {n} updates of {CHUNK} B, {rounds} interleaved rounds; first chunk: median of {pings}"
    );
    for round in 0..rounds {
        // The order turns every round, so no door always goes first.
        let k = doors.len();
        for j in 0..k {
            let i = (j + round) % k;
            let (label, conn) = &mut doors[i];
            each[i].push(cpu_per_update(conn, n, &charged(label)));
        }
    }
    let cpu: Vec<Vec<f64>> = each
        .iter()
        .map(|rounds| rounds.iter().map(|r| r.iter().sum()).collect())
        .collect();
    let first: Vec<f64> = doors
        .iter_mut()
        .map(|(_, c)| first_chunk_us(c, pings))
        .collect();
    println!(
        "{:<26} {:>12} {:>8} {:>14} {:>8}",
        "door", "CPU µs/upd", "ratio", "first chunk µs", "ratio"
    );
    let (base_cpu, base_first) = (median(cpu[0].clone()), first[0]);
    let mut rows = Vec::new();
    for (i, (label, _)) in doors.iter().enumerate() {
        let c = median(cpu[i].clone());
        println!(
            "{label:<26} {c:>12.3} {:>7.2}x {:>14.0} {:>7.2}x",
            c / base_cpu,
            first[i],
            first[i] / base_first
        );
        // acpremote: expose's share (the relay, as acpd is) and mirror's.
        let parts: Vec<f64> = (0..each[i][0].len())
            .map(|p| median(each[i].iter().map(|r| r[p]).collect()))
            .collect();
        if parts.len() > 1 {
            println!(
                "{:<26} expose {:.3} µs + mirror {:.3} µs; expose alone {:.2}x the Unix socket",
                "",
                parts[0],
                parts[1],
                parts[0] / base_cpu
            );
        }
        rows.push(json!({
            "door": label, "cpuUsPerUpdate": c, "cpuRatio": c / base_cpu, "cpuPartsUs": parts,
            "cpuRounds": cpu[i], "firstChunkUs": first[i], "firstChunkRatio": first[i] / base_first,
        }));
    }
    for row in &rows[1..3] {
        let r = row["cpuRatio"].as_f64().unwrap();
        if r > 1.5 {
            println!(
                "TARGET MISSED: {} costs {r:.2}x the Unix socket per update (target ≤ 1.5x)",
                row["door"]
            );
        }
    }
    let skipped = match &peer {
        Ok(_) => Value::Null,
        Err(why) => json!(why),
    };
    drop(doors);
    drop(peer);
    let rss = idle_rss(&daemon, &face, idle);
    json!({
        "updates": n, "rounds": rounds, "chunkBytes": CHUNK, "firstChunkRounds": pings,
        "peer": skipped,
        "doors": rows, "idle": rss,
    })
}

/// VmRSS per idle connection, `count` of them, over WSS and over the Unix socket.
fn idle_rss(daemon: &Daemon, face: &Face, count: usize) -> Value {
    let pid = daemon.child.id();
    // One of each first, so what every connection shares is counted before.
    let warm_ws = Conn::ws_initialized(face);
    let warm_unix = Conn::unix(&daemon.socket);
    std::thread::sleep(Duration::from_millis(300));
    let before = vm_rss_kib(pid);
    let started = Instant::now();
    // A refusal (a limit of the face) stops the opening; the row says how many were held.
    let ws: Vec<_> = (0..count)
        .map_while(|_| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Conn::ws_initialized(face)))
                .ok()
        })
        .collect();
    let opened = started.elapsed();
    if ws.len() < count {
        println!(
            "IDLE ROW SHORT: the face took {} of {count} WSS connections (its log says why)",
            ws.len()
        );
    }
    let count = ws.len().max(1);
    std::thread::sleep(Duration::from_millis(300));
    let with_ws = vm_rss_kib(pid);
    let ws_per = (with_ws.saturating_sub(before)) as f64 / count as f64;
    drop(ws);
    std::thread::sleep(Duration::from_millis(500));
    let before_unix = vm_rss_kib(pid);
    let unix: Vec<_> = (0..count)
        .map(|_| {
            let s = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
            let mut w = s.try_clone().unwrap();
            use std::io::{BufRead, Write};
            writeln!(
                w,
                "{}",
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
            )
            .unwrap();
            let mut r = std::io::BufReader::new(s);
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("\"result\""), "initialize: {line}");
            (w, r)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let with_unix = vm_rss_kib(pid);
    let unix_per = (with_unix.saturating_sub(before_unix)) as f64 / count as f64;
    drop(unix);
    drop((warm_ws, warm_unix));
    println!(
        "idle connections ({count}, initialized): WSS {ws_per:.1} KiB each (VmRSS {before} → {with_ws} KiB, opened in {:.1} s), Unix socket {unix_per:.1} KiB each ({before_unix} → {with_unix} KiB): {:.2}x; target ≤ 64 KiB per WSS connection{}",
        opened.as_secs_f64(),
        ws_per / unix_per.max(0.1),
        if ws_per > 64.0 { ": TARGET MISSED" } else { "" }
    );
    json!({
        "connections": count, "wssKiBEach": ws_per, "wssRssBeforeKiB": before, "wssRssWithKiB": with_ws,
        "unixKiBEach": unix_per, "unixRssBeforeKiB": before_unix, "unixRssWithKiB": with_unix,
        "ratio": ws_per / unix_per.max(0.1),
    })
}
