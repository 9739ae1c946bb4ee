//! The parent in the streaming figures: an ACP Rust SDK client, as a user's editor or parent
//! agent would be, spawning whatever sits on the agent side (the echo agent itself, `acpd
//! stdio`, `acpd connect`, or the SDK's own conductor).

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol as acp;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, InitializeRequest, NewSessionRequest, PromptRequest, SessionNotification,
    SessionUpdate, TextContent,
};
use agent_client_protocol::{Agent, Client};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

pub struct Streamed {
    /// Best time from prompt to answer, over the rounds.
    pub elapsed: Duration,
    /// Per-message latency (µs) of the paced round, when asked for.
    pub latencies: Vec<f64>,
    /// Peak RSS (KiB) of the process whose pid `watch` names, if any.
    pub peak_kib: Option<u64>,
}

pub fn monotonic_ns() -> u128 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u128 * 1_000_000_000 + t.tv_nsec() as u128)
        .unwrap_or_default()
}

pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs `rounds` floods of `n` chunks of `size` bytes, then (if `paced` > 0) `paced` stamped
/// chunks 1 ms apart for latency. `watch` picks the pid whose peak RSS is reported: the spawned
/// process itself (`None` → it) or another one.
pub async fn stream(
    argv: &[String],
    n: u64,
    size: usize,
    rounds: usize,
    paced: u64,
    watch: Option<u32>,
) -> Streamed {
    let mut child = tokio::process::Command::new(&argv[0])
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
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
    let watch = watch.or(child.id()).unwrap_or_default();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let chunks = Arc::new(AtomicU64::new(0));
    let stamps: Arc<Mutex<Vec<f64>>> = Arc::default();
    let (chunks2, stamps2) = (chunks.clone(), stamps.clone());
    let transport = acp::ByteStreams::new(stdin.compat_write(), stdout.compat());
    let result = Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if let SessionUpdate::AgentMessageChunk(chunk) = n.update
                    && let ContentBlock::Text(t) = chunk.content
                {
                    chunks2.fetch_add(1, Ordering::Relaxed);
                    if let Some(stamp) = t.text.strip_prefix("t=").and_then(|r| r.split(';').next())
                        && let Ok(sent) = stamp.parse::<u128>()
                    {
                        let us = (monotonic_ns().saturating_sub(sent)) as f64 / 1000.0;
                        stamps2.lock().unwrap().push(us);
                    }
                }
                Ok(())
            },
            acp::on_receive_notification!(),
        )
        .connect_with(transport, async move |cx: acp::v1::ConnectionTo<Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(std::env::temp_dir()))
                .block_task()
                .await?
                .session_id;
            let prompt = |text: String| {
                PromptRequest::new(
                    session.clone(),
                    vec![ContentBlock::Text(TextContent::new(text))],
                )
            };
            // Warm-up, then the measured rounds.
            cx.send_request(prompt(format!(":chunks {} {size}", n / 10 + 1)))
                .block_task()
                .await?;
            let mut best = Duration::MAX;
            for _ in 0..rounds {
                chunks.store(0, Ordering::Relaxed);
                let started = Instant::now();
                cx.send_request(prompt(format!(":chunks {n} {size}")))
                    .block_task()
                    .await?;
                best = best.min(started.elapsed());
                assert_eq!(chunks.load(Ordering::Relaxed), n, "every chunk arrived");
            }
            if paced > 0 {
                stamps.lock().unwrap().clear();
                cx.send_request(prompt(format!(":timed {paced} {size} 1")))
                    .block_task()
                    .await?;
            }
            let latencies = std::mem::take(&mut *stamps.lock().unwrap());
            Ok((best, latencies))
        })
        .await;
    let peak_kib = peak_rss_kib(watch);
    // The transport is closed: let the process exit on its own (a kill would leave a record).
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    let (elapsed, latencies) = result.unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    Streamed {
        elapsed,
        latencies,
        peak_kib,
    }
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}
