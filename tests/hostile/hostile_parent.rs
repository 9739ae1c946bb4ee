//! Issue 8, "Toward parents" and the parent half of "Bounded, with deadlines": a scripted
//! hostile parent writing raw bytes into the real `acpd stdio` (and into `acpd serve`'s socket
//! where the transport matters), reading acpd's output only when it chooses to. Each test
//! asserts what that parent would see, per /work/notes/contract.md.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::raw::*;
use common::*;
use serde_json::value::RawValue;
use serde_json::{Value, json};

fn env_with(top: &str) -> Env {
    Env::raw(&format!(
        "{top}\n[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ))
}

/// The graces of `env_with` summed, plus slack for a loaded 2-core machine.
const LADDER: Duration = Duration::from_millis(900 + 5000);

fn ready(env: &Env) -> Raw {
    let mut raw = Raw::stdio(env);
    raw.initialize(json!({}));
    raw
}

/// The `id` member of a line exactly as written.
fn raw_id(line: &Line) -> String {
    let members: HashMap<String, Box<RawValue>> = serde_json::from_slice(&line.raw)
        .unwrap_or_else(|e| panic!("not a JSON object ({e}): {}", line.text()));
    members
        .get("id")
        .map(|id| id.get().to_string())
        .unwrap_or_else(|| panic!("no id in {}", line.text()))
}

/// Asserts `error` is acpd's LIMIT error for `limit` at `value`.
fn assert_limit(answer: &Value, limit: &str, value: u64) {
    let e = &answer["error"];
    assert_eq!(
        (
            e["code"].as_i64(),
            e["data"]["code"].as_str(),
            e["data"]["limit"].as_str(),
            e["data"]["value"].as_u64()
        ),
        (Some(-33013), Some("LIMIT"), Some(limit), Some(value)),
        "{answer}"
    );
}

// ---- Envelopes and ids ----------------------------------------------------------------------

#[test]
fn non_object_envelopes_are_invalid_requests_with_a_null_id() {
    let env = env_with("");
    let mut raw = ready(&env);
    for bad in [
        r#"["2.0",73,"_acpd/providers",{}]"#,
        r#"[{"jsonrpc":"2.0","id":74,"method":"_acpd/providers","params":{}}]"#,
        "[]",
        "42",
        r#""hello""#,
        "null",
        "true",
    ] {
        raw.line(bad);
        let line = raw.next();
        assert_eq!(
            (raw_id(&line).as_str(), line.value["error"]["code"].as_i64()),
            ("null", Some(-32600)),
            "{bad} was answered {}",
            line.text()
        );
    }
    let answer = raw.call("_acpd/providers", json!({}));
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(raw.seen.is_empty(), "extra lines: {:?}", raw.seen_text());
}

const ODD_IDS: [&str; 10] = [
    "1.0",
    "1e2",
    "-0",
    "12345678901234567890",
    r#""\u0041""#,
    "1E+2",
    "0.10",
    "-1.5e-3",
    r#""a\/b""#,
    "1",
];

#[test]
fn ids_are_echoed_byte_for_byte() {
    let env = env_with("");
    let mut raw = ready(&env);
    for id in ODD_IDS {
        raw.line(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"_acpd/providers","params":{{}}}}"#
        ));
        let line = raw.next();
        assert_eq!(raw_id(&line), id, "answered {}", line.text());
    }
    // Through a bridge session too, where the request goes on to a child and back.
    let sid = raw.new_session(env.path(), "fast");
    for id in ODD_IDS {
        raw.line(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"hi"}}]}}}}"#
        ));
        let line = loop {
            let line = raw.next();
            if line.is_response() {
                break line;
            }
        };
        assert_eq!(raw_id(&line), id, "prompt answered {}", line.text());
        assert_eq!(
            line.value["result"]["stopReason"],
            "end_turn",
            "{}",
            line.text()
        );
    }
}

