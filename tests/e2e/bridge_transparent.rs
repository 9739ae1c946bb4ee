#![allow(clippy::unwrap_used, clippy::expect_used)]
//! acpd as a transparent bridge, as an editor sees it through real `acpd stdio` processes
//! whose provider is `acpd agent echo`: the child's stderr on acpd's stderr (bounded), every
//! ACP method passing both ways (elicitation, `$/cancel_request` with ids remapped, updates
//! acpd has no part in, `_meta` trace context), the editor's `clientCapabilities` reaching the
//! child, and `--provider NAME` making one provider the connection's. Every wait is for a
//! message or a condition under a deadline.

use crate::common;

use std::io::Read as _;
use std::path::Path;
use std::process::Stdio;

use common::raw::*;
use common::*;
use serde_json::{Value, json};

/// A config of providers (name, echo flags), the first the default, plus `extra` top-level
/// keys.
fn env_of(extra: &str, providers: &[(&str, &[&str])]) -> Env {
    let mut toml = format!("{extra}\ndefault_provider = \"{}\"\n", providers[0].0);
    for (name, flags) in providers {
        let mut argv = vec![BIN.to_string(), "agent".into(), "echo".into()];
        argv.extend(flags.iter().map(|f| f.to_string()));
        let argv: Vec<String> = argv
            .iter()
            .map(|a| serde_json::to_string(a).unwrap())
            .collect();
        toml.push_str(&format!(
            "\n[providers.{name}]\ncommand = [{}]\ncancel_grace = \"300ms\"\n\
             eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            argv.join(", ")
        ));
    }
    Env::raw(&toml)
}

fn connect(env: &Env, caps: Value) -> Raw {
    let mut raw = Raw::stdio(env);
    let init = raw.initialize(caps);
    assert!(init.is_object(), "initialize failed; log: {}", raw.log());
    raw
}

/// `session/new` with no provider named: the connection's default.
fn new_default(raw: &mut Raw, cwd: &Path) -> String {
    let r = raw.ok("session/new", json!({"cwd": cwd, "mcpServers": []}));
    r["sessionId"].as_str().unwrap().to_string()
}

/// The answer to a prompt, and the chunk text streamed under `session` before it.
fn prompt(raw: &mut Raw, session: &str, text: &str) -> (Value, String) {
    let start = raw.seen.len();
    let id = raw.send_prompt(session, text);
    let answer = raw.answer(&json!(id)).value;
    let streamed = raw.seen[start..]
        .iter()
        .filter(|l| l.method() == "session/update" && l.value["params"]["sessionId"] == session)
        .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
        .collect();
    (answer, streamed)
}

/// Reads until acpd sends a request with `method`; returns it (other lines kept in `seen`).
fn until_request(raw: &mut Raw, method: &str) -> Line {
    loop {
        let line = raw.next();
        if line.is_request() && line.method() == method {
            return line;
        }
        raw.seen.push(line);
    }
}

fn until_notification(raw: &mut Raw, method: &str) -> Line {
    loop {
        let line = raw.next();
        if line.is_notification() && line.method() == method {
            return line;
        }
        raw.seen.push(line);
    }
}

fn reply(raw: &mut Raw, id: &Value, outcome: Value) {
    let mut msg = json!({"jsonrpc": "2.0", "id": id});
    for (k, v) in outcome.as_object().unwrap() {
        msg[k] = v.clone();
    }
    raw.line(&msg.to_string());
}

fn close(mut raw: Raw) {
    raw.close_write();
    assert!(raw.drain_to_eof(ANSWER), "acpd stdio did not exit");
    if let Some(mut p) = raw.process.take() {
        p.wait().unwrap();
    }
}

// ---- the child's stderr ----

