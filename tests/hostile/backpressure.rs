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

/// Fast graces, a long `write_timeout` (the deaf child's session outlives the flood) and a
/// long keep-alive.
fn deaf_env() -> Env {
    Env::raw(&format!(
        "write_timeout = \"120s\"\n[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
         keep_alive = \"600s\"\n"
    ))
}

/// An editor floods a bridge session whose agent stopped reading its stdin with 400
/// notifications and 32 requests of 1 MiB each. What waits for that agent is bounded in bytes
/// per session, not in messages (256 × 1 MiB sat in acpd before): acpd's peak memory grows by
/// far less than the flood, every request past the bound is answered at once with a typed
/// error naming the limit and the session, and another session on the same connection still
/// answers its prompt.
#[test]
fn deaf_bridge_child_flooded_with_large_messages_keeps_acpd_bounded() {
    use common::raw::Raw;
    use serde_json::json;
    const NOTIFICATIONS: usize = 400;
    const REQUESTS: u64 = 32;
    const FIRST_ID: u64 = 100_000;
    const SIZE: usize = 1024 * 1024;
    const GROWTH_KIB: u64 = 32 * 1024;
    let env = deaf_env();
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let acpd = raw.pid();
    let deaf = raw.new_session(env.path(), "fast");
    let other = raw.new_session(env.path(), "fast");
    let id = json!(raw.send_prompt(&deaf, ":deaf-stdin\nok"));
    let answer = raw.answer(&id).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let before = status_kib(acpd, "VmHWM:");
    let flooded = std::time::Instant::now();

    let mut writer = raw.take_writer();
    let blob = "x".repeat(SIZE);
    let flood_sid = deaf.clone();
    let flood = std::thread::spawn(move || {
        let mut line = |msg: serde_json::Value| {
            let mut bytes = msg.to_string().into_bytes();
            bytes.push(b'\n');
            writer.write_all(&bytes).unwrap();
        };
        for _ in 0..NOTIFICATIONS {
            line(json!({"jsonrpc": "2.0", "method": "_test/blob",
                "params": {"sessionId": flood_sid, "blob": blob}}));
        }
        for n in 0..REQUESTS {
            line(
                json!({"jsonrpc": "2.0", "id": FIRST_ID + n, "method": "_test/blob",
                "params": {"sessionId": flood_sid, "blob": blob}}),
            );
        }
        writer
    });
    let mut writer = flood.join().unwrap();
    let ask = json!({"jsonrpc": "2.0", "id": FIRST_ID + 1000, "method": "session/prompt",
        "params": {"sessionId": other, "prompt": [{"type": "text", "text": "ok"}]}});
    writer.write_all(format!("{ask}\n").as_bytes()).unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut refused, mut other_answer) = (Vec::new(), None);
    while other_answer.is_none() && std::time::Instant::now() < deadline {
        let Some(line) = raw.next_within(Duration::from_millis(500)) else {
            assert!(!raw.eof, "acpd hung up");
            continue;
        };
        let Some(n) = line.value["id"].as_u64().filter(|_| line.is_response()) else {
            continue;
        };
        if n == FIRST_ID + 1000 {
            other_answer = Some(line.value);
        } else if (FIRST_ID..FIRST_ID + REQUESTS).contains(&n) {
            refused.push(line.value);
        }
    }
    let peak = status_kib(acpd, "VmHWM:");
    eprintln!(
        "acpd peak {peak} KiB ({before} KiB before the flood); {} requests refused",
        refused.len()
    );
    assert!(
        peak - before < GROWTH_KIB,
        "acpd grew from {before} to {peak} KiB under a flood of {} MiB",
        NOTIFICATIONS as u64 + REQUESTS
    );
    let other_answer = other_answer.expect("the other session's prompt was not answered");
    assert_eq!(
        other_answer["result"]["stopReason"], "end_turn",
        "{other_answer}"
    );
    assert!(
        refused.len() as u64 >= REQUESTS - 8,
        "only {} of {REQUESTS} requests past the bound were answered",
        refused.len()
    );
    for e in &refused {
        assert_eq!(e["error"]["code"], -33013, "{e}");
        assert_eq!(e["error"]["data"]["limit"], "session_queue", "{e}");
        assert_eq!(e["error"]["data"]["sessionId"], deaf.as_str(), "{e}");
    }
    // Every refusal is counted; the drops are logged at most once per 10 s, not per message.
    let scrape = json!({"jsonrpc": "2.0", "id": FIRST_ID + 2000, "method": "_acpd/metrics"});
    writer.write_all(format!("{scrape}\n").as_bytes()).unwrap();
    let text = raw.answer(&json!(FIRST_ID + 2000)).value["result"]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let counted: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("acpd_limit_hits_total{limit=\"session_queue\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no session_queue count in\n{text}"));
    let least = refused.len() + NOTIFICATIONS - 8;
    assert!(
        counted >= least as u64,
        "{counted} refusals counted, {least} expected"
    );
    let warned = raw
        .log()
        .matches("dropped a notification of the editor's")
        .count();
    // Once per 10 s of flood at most, however long a loaded machine makes it last.
    let most = flooded.elapsed().as_secs() / 10 + 1;
    assert!(
        (1..=most as usize).contains(&warned),
        "the drops were logged {warned} times in {:?}",
        flooded.elapsed()
    );
    drop(writer);
}