// ---- Nothing large is serialised before the writer has room ---------------------------------

#[test]
fn unread_waits_on_a_large_result_keep_acpd_bounded() {
    const WAITS: u64 = 100;
    const BOUND_KIB: u64 = 100 * 1024;
    let env = env_with("");
    let mut raw = ready(&env);
    let acpd = raw.pid();
    let run = raw.start_run("fast", ":chunks 1024 4096");
    let settled = raw.wait_run(&run);
    let size = output_text(&settled).len();
    assert_eq!(size, 4 << 20);
    let ids: Vec<u64> = (0..WAITS)
        .map(|_| raw.send("_acpd/subagent/wait", json!({"runId": run})))
        .collect();
    // Not reading: let acpd do what it will with the 100 waits, until its memory stops moving.
    let mut last = rss_kib(acpd);
    let mut still_since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && still_since.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss_kib(acpd);
        if now.abs_diff(last) > 1024 {
            still_since = Instant::now();
        }
        last = now;
    }
    let peak = peak_kib(acpd);
    eprintln!("acpd peak {peak} KiB with {WAITS} unread waits on a 4 MiB result");
    assert!(peak < BOUND_KIB, "acpd peaked at {peak} KiB");
    // Now read: every wait is answered, with the whole result or (beyond
    // max_pending_requests) at once with LIMIT.
    let (mut full, mut limited) = (0, 0);
    for id in ids {
        let answer = raw.answer(&json!(id)).value;
        if answer.get("error").is_some() {
            assert_limit(&answer, "max_pending_requests", 64);
            limited += 1;
        } else {
            assert_eq!(output_text(&answer["result"]).len(), size);
            full += 1;
        }
    }
    eprintln!("{full} full answers, {limited} LIMIT answers");
    assert!(full >= 1);
}

// ---- A parent that goes away or stops reading ---------------------------------------------

#[test]
fn parent_that_closes_stdin_while_not_reading_ends_stdio_and_its_child() {
    subreaper();
    let env = env_with("write_timeout = \"2s\"");
    let mut raw = ready(&env);
    let sid = raw.new_session(env.path(), "fast");
    raw.send_prompt(&sid, ":pid\n:chunks 1000000 1024");
    let child = pid_after(&raw.until_chunk(&sid, "pid "), "pid ");
    // From here on nothing is read: close stdin once acpd's write to us is blocked.
    raw.until_output_blocks();
    raw.close_write();
    let started = Instant::now();
    let bound = Duration::from_secs(2) + LADDER;
    let process = raw.process.as_mut().unwrap();
    let exited = eventually(bound, || process.try_wait().ok().flatten().is_some());
    assert!(
        exited,
        "acpd stdio still runs {:?} after its parent closed stdin",
        started.elapsed()
    );
    assert!(
        gone_within(child, LADDER),
        "child {child} outlived acpd stdio"
    );
}

/// Issue 18: with the default `write_timeout` (30 s) a parent that closed stdin without ever
/// reading kept `acpd stdio` alive for the whole write deadline. EOF on stdin ends acpd within
/// the final flush's 1 s (asserted under a generous deadline, not as a timing), and no child
/// process outlives it.
#[test]
fn eof_on_stdin_ends_stdio_within_the_final_flush_under_the_default_write_timeout() {
    subreaper();
    let env = env_with("");
    let mut raw = ready(&env);
    let sid = raw.new_session(env.path(), "fast");
    raw.send_prompt(&sid, ":pid\n:chunks 1000000 1024");
    let child = pid_after(&raw.until_chunk(&sid, "pid "), "pid ");
    raw.until_output_blocks();
    raw.close_write();
    let started = Instant::now();
    let process = raw.process.as_mut().unwrap();
    let exited = eventually(Duration::from_secs(10), || {
        process.try_wait().ok().flatten().is_some()
    });
    assert!(
        exited,
        "acpd stdio still runs {:?} after its parent closed stdin (never reading)",
        started.elapsed()
    );
    assert!(
        gone_within(child, LADDER),
        "child {child} outlived acpd stdio"
    );
}