#[test]
fn child_stderr_reaches_acpd_stdio_stderr_line_by_line() {
    let env = env_of("", &[("main", &["--stderr", "agent starting up"])]);
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let (answer, _) = prompt(
        &mut raw,
        &s,
        ":stderr warn: quota low\n:stderr-flood 1 9000\nok",
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // The child's stderr is pumped apart from its stdout: the answer may come first.
    assert!(
        eventually(ANSWER, || raw.log().contains(" more bytes cut]")),
        "acpd's stderr: {}",
        raw.log()
    );
    let log = raw.log();
    assert!(log.contains("agent starting up\n"), "{log}");
    // Verbatim, one line each; an overlong line keeps its head and says what was cut.
    assert!(log.lines().any(|l| l == "warn: quota low"), "{log}");
    let long = log.lines().find(|l| l.starts_with("eee")).unwrap();
    assert!(
        long.ends_with(" more bytes cut]"),
        "{}",
        &long[long.len() - 40..]
    );
    assert!(long.len() < 4096, "{}", long.len());
    close(raw);
}

#[test]
fn child_stderr_log_keeps_it_off_acpd_stderr() {
    let env = env_of(
        "child_stderr = \"log\"",
        &[("main", &["--stderr", "agent starting up"])],
    );
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let (answer, _) = prompt(&mut raw, &s, ":stderr secret line\nok");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let log_path = env.path().join("acpd.log");
    close(raw);
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(
        !log.contains("secret line") && !log.contains("agent starting up"),
        "{log}"
    );
}

#[test]
fn a_child_flooding_stderr_nobody_reads_neither_stalls_nor_bloats_acpd() {
    let env = env_of("", &[("main", &[])]);
    // acpd's stderr is a pipe this test does not read until the end: it fills at once.
    let (mut err_read, err_write) = std::io::pipe().unwrap();
    let mut raw = Raw::stdio_with(&env, &[], Stdio::from(err_write));
    raw.initialize(json!({}));
    let s = new_default(&mut raw, env.path());
    // 64 MiB of stderr: the child finishes only if acpd keeps draining it.
    let (answer, text) = prompt(&mut raw, &s, ":stderr-flood 32768 2048\nflooded\n");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(text, "flooded\n");
    let (answer, text) = prompt(&mut raw, &s, "still here\n");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(text, "still here\n");
    let peak = peak_kib(raw.pid());
    assert!(peak < 128 * 1024, "acpd grew to {peak} KiB");
    let shown = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let sink = shown.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = err_read.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let text = || String::from_utf8_lossy(&shown.lock().unwrap()).into_owned();
    // Now that acpd's stderr is read, a line written after the flood is shown (once the
    // backlog is out), preceded by the count of what was dropped.
    let mut n = 0;
    let shown_after = eventually(ANSWER, || {
        n += 1;
        let (answer, _) = prompt(&mut raw, &s, &format!(":stderr after the flood {n}\nok"));
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        text().contains("after the flood")
    });
    let err = text();
    assert!(shown_after, "{}", &err[err.len().saturating_sub(500)..]);
    assert!(
        err.contains("line(s) of child stderr dropped"),
        "no drop count"
    );
    assert!(err.len() < 8 * 1024 * 1024, "{} bytes forwarded", err.len());
    close(raw);
}

// ---- the built-in echo agent ----

#[test]
fn an_unknown_method_through_acpd_is_the_agents_method_not_found() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let answer = raw.call("_vendor/unknown", json!({"sessionId": s}));
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    // A method of ACP that acpd gives no special part reaches the agent (which answers it).
    let answer = raw.call("session/frobnicate", json!({"sessionId": s}));
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session/frobnicate"),
        "{answer}"
    );
    close(raw);
}

/// A request naming no session is the agent's to answer too (a new child of the provider
/// answers it, as `authenticate`): the editor gets what the agent says, not acpd's -32601.
#[test]
fn a_request_naming_no_session_is_answered_by_the_agent() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({}));
    let answer = raw.call("_echo/ping", json!({"n": 1}));
    assert_eq!(
        answer["result"],
        json!({"echo": "_echo/ping", "params": {"n": 1}}),
        "{answer}"
    );
    let answer = raw.call("_vendor/unknown", json!({}));
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    // acpd's own methods stay acpd's.
    let answer = raw.call("_acpd/status", json!({}));
    assert!(answer.get("result").is_some(), "{answer}");
    close(raw);
}

// ---- elicitation ----

const FORM: &str = r#"{"mode":"form","message":"Your name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}}}}"#;

