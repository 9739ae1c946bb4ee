//! A child streaming 200 MiB at a parent that reads slowly: acpd's memory stays bounded far
//! below the volume, because every queue on the path is bounded and a full one stops reading
//! from the pipe behind it. A check that memory is bounded, not a speed test.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const CHUNKS: usize = 51_200;
const CHUNK: usize = 4096; // 51 200 × 4 KiB = 200 MiB of text
/// What streaming may add to acpd's resident memory, over what it held with the session open
/// and idle: the queues' budgets and buffers, far below the 200 MiB that pass through.
const GROWTH_KIB: u64 = 16 * 1024;

/// `VmHWM` (peak) or `VmRSS` (now) of `pid`, in KiB.
fn status_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn slow_parent_keeps_acpd_memory_bounded() {
    let env = Env::new("");
    let mut acpd = Command::new(BIN)
        .args(["--config", env.config.to_str().unwrap(), "stdio"])
        .env_remove("ACPD_DEPTH")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = acpd.stdin.take().unwrap();
    let mut stdout = BufReader::with_capacity(64 * 1024, acpd.stdout.take().unwrap());
    let mut line = String::new();
    let mut send = |msg: serde_json::Value| {
        stdin.write_all(format!("{msg}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}),
    );
    stdout.read_line(&mut line).unwrap();
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
        "params": {"cwd": env.path(), "mcpServers": [], "_meta": {"acpd": {"provider": "fast"}}}}),
    );
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let sid = v["result"]["sessionId"].as_str().unwrap().to_string();
    // The binary's pages, the runtime, one idle session: what acpd holds before the stream.
    let before = status_kib(acpd.id(), "VmHWM:");
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": format!(":chunks {CHUNKS} {CHUNK}")}]}}),
    );

    // Read slowly: 64 KiB at a time with a pause, so the child out-produces the parent.
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    let mut tail = Vec::new();
    let mut reads = 0u64;
    loop {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "acpd closed stdout early after {total} bytes");
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
    let peak = status_kib(acpd.id(), "VmHWM:");
    assert!(total >= CHUNKS * CHUNK, "received {total} bytes");
    drop(stdin);
    assert!(acpd.wait().unwrap().success());
    eprintln!(
        "acpd peak RSS {peak} KiB ({before} KiB before the stream) after forwarding {} MiB",
        total >> 20
    );
    assert!(
        peak - before < GROWTH_KIB,
        "acpd grew from {before} to {peak} KiB while forwarding {total} bytes"
    );
}