#[test]
fn write_timeout_toward_a_parent_that_stops_reading_closes_it() {
    subreaper();
    let env = env_with("write_timeout = \"2s\"");
    let mut raw = ready(&env);
    let sid = raw.new_session(env.path(), "fast");
    raw.send_prompt(&sid, ":pid\n:chunks 1000000 1024");
    let child = pid_after(&raw.until_chunk(&sid, "pid "), "pid ");
    // Stop reading, keep stdin open: only the write deadline can end this.
    raw.until_output_blocks();
    assert!(
        gone_within(child, Duration::from_secs(2) + LADDER),
        "the child of a parent that stopped reading still runs"
    );
    assert!(
        raw.drain_to_eof(Duration::from_secs(20)),
        "acpd kept the connection of a parent past write_timeout"
    );
}

#[test]
fn write_timeout_toward_a_socket_client_that_stops_reading_closes_it() {
    subreaper();
    // Detach off: the session ends with its connection (detaching is bridge_sessions.rs').
    let env = env_with("write_timeout = \"2s\"\ndetach_timeout = \"0s\"");
    let serve = Serve::start(&env);
    let mut raw = serve.connect();
    raw.initialize(json!({}));
    let sid = raw.new_session(env.path(), "fast");
    raw.send_prompt(&sid, ":pid\n:chunks 1000000 1024");
    let child = pid_after(&raw.until_chunk(&sid, "pid "), "pid ");
    raw.until_output_blocks();
    assert!(
        gone_within(child, Duration::from_secs(2) + LADDER),
        "the child of a socket client that stopped reading still runs"
    );
    assert!(
        raw.drain_to_eof(Duration::from_secs(20)),
        "acpd kept the connection of a socket client past write_timeout"
    );
    // The daemon itself carries on.
    let mut other = serve.connect();
    other.initialize(json!({}));
}

#[test]
fn socket_client_that_half_closes_mid_turn_has_its_children_torn_down() {
    subreaper();
    let env = env_with("");
    let serve = Serve::start(&env);
    let mut raw = serve.connect();
    raw.initialize(json!({}));
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "fast", "cwd": env.path(),
               "prompt": [{"type": "text", "text": ":hang"}]}),
    );
    let run = run["runId"].as_str().unwrap().to_string();
    let out = env
        .acpd()
        .args(["runs", "--json", "--socket"])
        .arg(&serve.socket)
        .output()
        .unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == run.as_str())
        .and_then(|r| r["pid"].as_i64())
        .unwrap_or_else(|| panic!("no pid for {run} in {runs}")) as i32;
    assert!(exists(pid));
    // Half-close: acpd reads EOF, our read side stays open.
    raw.close_write();
    assert!(
        gone_within(pid, LADDER),
        "the run's child outlived its half-closed connection"
    );
    assert!(
        raw.drain_to_eof(LADDER),
        "acpd did not close a half-closed connection"
    );
}

#[test]
fn socket_client_that_half_closes_mid_bridge_turn_has_its_child_torn_down() {
    subreaper();
    let env = env_with("detach_timeout = \"0s\"");
    let serve = Serve::start(&env);
    for script in [":pid\n:hang", ":pid\n:chunks 1000000 1024"] {
        let mut raw = serve.connect();
        raw.initialize(json!({}));
        let sid = raw.new_session(env.path(), "fast");
        raw.send_prompt(&sid, script);
        let pid = pid_after(&raw.until_chunk(&sid, "pid "), "pid ");
        raw.close_write();
        // Still reading: only the half-close can end this turn.
        assert!(
            raw.drain_to_eof(LADDER),
            "{script:?}: acpd did not close a half-closed connection"
        );
        assert!(
            gone_within(pid, LADDER),
            "{script:?}: the bridge child outlived its half-closed connection"
        );
    }
}