#[test]
fn elicitation_from_the_child_reaches_an_editor_that_advertised_it() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({"elicitation": {"form": {}}}));
    let s = new_default(&mut raw, env.path());
    let id = raw.send_prompt(
        &s,
        &format!(
            ":request elicitation/create {FORM}\n\
             :notify-json elicitation/complete {{\"elicitationId\":\"el-1\"}}\ndone"
        ),
    );
    let asked = until_request(&mut raw, "elicitation/create");
    let params = &asked.value["params"];
    assert_eq!(params["sessionId"], s, "{}", asked.text());
    assert_eq!(params["mode"], "form");
    assert_eq!(params["message"], "Your name?");
    assert_eq!(
        params["requestedSchema"]["properties"]["name"]["type"],
        "string"
    );
    reply(
        &mut raw,
        &asked.value["id"],
        json!({"result": {"action": "accept", "content": {"name": "Ada"}}}),
    );
    let complete = until_notification(&mut raw, "elicitation/complete");
    assert_eq!(complete.value["params"], json!({"elicitationId": "el-1"}));
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let text = raw.chunk_text(&s);
    assert!(
        text.contains(r#"reply {"action":"accept","content":{"name":"Ada"}}"#),
        "{text}"
    );
    close(raw);
}

#[test]
fn elicitation_is_refused_for_an_editor_that_did_not_advertise_it() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let (answer, text) = prompt(
        &mut raw,
        &s,
        &format!(
            ":request elicitation/create {FORM}\n\
             :notify-json elicitation/complete {{\"elicitationId\":\"el-1\"}}\ndone"
        ),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(text, "error -32601\ndone");
    assert!(
        raw.seen
            .iter()
            .all(|l| !l.method().starts_with("elicitation/")),
        "{:?}",
        raw.seen_text()
    );
    close(raw);
}

// ---- $/cancel_request ----

#[test]
fn an_editors_cancel_request_reaches_the_child_under_the_childs_request_id() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let other = new_default(&mut raw, env.path());
    let id = raw.send_prompt(&s, "working\n:hang");
    raw.until_chunk(&s, "working");
    // The editor's ids are not acpd's ids on the child's wire: a pass-through would miss.
    raw.line(
        &json!({"jsonrpc": "2.0", "method": "$/cancel_request",
            "params": {"requestId": id, "_meta": {"traceparent": "00-abc-def-01"}}})
        .to_string(),
    );
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["error"]["code"], -32800, "{answer}");
    // Only that request: the session and the other one go on.
    let (answer, text) = prompt(&mut raw, &s, "again\n");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(text, "again\n");
    let (answer, _) = prompt(&mut raw, &other, "fine");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // A cancel for an id acpd never forwarded goes nowhere and breaks nothing.
    raw.line(r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"nope"}}"#);
    let (answer, _) = prompt(&mut raw, &s, "still");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    close(raw);
}

#[test]
fn a_childs_cancel_request_reaches_the_editor_under_the_editors_request_id() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({"elicitation": {"form": {}}}));
    let s = new_default(&mut raw, env.path());
    let id = raw.send_prompt(&s, &format!(":cancel-request elicitation/create {FORM}"));
    let asked = until_request(&mut raw, "elicitation/create");
    let cancel = until_notification(&mut raw, "$/cancel_request");
    assert_eq!(
        cancel.value["params"]["requestId"],
        asked.value["id"],
        "{}",
        cancel.text()
    );
    reply(
        &mut raw,
        &asked.value["id"],
        json!({"error": {"code": -32800, "message": "Request cancelled"}}),
    );
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(raw.chunk_text(&s), "error -32800\n");
    close(raw);
}

// ---- capabilities, updates, _meta ----

#[test]
fn the_editors_client_capabilities_reach_the_child() {
    let env = env_of("", &[("main", &[])]);
    let caps = json!({
        "fs": {"readTextFile": true, "writeTextFile": false},
        "terminal": true,
        "elicitation": {"form": {}, "url": {}},
        "plan": {},
        "subagents": {},
        "auth": {"terminal": true},
        "_meta": {"vendor.example": {"feature": 1}},
    });
    let mut raw = connect(&env, caps.clone());
    let s = new_default(&mut raw, env.path());
    let (_, text) = prompt(&mut raw, &s, ":client-caps");
    let json = text.strip_prefix("client-caps ").unwrap().trim_end();
    let seen: Value = serde_json::from_str(json).unwrap();
    for pointer in [
        "/fs/readTextFile",
        "/terminal",
        "/elicitation/form",
        "/elicitation/url",
        "/plan",
        "/subagents",
        "/auth/terminal",
        "/_meta/vendor.example",
    ] {
        assert_eq!(
            seen.pointer(pointer),
            caps.pointer(pointer),
            "{pointer}: {seen}"
        );
    }
    close(raw);
}

