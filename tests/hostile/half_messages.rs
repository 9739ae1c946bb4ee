//! Issue 31, "100 connections each holding an unfinished 16 MiB message": parents that send a
//! line just under `max_line` without its newline, then fall silent, on `acpd serve`'s socket.
//! What they may make acpd hold is bounded in bytes (the process-wide budget for unfinished
//! messages) and in time (`line_timeout` from a line's first byte), and an honest client is
//! served meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::raw::*;
use common::*;
use serde_json::json;

/// One unfinished message: a request cut one byte short of the 16 MiB `max_line`, no newline.
const PARTIAL: usize = (16 << 20) - 1;
/// How long the held lines may live: the default, long enough for an honest client to be
/// served on a loaded machine first.
const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// The budget every unfinished message shares (`wire::half::BUDGET`), in KiB.
const BUDGET_KIB: u64 = 64 * 1024;
/// What each connection's unfinished message holds free of the budget (`wire::half::ALLOWANCE`).
const ALLOWANCE: u64 = 64 << 10;

fn partial(id: usize) -> Vec<u8> {
    let mut line =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"_acpd/providers","params":{{"pad":""#)
            .into_bytes();
    line.resize(PARTIAL, b'x');
    line
}

/// `held` connections each write an unfinished 16 MiB message and stay silent. acpd's peak
/// memory grows by well under what they sent, an honest client on a fresh connection is served
/// while they are held, and each held one is answered, at its line's deadline, with the
/// `line_timeout` error (its line was within the budget) or the LIMIT error naming the budget
/// (it waited for the budget that long), counted in /metrics.
fn hold_unfinished_messages(held: usize) {
    let env = Env::new(&format!("max_connections = {}", held + 8));
    let d = Daemon::start(&env);
    let acpd = d.pid().as_raw() as u32;
    let mut honest = Raw::socket(&d.socket);
    honest.initialize(json!({}));
    let before = peak_kib(acpd);

    let written = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::new();
    let started = Instant::now();
    for id in 0..held {
        let mut raw = Raw::socket(&d.socket);
        let mut writer = raw.take_writer();
        let written = written.clone();
        std::thread::spawn(move || {
            // In small writes, each counted once taken: a blocking socket's write takes all.
            for chunk in partial(id).chunks(4096) {
                if writer.write_all(chunk).is_err() {
                    return;
                }
                written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            // Silent from here, the connection open until the test drops its reading end.
            let _ = writer.flush();
            std::thread::park();
        });
        conns.push(raw);
    }
    // The budget and every connection's allowance have left the held parents: acpd holds
    // what it will hold (more, before the budget: then it reads all they send).
    let enough = (BUDGET_KIB << 10) + (held as u64) * ALLOWANCE;
    assert!(
        eventually(Duration::from_secs(60), || written.load(Ordering::Relaxed)
            >= enough),
        "the held parents wrote only {} bytes",
        written.load(Ordering::Relaxed)
    );
    // Served while they are held: a session and a prompt through the echo agent.
    let session = honest.new_session(env.path(), "fast");
    let prompt = honest.send_prompt(&session, "still served");
    let answer = honest.answer(&json!(prompt)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert!(
        honest.chunk_text(&session).contains("still served"),
        "{:?}",
        honest.seen_text()
    );
    for (i, raw) in conns.iter_mut().enumerate() {
        let early = raw.next_within(Duration::ZERO);
        assert!(
            early.is_none(),
            "held connection {i} was answered {:?} after it began, before the honest client \
             was served (a loaded machine?): {}",
            started.elapsed(),
            early.unwrap().text()
        );
    }

    let (mut stalled, mut refused) = (0, 0);
    for (i, raw) in conns.iter_mut().enumerate() {
        let wait = (LINE_TIMEOUT + Duration::from_secs(30)).saturating_sub(started.elapsed());
        let line = raw.next_within(wait).unwrap_or_else(|| {
            panic!(
                "held connection {i} got no answer in {:?}",
                started.elapsed()
            )
        });
        let error = &line.value["error"];
        match (error["code"].as_i64(), error["data"]["limit"].as_str()) {
            (Some(-32700), Some("line_timeout")) => stalled += 1,
            (Some(-33013), Some("unfinished_message_budget")) => {
                assert_eq!(
                    error["data"]["value"].as_u64(),
                    Some(BUDGET_KIB << 10),
                    "{error}"
                );
                refused += 1;
            }
            _ => panic!("held connection {i}: {}", line.text()),
        }
    }
    assert!(
        started.elapsed() >= LINE_TIMEOUT,
        "answered before the lines' deadline"
    );
    let peak = peak_kib(acpd);
    assert!(
        peak - before < BUDGET_KIB + 64 * 1024,
        "{held} unfinished messages made acpd's peak grow by {} MiB ({stalled} timed out, \
         {refused} refused for the budget)",
        (peak - before) / 1024
    );
    // Past the budget, the rest waited for it and were refused with its name.
    assert!(
        refused > 0 && stalled + refused == held,
        "{stalled} {refused}"
    );
    let metrics = d.cli(&["status", "--metrics"]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    let hits = format!("acpd_limit_hits_total{{limit=\"unfinished_message_budget\"}} {refused}\n");
    assert!(text.contains(&hits), "{hits} not in {text}");
    // The freed lines gave their memory back.
    let mut now = rss_kib(acpd);
    assert!(
        eventually(Duration::from_secs(10), || {
            now = rss_kib(acpd);
            now < before + 16 * 1024
        }),
        "acpd still holds {} MiB after every unfinished line was dropped",
        now.saturating_sub(before) / 1024
    );
}

#[test]
fn a_hundred_unfinished_16_mib_messages_hold_at_most_the_budget_for_line_timeout() {
    hold_unfinished_messages(100);
}

/// A large line answered, then a small unfinished one behind it, on each of 8 connections:
/// the small one must not keep the large one's memory resident until its deadline (it sat in
/// the same allocation: 8 × 8 MiB held by 8 × 32 KiB).
#[test]
fn an_unfinished_line_behind_a_large_one_does_not_keep_its_memory() {
    const LINE: usize = 8 << 20;
    let env = Env::new("");
    let d = Daemon::start(&env);
    let acpd = d.pid().as_raw() as u32;
    let mut probe = Raw::socket(&d.socket);
    probe.initialize(json!({}));
    let before = rss_kib(acpd);
    let mut conns = Vec::new();
    for id in 0..8 {
        let mut raw = Raw::socket(&d.socket);
        let mut bytes = partial(id);
        bytes.truncate(LINE);
        bytes.extend_from_slice(b"\"}}\n");
        bytes.extend_from_slice(&partial(id)[..32 << 10]);
        raw.write(&bytes).unwrap();
        // Answered (refused before initialize): the whole line was read and handled.
        raw.answer(&json!(id));
        conns.push(raw);
    }
    let mut now = rss_kib(acpd);
    assert!(
        eventually(Duration::from_secs(10), || {
            now = rss_kib(acpd);
            now < before + 16 * 1024
        }),
        "8 unfinished 32 KiB lines keep acpd {} MiB larger",
        now.saturating_sub(before) / 1024
    );
}

/// A line trickled a byte every 200 ms on `acpd serve`'s socket is still dropped `line_timeout`
/// after its first byte: what trickles after it does not keep it alive.
#[test]
fn a_trickled_line_is_dropped_line_timeout_after_its_first_byte() {
    let env = Env::new("line_timeout = \"2s\"");
    let d = Daemon::start(&env);
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let mut writer = raw.take_writer();
    writer.write_all(b"{").unwrap();
    let first = Instant::now();
    std::thread::spawn(move || {
        for _ in 0..100 {
            std::thread::sleep(Duration::from_millis(200));
            if writer.write_all(b"x").is_err() {
                return;
            }
        }
    });
    let line = raw
        .next_within(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no answer {:?} after the first byte", first.elapsed()));
    let took = first.elapsed();
    assert_eq!(
        line.value["error"]["data"]["limit"].as_str(),
        Some("line_timeout"),
        "{}",
        line.text()
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(8),
        "dropped {took:?} after its first byte"
    );
}