/// The same half-close while acpd's write to the client is blocked (the client is not reading
/// a streaming turn): the disconnect must tear the child down without waiting for that write.
#[test]
fn socket_client_that_half_closes_while_not_reading_has_its_child_torn_down() {
    subreaper();
    let env = env_with("detach_timeout = \"0s\"");
    let serve = Serve::start(&env);
    let mut raw = serve.connect();
    raw.initialize(json!({}));
    let sid = raw.new_session(env.path(), "fast");
    raw.send_prompt(&sid, ":pid\n:chunks 1000000 1024");
    let pid = pid_after(&raw.until_chunk(&sid, "pid "), "pid ");
    raw.until_output_blocks();
    raw.close_write();
    assert!(
        gone_within(pid, LADDER),
        "the bridge child outlived its half-closed, unread connection"
    );
    assert!(
        raw.drain_to_eof(Duration::from_secs(20)),
        "connection not closed"
    );
}

// ---- Disposed runs are forgotten ------------------------------------------------------------

#[test]
fn disposed_runs_are_forgotten_and_their_memory_returned() {
    const RUNS: usize = 40;
    let env = env_with("");
    let mut raw = ready(&env);
    let acpd = raw.pid();
    let one = |raw: &mut Raw| {
        let run = raw.start_run("fast", ":chunks 1024 4096");
        assert_eq!(output_text(&raw.wait_run(&run)).len(), 4 << 20);
        raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
        run
    };
    one(&mut raw);
    let baseline = rss_kib(acpd);
    let runs: Vec<String> = (0..RUNS).map(|_| one(&mut raw)).collect();
    let mut now = rss_kib(acpd);
    let back = eventually(Duration::from_secs(10), || {
        now = rss_kib(acpd);
        now < baseline + 48 * 1024
    });
    eprintln!("acpd RSS {baseline} KiB before, {now} KiB after {RUNS} disposed 4 MiB runs");
    let list = raw.ok("_acpd/subagent/list", json!({}));
    let listed = list["runs"].as_array().map_or(0, Vec::len);
    assert!(
        back,
        "{RUNS} disposed runs still hold {} KiB",
        now - baseline
    );
    assert_eq!(listed, 0, "list still returns disposed runs: {list}");
    let late = raw.call("_acpd/subagent/wait", json!({"runId": runs[0]}));
    assert_eq!(
        late["error"]["data"]["code"], "RUN_ENDED",
        "a wait on a disposed run: {late}"
    );
}

// ---- Partial lines have a deadline ----------------------------------------------------------

#[test]
fn unfinished_huge_line_times_out_and_its_memory_is_released() {
    let env = env_with("line_timeout = \"2s\"");
    let mut raw = ready(&env);
    let acpd = raw.pid();
    let baseline = rss_kib(acpd);
    // 15 MiB, under the 16 MiB cap, and no newline: then silence.
    let partial = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"_acpd/providers","params":{{"pad":"{}"#,
        "x".repeat(15 << 20)
    );
    raw.write(partial.as_bytes()).unwrap();
    let sent = Instant::now();
    let line = raw
        .next_within(Duration::from_secs(2) + LADDER)
        .unwrap_or_else(|| panic!("no answer {:?} after the partial line", sent.elapsed()));
    assert_eq!(
        (
            raw_id(&line).as_str(),
            line.value["error"]["code"].as_i64(),
            line.value["error"]["data"]["limit"].as_str()
        ),
        ("null", Some(-32700), Some("line_timeout")),
        "{}",
        line.text()
    );
    let mut now = rss_kib(acpd);
    let released = eventually(Duration::from_secs(10), || {
        now = rss_kib(acpd);
        now < baseline + 6 * 1024
    });
    assert!(
        released,
        "acpd holds {} KiB after the partial line timed out",
        now - baseline
    );
    // The rest of that line is skipped up to its newline; the next line is served.
    raw.write(b"xxxx\"}}\n").unwrap();
    let answer = raw.call("_acpd/providers", json!({}));
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(
        raw.seen.is_empty(),
        "the tail was answered: {:?}",
        raw.seen_text()
    );
}

// ---- Named limits ---------------------------------------------------------------------------

#[test]
fn max_line_drops_the_line_and_the_connection_continues() {
    let env = env_with("max_line = 1048576");
    let mut raw = ready(&env);
    raw.line(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"_acpd/providers","params":{{"pad":"{}"}}}}"#,
        "x".repeat(2 << 20)
    ));
    let line = raw.next();
    assert_eq!(
        (raw_id(&line).as_str(), line.value["error"]["code"].as_i64()),
        ("null", Some(-32700)),
        "{}",
        line.text()
    );
    assert_eq!(
        line.value["error"]["data"],
        json!({"limit": "max_line", "value": 1048576}),
        "{}",
        line.text()
    );
    let answer = raw.call("_acpd/providers", json!({}));
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(raw.seen.is_empty(), "extra lines: {:?}", raw.seen_text());
}