#[test]
fn updates_acpd_has_no_part_in_and_trace_meta_pass_unchanged() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({"plan": {}}));
    let s = new_default(&mut raw, env.path());
    let kinds = [
        "plan_update",
        "plan_removed",
        "usage_update",
        "session_info_update",
        "config_option_update",
        "compaction_update",
        "notice",
    ];
    let script: String = kinds.iter().map(|k| format!(":update {k}\n")).collect();
    let start = raw.seen.len();
    let id = raw.send_prompt(&s, &script);
    raw.answer(&json!(id));
    let seen: Vec<&Value> = raw.seen[start..]
        .iter()
        .filter(|l| l.method() == "session/update")
        .map(|l| &l.value["params"])
        .collect();
    for kind in kinds {
        assert!(
            seen.iter().any(|p| p["sessionId"] == s
                && p["update"] == json!({"sessionUpdate": kind, "acpdProbe": true})),
            "{kind} did not arrive unchanged: {seen:?}"
        );
    }
    // Trace context both ways: the editor's on a request to the agent, the agent's on one
    // to the editor.
    let trace = json!({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=opaque", "baggage": "user=ada"});
    let answer = raw.ok("_echo/ping", json!({"sessionId": s, "_meta": trace}));
    assert_eq!(answer["params"]["_meta"], trace, "{answer}");
    let id = raw.send_prompt(&s, &format!(":request _vendor/q {{\"_meta\":{trace}}}"));
    let asked = until_request(&mut raw, "_vendor/q");
    assert_eq!(asked.value["params"]["_meta"], trace, "{}", asked.text());
    assert_eq!(asked.value["params"]["sessionId"], s);
    reply(&mut raw, &asked.value["id"], json!({"result": {}}));
    raw.answer(&json!(id));
    close(raw);
}

// ---- one editor entry per agent ----

/// Two providers that differ in what they advertise (`other`: image prompts) and in an env
/// variable a prompt can show (`WHO`); `main` is the config's default.
fn two_providers() -> Env {
    let argv = |flags: &[&str]| {
        let mut a = vec![BIN.to_string(), "agent".into(), "echo".into()];
        a.extend(flags.iter().map(|f| f.to_string()));
        serde_json::to_string(&a).unwrap()
    };
    Env::raw(&format!(
        "default_provider = \"main\"\n\
         [providers.main]\ncommand = {}\nenv = {{ WHO = \"main\" }}\n\
         [providers.other]\ncommand = {}\nenv = {{ WHO = \"other\" }}\n",
        argv(&[]),
        argv(&["--prompt-caps", "image"])
    ))
}

#[test]
fn stdio_provider_makes_that_provider_the_connections_default() {
    let env = two_providers();
    let mut raw = Raw::stdio_with(&env, &["--provider", "other"], log_file(&env));
    let init = raw.initialize(json!({}));
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"]["image"], true,
        "initialize must mirror `other`: {init}"
    );
    let s = new_default(&mut raw, env.path());
    let (_, text) = prompt(&mut raw, &s, ":env WHO");
    assert_eq!(text, "WHO=other\n");
    // Naming a provider still works.
    let m = raw.new_session(env.path(), "main");
    let (_, text) = prompt(&mut raw, &m, ":env WHO");
    assert_eq!(text, "WHO=main\n");
    close(raw);

    // Without the flag, the config's default.
    let mut raw = Raw::stdio(&env);
    let init = raw.initialize(json!({}));
    assert_ne!(
        init["agentCapabilities"]["promptCapabilities"]["image"], true,
        "{init}"
    );
    close(raw);
}

#[test]
fn an_unknown_provider_is_refused_at_once() {
    let env = two_providers();
    let out = env
        .acpd()
        .args(["stdio", "--provider", "nope"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"nope\"") && err.contains("main, other"),
        "{err}"
    );

    let serve = Serve::start(&env);
    let out = env
        .acpd()
        .arg("connect")
        .arg("--socket")
        .arg(&serve.socket)
        .args(["--provider", "nope"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"nope\"") && err.contains("main, other"),
        "{err}"
    );
}

