//! Streaming: a parent receives N `agent_message_chunk` updates from `acpd agent echo`,
//! directly and through `acpd stdio` (a bridge session).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{ACPD, Opts};

/// A raw line client: no JSON parsing on the hot path, only a check for the prompt's answer.
struct Parent {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Parent {
    fn spawn(args: &[&str]) -> Parent {
        let mut child = Command::new(ACPD)
            .args(args)
            .env("XDG_CONFIG_HOME", "/nonexistent-acpd-bench")
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn acpd");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::with_capacity(256 * 1024, child.stdout.take().unwrap());
        Parent {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, v: Value) {
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self, id: u64) -> Value {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "EOF waiting for {id}"
            );
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id && v.get("method").is_none() {
                return v;
            }
        }
    }

    fn session(&mut self) -> String {
        self.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}));
        self.answer(1);
        let cwd = std::env::temp_dir();
        self.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": cwd, "mcpServers": []}}));
        self.answer(2)["result"]["sessionId"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Streams `n` chunks of `size` bytes; returns the elapsed time and the arrival gaps.
    fn stream(&mut self, sid: &str, n: usize, size: usize, id: u64) -> (Duration, usize) {
        let prompt = format!(":chunks {n} {size}");
        self.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]}}),
        );
        let started = Instant::now();
        let needle = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},");
        let mut line = Vec::with_capacity(size + 256);
        let mut chunks = 0;
        loop {
            line.clear();
            assert!(self.stdout.read_until(b'\n', &mut line).unwrap() > 0);
            if line.starts_with(needle.as_bytes()) {
                break;
            }
            chunks += 1;
        }
        (started.elapsed(), chunks)
    }

    fn close(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

fn measure(args: &[&str], n: usize, size: usize, rounds: usize) -> Duration {
    let mut parent = Parent::spawn(args);
    let sid = parent.session();
    // One warm-up round, then the best of `rounds`.
    parent.stream(&sid, n / 10 + 1, size, 10);
    let mut best = Duration::MAX;
    for r in 0..rounds {
        let (t, chunks) = parent.stream(&sid, n, size, 100 + r as u64);
        assert_eq!(chunks, n, "every chunk arrives");
        best = best.min(t);
    }
    parent.close();
    best
}

pub fn run(opts: &Opts) -> Value {
    let n = if opts.quick { 5_000 } else { 100_000 };
    let rounds = if opts.quick { 1 } else { 3 };
    let mut out = Vec::new();
    println!("streaming {n} agent_message_chunk updates (best of {rounds})");
    println!(
        "{:>8} {:>14} {:>14} {:>8} {:>12}",
        "chunk", "direct", "acpd stdio", "ratio", "added/msg"
    );
    for size in [100usize, 4096] {
        let direct = measure(&["agent", "echo"], n, size, rounds);
        let bridged = measure(&["stdio"], n, size, rounds);
        let ratio = direct.as_secs_f64() / bridged.as_secs_f64();
        let added_us = (bridged.as_secs_f64() - direct.as_secs_f64()) / n as f64 * 1e6;
        println!(
            "{:>7}B {:>11.1} ms {:>11.1} ms {:>7.2}x {:>9.2} µs",
            size,
            direct.as_secs_f64() * 1e3,
            bridged.as_secs_f64() * 1e3,
            ratio,
            added_us
        );
        out.push(json!({
            "chunkBytes": size, "messages": n,
            "directMs": direct.as_secs_f64() * 1e3, "stdioMs": bridged.as_secs_f64() * 1e3,
            "throughputRatio": ratio, "addedMicrosPerMessage": added_us,
        }));
    }
    Value::Array(out)
}