/// The default cap (16 MiB), with no limit key in the config.
#[test]
fn default_max_line_is_16_mib() {
    let env = env_with("");
    let mut raw = ready(&env);
    raw.line(&format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"_acpd/providers","params":{{"pad":"{}"}}}}"#,
        "x".repeat(16 << 20)
    ));
    let line = raw.next();
    assert_eq!(
        (raw_id(&line).as_str(), line.value["error"]["code"].as_i64()),
        ("null", Some(-32700)),
        "{}",
        line.text()
    );
    assert_eq!(
        line.value["error"]["data"],
        json!({"limit": "max_line", "value": 16 << 20}),
        "{}",
        line.text()
    );
    let answer = raw.call("_acpd/providers", json!({}));
    assert!(answer.get("result").is_some(), "{answer}");
}

#[test]
fn max_sessions_per_connection_refuses_the_next_session_and_start() {
    let env = env_with("max_sessions_per_connection = 2");
    let mut raw = ready(&env);
    for _ in 0..2 {
        raw.new_session(env.path(), "fast");
    }
    let third = raw.call(
        "session/new",
        json!({"cwd": env.path(), "mcpServers": [], "_meta": {"acpd": {"provider": "fast"}}}),
    );
    assert_limit(&third, "max_sessions_per_connection", 2);

    let mut raw = ready(&env);
    for _ in 0..2 {
        raw.start_run("fast", ":hang");
    }
    let third = raw.call(
        "_acpd/subagent/start",
        json!({"provider": "fast", "prompt": [{"type": "text", "text": ":hang"}]}),
    );
    assert_limit(&third, "max_sessions_per_connection", 2);
}

/// The default (16), with no limit key in the config.
#[test]
fn default_max_sessions_per_connection_is_16() {
    let env = env_with("");
    let mut raw = ready(&env);
    for _ in 0..16 {
        raw.new_session(env.path(), "fast");
    }
    let next = raw.call(
        "session/new",
        json!({"cwd": env.path(), "mcpServers": [], "_meta": {"acpd": {"provider": "fast"}}}),
    );
    assert_limit(&next, "max_sessions_per_connection", 16);
}

#[test]
fn max_pending_requests_answers_the_excess_request_at_once() {
    let env = env_with("max_pending_requests = 4");
    let mut raw = ready(&env);
    let run = raw.start_run("fast", ":hang");
    let ids: Vec<u64> = (0..5)
        .map(|_| raw.send("_acpd/subagent/wait", json!({"runId": run})))
        .collect();
    let line = raw.next_response();
    assert_eq!(line.value["id"], json!(ids[4]), "{}", line.text());
    assert_limit(&line.value, "max_pending_requests", 4);
}