#[test]
fn connect_provider_makes_that_provider_the_connections_default() {
    use std::io::{BufRead, BufReader, Write};
    let env = two_providers();
    let serve = Serve::start(&env);
    let mut connect = env
        .acpd()
        .arg("connect")
        .arg("--socket")
        .arg(&serve.socket)
        .args(["--provider", "other"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = connect.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let stdout = connect.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let mut chunks = String::new();
    let mut call = |id: u64, method: &str, params: Value| -> Value {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{msg}").unwrap();
        loop {
            let line = rx
                .recv_timeout(ANSWER)
                .expect("an answer through acpd connect");
            if line["id"] == id {
                return line;
            }
            if let Some(t) = line
                .pointer("/params/update/content/text")
                .and_then(|t| t.as_str())
            {
                chunks.push_str(t);
            }
        }
    };
    // The editor's first line is its own initialize: nothing of acpd's handshake shows.
    let init = call(
        1,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    assert_eq!(init["id"], 1, "{init}");
    assert_eq!(
        init["result"]["agentCapabilities"]["promptCapabilities"]["image"], true,
        "{init}"
    );
    let new = call(
        2,
        "session/new",
        json!({"cwd": env.path(), "mcpServers": []}),
    );
    let s = new["result"]["sessionId"].as_str().unwrap().to_string();
    let answer = call(
        3,
        "session/prompt",
        json!({"sessionId": s, "prompt": [{"type": "text", "text": ":env WHO"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(chunks, "WHO=other\n");
    drop(stdin);
    assert!(connect.wait().unwrap().success());
}

// ---- CPU scheduling ----

/// The scheduling policy of `pid` (field 41 of /proc/PID/stat): 0 other, 3 batch.
fn policy(pid: &str) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    fields[38].parse().unwrap()
}

#[test]
fn acpd_yields_to_busy_processes_and_its_agent_is_scheduled_as_if_run_directly() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let (answer, _) = prompt(&mut raw, &s, "ok");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let ours = policy("self");
    // From the default policy acpd moves to SCHED_BATCH; a policy someone chose stays.
    let expected = if ours == 0 { 3 } else { ours };
    let pid = raw.pid().to_string();
    let tasks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| t.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for task in &tasks {
        assert_eq!(
            policy(&format!("{pid}/task/{task}")),
            expected,
            "thread {task}"
        );
    }
    let children: Vec<String> = tasks
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/task/{t}/children")).ok())
        .flat_map(|c| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/cmdline"))
                .is_ok_and(|l| l.contains("agent\0echo"))
        })
        .collect();
    assert_eq!(
        children.len(),
        1,
        "the echo agent among {tasks:?}'s children"
    );
    assert_eq!(
        policy(&children[0]),
        ours,
        "the agent gets acpd's starting policy back"
    );
    close(raw);
}

// ---- order ----

/// Updates read in one burst are queued together; whatever else the agent sent in that burst
/// (a request, its answer) still reaches the editor after them, and the updates keep their
/// order.
#[test]
fn updates_gathered_from_one_read_keep_their_place_before_a_request_and_the_answer() {
    let env = env_of("", &[("main", &[])]);
    let mut raw = connect(&env, json!({}));
    let s = new_default(&mut raw, env.path());
    let start = raw.seen.len();
    let id = raw.send_prompt(
        &s,
        "a\nb\n:chunks 40 30\nc\n:permission\nd\n:chunks 40 30\ne",
    );
    let ask = until_request(&mut raw, "session/request_permission");
    let texts = |seen: &[Line]| -> Vec<String> {
        seen.iter()
            .filter(|l| l.method() == "session/update")
            .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
            .map(str::to_owned)
            .collect()
    };
    let before = texts(&raw.seen[start..]);
    assert_eq!(
        before.len(),
        43,
        "every update sent before the request came first: {before:?}"
    );
    assert_eq!(
        (&before[0][..], &before[1][..], &before[42][..]),
        ("a\n", "b\n", "c\n")
    );
    reply(
        &mut raw,
        &ask.value["id"],
        json!({"result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}),
    );
    let mid = raw.seen.len();
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let after = texts(&raw.seen[mid..]);
    assert_eq!(
        after.len(),
        43,
        "every update came before the answer: {after:?}"
    );
    assert!(after[0].starts_with("permission: selected"), "{after:?}");
    assert_eq!((&after[1][..], &after[42][..]), ("d\n", "e"));
    close(raw);
}