/// The default (64), with no limit key in the config.
#[test]
fn default_max_pending_requests_is_64() {
    let env = env_with("");
    let mut raw = ready(&env);
    let run = raw.start_run("fast", ":hang");
    let ids: Vec<u64> = (0..65)
        .map(|_| raw.send("_acpd/subagent/wait", json!({"runId": run})))
        .collect();
    let line = raw.next_response();
    assert_eq!(line.value["id"], json!(ids[64]), "{}", line.text());
    assert_limit(&line.value, "max_pending_requests", 64);
}

#[test]
fn max_connections_refuses_the_extra_connection_with_one_line() {
    let env = env_with("max_connections = 2");
    let serve = Serve::start(&env);
    let mut first = serve.connect();
    first.initialize(json!({}));
    let mut second = serve.connect();
    second.initialize(json!({}));
    let mut third = serve.connect();
    let line = third
        .next_within(Duration::from_secs(10))
        .expect("the connection over max_connections was told nothing");
    assert_eq!(raw_id(&line), "null", "{}", line.text());
    assert_limit(&line.value, "max_connections", 2);
    assert!(
        third.next_within(Duration::from_secs(5)).is_none() && third.eof,
        "the refused connection was not closed"
    );
    // A slot frees when a connection goes.
    drop(first);
    let admitted = eventually(Duration::from_secs(10), || {
        let mut again = serve.connect();
        again.send(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        again
            .next_within(Duration::from_secs(2))
            .is_some_and(|l| l.value.get("result").is_some())
    });
    assert!(admitted, "no connection admitted after one closed");
}

/// The default (64), with no limit key in the config.
#[test]
fn default_max_connections_is_64() {
    let env = env_with("");
    let serve = Serve::start(&env);
    let mut open: Vec<Raw> = (0..64)
        .map(|_| {
            let mut c = serve.connect();
            c.initialize(json!({}));
            c
        })
        .collect();
    let mut extra = serve.connect();
    let line = extra
        .next_within(Duration::from_secs(10))
        .expect("the connection over max_connections was told nothing");
    assert_eq!(raw_id(&line), "null", "{}", line.text());
    assert_limit(&line.value, "max_connections", 64);
    open.clear();
}

/// Issue 18: a request naming two sessions (the same key twice, however spelled) is −32600
/// with its id, never routed by either; a doubled `id` is −32600 with a null id.
#[test]
fn doubled_session_id_or_id_keys_from_a_parent_are_invalid_requests() {
    let env = env_with("");
    let mut raw = ready(&env);
    let a = raw.new_session(env.path(), "fast");
    let b = raw.new_session(env.path(), "fast");
    let prompt = r#""prompt":[{"type":"text","text":"x"}]"#;
    for (n, params) in [
        format!(r#"{{"sessionId":"{a}",{prompt},"sessionId":"{b}"}}"#),
        format!(r#"{{"sessionId":"{a}","session\u0049d":"{b}",{prompt}}}"#),
    ]
    .iter()
    .enumerate()
    {
        let id = 900 + n as u64;
        raw.line(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{params}}}"#
        ));
        let answer = raw.answer(&json!(id)).value;
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("sessionId"), "{answer}");
    }
    for line in [
        format!(
            r#"{{"jsonrpc":"2.0","id":910,"method":"session/prompt","id":911,"params":{{"sessionId":"{a}",{prompt}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":912,"i\u0064":913,"method":"session/prompt","params":{{"sessionId":"{a}",{prompt}}}}}"#
        ),
    ] {
        raw.line(&line);
        let answer = raw.next_response().value;
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert!(answer["id"].is_null(), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("id"), "{answer}");
    }
    // Nothing reached either session: both still take a prompt and answer only it.
    let id = json!(raw.send_prompt(&a, "after"));
    assert_eq!(raw.answer(&id).value["result"]["stopReason"], "end_turn");
    assert_eq!(raw.chunk_text(&b), "");
}
