//! Trace context and OTLP export with real parts: `acpd stdio` exporting to a collector this
//! test runs on 127.0.0.1 (an HTTP server decoding OTLP/protobuf), an editor sending
//! `_meta.traceparent`, and the echo agent showing the `_meta` it got (`:prompt-meta`,
//! `:session-meta`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{Value, json};

use crate::common::raw::Raw;
use crate::common::{Env, eventually, output_text};

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

/// The endpoint of a collector on 127.0.0.1 that accepts connections and holds them, never
/// reading or answering: every export waits out its timeout.
pub(super) fn stalled_collector() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let held: Vec<TcpStream> = listener.incoming().flatten().collect();
        drop(held);
    });
    endpoint
}

pub(super) fn traceparent(span: &str) -> String {
    format!("00-{TRACE}-{span}-01")
}

#[derive(Debug, Clone)]
struct SpanRec {
    /// The status message when the span ended failed.
    failed: Option<String>,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attrs: HashMap<String, String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP/HTTP collector: every export request decoded, its spans kept.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<SpanRec>>>,
}

impl Collector {
    fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(conn, &kept));
            }
        });
        Collector { endpoint, spans }
    }

    fn spans(&self) -> Vec<SpanRec> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until the collector holds a span satisfying `f` (acpd exports in batches).
    fn until(&self, what: &str, f: impl Fn(&SpanRec) -> bool) -> SpanRec {
        let mut found = None;
        let got = eventually(Duration::from_secs(20), || {
            found = self.spans().into_iter().find(|s| f(s));
            found.is_some()
        });
        assert!(got, "no {what} span; got {:#?}", self.spans());
        found.unwrap()
    }
}

/// One connection: HTTP/1.1 requests with a `content-length` body, each answered 200.
fn serve(conn: TcpStream, kept: &Mutex<Vec<SpanRec>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        let mut len = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /v1/traces "), "{line}");
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let req = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        let mut spans = kept.lock().unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let attrs = s
                        .attributes
                        .iter()
                        .map(|kv| {
                            let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                            let v = match v {
                                Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s.clone(),
                                other => format!("{other:?}"),
                            };
                            (kv.key.clone(), v)
                        })
                        .collect();
                    spans.push(SpanRec {
                        failed: s
                            .status
                            .as_ref()
                            .filter(|st| st.code == 2)
                            .map(|st| st.message.clone()),
                        name: s.name,
                        trace: hex(&s.trace_id),
                        id: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        attrs,
                    });
                }
            }
        }
        drop(spans);
        let _ = writer.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

/// `acpd stdio` with `otel` in its environment (and no OTEL_* of the test's own).
pub(super) fn stdio(env: &Env, otel: &[(&str, &str)]) -> Raw {
    let mut cmd: Command = env.acpd();
    cmd.arg("stdio");
    for (k, _) in std::env::vars() {
        if k.starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("OTEL_BSP_SCHEDULE_DELAY", "50");
    for (k, v) in otel {
        cmd.env(k, v);
    }
    let mut raw = Raw::process(cmd, &env.path().join("acpd.log"));
    raw.initialize(json!({}));
    raw
}

pub(super) fn new_session(raw: &mut Raw, env: &Env, meta: Value) -> String {
    let mut meta = meta;
    meta["acpd"] = json!({"provider": "fast"});
    let r = raw.ok(
        "session/new",
        json!({"cwd": env.path(), "mcpServers": [], "_meta": meta}),
    );
    r["sessionId"].as_str().unwrap().to_string()
}

/// A prompt with `meta`; the JSON the echo agent printed after `label` (`prompt-meta`, …).
fn prompt(raw: &mut Raw, s: &str, meta: Value) -> (Value, Value) {
    let before = raw.chunk_text(s).len();
    let id = raw.send(
        "session/prompt",
        json!({"sessionId": s, "_meta": meta,
               "prompt": [{"type": "text", "text": ":prompt-meta\n:session-meta\n"}]}),
    );
    raw.answer(&json!(id));
    let text = raw.chunk_text(s)[before..].to_string();
    (
        printed(&text, "prompt-meta"),
        printed(&text, "session-meta"),
    )
}

fn printed(text: &str, label: &str) -> Value {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{label} ")))
        .unwrap_or_else(|| panic!("no {label} in {text:?}"));
    serde_json::from_str(line).unwrap()
}

/// (trace id, span id, flags) of a `traceparent`.
fn parts(meta: &Value) -> (String, String, String) {
    let tp = meta["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("{meta}"));
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    (p[1].to_string(), p[2].to_string(), p[3].to_string())
}

#[test]
fn acpd_continues_the_editors_trace_and_exports_its_spans() {
    let collector = Collector::start();
    let env = Env::new("");
    let mut raw = stdio(
        &env,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint)],
    );

    // A bridge session: its span under the editor's session/new, the start under it, and
    // the agent's session/new naming the start.
    let opened = "1111111111111111";
    let s = new_session(&mut raw, &env, json!({"traceparent": traceparent(opened)}));
    let prompted = "2222222222222222";
    let sent = json!({"traceparent": traceparent(prompted), "tracestate": "vendor=opaque",
        "baggage": "user=ada"});
    let (pm, sm) = prompt(&mut raw, &s, sent.clone());
    let (trace, hop, flags) = parts(&pm);
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE, "01"));
    assert_ne!(hop, prompted, "acpd's hop has a span id of its own");
    assert_eq!(pm["tracestate"], "vendor=opaque");
    assert_eq!(pm["baggage"], "user=ada");
    let (strace, start, _) = parts(&sm);
    assert_eq!(strace, TRACE);

    // A malformed traceparent is ignored (W3C): acpd's hop starts a new trace, and the
    // tracestate that came with it is not passed on.
    let (bad, _) = prompt(
        &mut raw,
        &s,
        json!({"traceparent": "00-abc-def-01", "tracestate": "v=1"}),
    );
    let (new_trace, bad_hop, _) = parts(&bad);
    assert_ne!(new_trace, TRACE);
    assert_eq!(new_trace.len(), 32);
    assert!(bad.get("tracestate").is_none(), "{bad}");

    // A run continuing the caller's trace: the agent's session/new names the run's start,
    // its prompt the run.
    let called = "3333333333333333";
    let r = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "fast", "_meta": {"traceparent": traceparent(called)},
               "prompt": [{"type": "text", "text": ":prompt-meta\n:session-meta\n"}]}),
    );
    let run_id = r["runId"].as_str().unwrap().to_string();
    let result = raw.wait_run(&run_id);
    let text = output_text(&result);
    let (rtrace, run_span, _) = parts(&printed(&text, "prompt-meta"));
    let (_, run_start, _) = parts(&printed(&text, "session-meta"));
    assert_eq!(rtrace, TRACE);
    raw.ok("_acpd/subagent/dispose", json!({"runId": run_id}));
    // The editor goes: the session is torn down, and acpd sends what is queued as it exits.
    raw.close_write();

    let in_trace = |name: &'static str| move |x: &SpanRec| x.trace == TRACE && x.name == name;
    let hop_span = collector.until("session/prompt", |x| x.id == hop);
    assert_eq!(
        (hop_span.trace.as_str(), hop_span.parent.as_str()),
        (TRACE, prompted)
    );
    assert_eq!(hop_span.attrs["acpd.session.id"], s);
    let session = collector.until("acpd.session", in_trace("acpd.session"));
    assert_eq!(session.parent, opened);
    assert_eq!(session.attrs["acpd.session.id"], s);
    assert_eq!(session.attrs["acpd.provider"], "fast");
    let start_span = collector.until("the session's acpd.start", |x| x.id == start);
    assert_eq!(
        (start_span.name.as_str(), start_span.parent.as_str()),
        ("acpd.start", session.id.as_str())
    );
    let teardown = collector.until("the session's acpd.teardown", |x| {
        x.name == "acpd.teardown" && x.parent == session.id
    });
    assert!(["eof", "term", "kill"].contains(&teardown.attrs["acpd.teardown.step"].as_str()));
    let bad_span = collector.until("the malformed prompt's hop", |x| x.id == bad_hop);
    assert_eq!(
        (bad_span.trace.as_str(), bad_span.parent.as_str()),
        (new_trace.as_str(), "")
    );

    let run = collector.until("acpd.run", |x| x.id == run_span);
    assert_eq!(
        (run.name.as_str(), run.trace.as_str(), run.parent.as_str()),
        ("acpd.run", TRACE, called)
    );
    assert_eq!(run.attrs["acpd.run.id"], run_id);
    assert_eq!(run.attrs["acpd.provider"], "fast");
    assert_eq!(run.attrs["acpd.stop_reason"], "completed");
    assert_eq!(run.attrs["acpd.category"], "none");
    let rstart = collector.until("the run's acpd.start", |x| x.id == run_start);
    assert_eq!(
        (rstart.name.as_str(), rstart.parent.as_str()),
        ("acpd.start", run_span.as_str())
    );
    collector.until("the run's acpd.teardown", |x| {
        x.name == "acpd.teardown" && x.parent == run_span
    });
}

#[test]
fn an_unreachable_collector_never_holds_a_turn_and_is_named_once() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = Env::new("");
    let mut raw = stdio(&env, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)]);
    let s = new_session(&mut raw, &env, json!({}));
    for n in 0..3 {
        let (pm, _) = prompt(
            &mut raw,
            &s,
            json!({"traceparent": traceparent("4444444444444444")}),
        );
        assert_eq!(parts(&pm).0, TRACE, "turn {n}");
    }
    // acpd's OTEL_* are not the child's (its environment is an allowlist).
    let id = raw.send_prompt(
        &s,
        ":env OTEL_EXPORTER_OTLP_ENDPOINT OTEL_BSP_SCHEDULE_DELAY",
    );
    raw.answer(&json!(id));
    let text = raw.chunk_text(&s);
    assert!(
        text.contains("OTEL_EXPORTER_OTLP_ENDPOINT unset\n"),
        "{text}"
    );
    assert!(text.contains("OTEL_BSP_SCHEDULE_DELAY unset\n"), "{text}");
    raw.close_write();
    assert!(raw.drain_to_eof(Duration::from_secs(20)));
    let failed = format!("cannot export spans to {endpoint}/v1/traces: ");
    assert!(
        eventually(Duration::from_secs(10), || raw.log().contains(&failed)),
        "no export failure logged: {}",
        raw.log()
    );
    let log = raw.log();
    assert_eq!(log.matches(&failed).count(), 1, "{log}");
    assert!(log.contains("Connection refused"), "{log}");
}

#[test]
fn without_export_trace_context_passes_untouched() {
    let env = Env::new("");
    let mut raw = stdio(&env, &[]);
    let sent = json!({"traceparent": traceparent("5555555555555555"),
        "tracestate": "vendor=opaque"});
    let s = new_session(&mut raw, &env, sent.clone());
    let (pm, sm) = prompt(&mut raw, &s, sent.clone());
    assert_eq!(pm, sent);
    assert_eq!(sm["traceparent"], sent["traceparent"]);
    // A run's `_meta` is taken, and nothing is added to what its agent gets.
    let r = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "fast", "_meta": sent,
               "prompt": [{"type": "text", "text": ":prompt-meta\n"}]}),
    );
    let result = raw.wait_run(r["runId"].as_str().unwrap());
    assert_eq!(printed(&output_text(&result), "prompt-meta"), Value::Null);
}

#[test]
fn a_collector_that_takes_connections_and_never_answers_holds_no_turn() {
    let endpoint = stalled_collector();
    let env = Env::new("");
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "500"),
    ];
    let mut raw = stdio(&env, &otel);
    let s = new_session(&mut raw, &env, json!({}));
    for n in 0..20 {
        let (pm, _) = prompt(
            &mut raw,
            &s,
            json!({"traceparent": traceparent("6666666666666666")}),
        );
        assert_eq!(parts(&pm).0, TRACE, "turn {n}");
    }
    raw.close_write();
    assert!(
        raw.drain_to_eof(Duration::from_secs(20)),
        "acpd did not exit"
    );
    let log = raw.log();
    assert_eq!(log.matches("cannot export spans to").count(), 1, "{log}");
}

/// A config whose `fast` echo keeps its sessions in `<env>/echo-sessions`, so a fresh child
/// can load or resume them (`--sessions`).
fn env_with_sessions() -> Env {
    let env = Env::raw("");
    let dir = env.path().join("echo-sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "default_provider = \"fast\"\n[providers.fast]\n\
         command = [\"{}\", \"agent\", \"echo\", \"--sessions\", \"{}\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        crate::common::BIN,
        dir.display()
    );
    std::fs::write(&env.config, toml).unwrap();
    env
}

/// `acpd stdio` exporting to `collector`, with one session of an echo that keeps its sessions
/// (see [`env_with_sessions`]), prompted once so there is something to load.
fn remembered_session(collector: &Collector) -> (Env, Raw, String) {
    let env = env_with_sessions();
    let mut raw = stdio(
        &env,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint)],
    );
    let s = new_session(&mut raw, &env, json!({}));
    let id = raw.send_prompt(&s, "remember me");
    raw.answer(&json!(id));
    (env, raw, s)
}

/// `session/load` and `session/resume` of a session acpd remembers open a session span as
/// `session/new` does, under the editor's trace context, saying how it was opened, with the
/// child's start under it, and its teardown.
#[test]
fn a_load_and_a_resume_open_a_session_span_saying_so() {
    let collector = Collector::start();
    let (env, mut raw, s) = remembered_session(&collector);
    for (method, span) in [
        ("session/load", "7777777777777777"),
        ("session/resume", "8888888888888888"),
    ] {
        raw.ok("session/close", json!({"sessionId": s}));
        let params = json!({"sessionId": s, "cwd": env.path(), "mcpServers": [],
            "_meta": {"traceparent": traceparent(span)}});
        raw.ok(method, params);
        let id = raw.send_prompt(&s, "after");
        raw.answer(&json!(id));
    }
    raw.close_write();

    let new = collector.until("the new session's span", |x| {
        x.name == "acpd.session"
            && x.attrs.get("acpd.session.opened").map(String::as_str) == Some("new")
    });
    assert_eq!(new.attrs["acpd.session.id"], s);
    for (opened, parent) in [("load", "7777777777777777"), ("resume", "8888888888888888")] {
        let span = collector.until(opened, |x| x.name == "acpd.session" && x.parent == parent);
        assert_eq!(
            (
                span.trace.as_str(),
                span.attrs["acpd.session.opened"].as_str()
            ),
            (TRACE, opened),
            "{span:?}"
        );
        assert_eq!(span.attrs["acpd.session.id"], s);
        assert_eq!(span.attrs["acpd.provider"], "fast");
        collector.until("the reopened session's acpd.start", |x| {
            x.name == "acpd.start" && x.parent == span.id
        });
        // The child holds the span: its teardown ends it.
        collector.until("the reopened session's acpd.teardown", |x| {
            x.name == "acpd.teardown" && x.parent == span.id
        });
    }
}

/// A load the agent refuses (its copy of the session is gone) ends the load's session span
/// failed, saying so, as a failed start does.
#[test]
fn a_load_the_agent_refuses_ends_its_span_failed() {
    let collector = Collector::start();
    let (env, mut raw, s) = remembered_session(&collector);
    raw.ok("session/close", json!({"sessionId": s}));
    std::fs::remove_dir_all(env.path().join("echo-sessions")).unwrap();
    std::fs::create_dir_all(env.path().join("echo-sessions")).unwrap();
    let params = json!({"sessionId": s, "cwd": env.path(), "mcpServers": [],
        "_meta": {"traceparent": traceparent("9999999999999999")}});
    let answer = raw.call("session/load", params);
    assert!(answer.get("error").is_some(), "{answer}");
    raw.close_write();
    let span = collector.until("the refused load's session span", |x| {
        x.name == "acpd.session" && x.parent == "9999999999999999" && x.failed.is_some()
    });
    assert_eq!(span.attrs["acpd.session.opened"], "load");
    let why = span.failed.unwrap();
    assert!(
        why.starts_with("the agent refused to open the session: "),
        "{why}"
    );
}

/// Under `acpd serve`, a session left by its connection and loaded on another is re-attached
/// to the same child: a session span of its own (`re-attach`), under the load's trace context,
/// and the first connection's span ends then.
#[test]
fn a_reattached_session_gets_a_span_saying_so() {
    let collector = Collector::start();
    let env = Env::new("");
    let d = crate::common::daemon::Daemon::start_with(env, |cmd| {
        for (k, _) in std::env::vars() {
            if k.starts_with("OTEL_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("OTEL_BSP_SCHEDULE_DELAY", "50")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint);
    });
    let mut first = Raw::socket(&d.socket);
    first.initialize(json!({}));
    let cwd = std::env::temp_dir();
    let s = first.new_session(&cwd, "fast");
    drop(first);
    let detached = eventually(Duration::from_secs(15), || {
        d.cli_json(&["runs"])["sessions"]
            .to_string()
            .contains("\"detached\"")
    });
    assert!(detached, "the session never detached: {}", d.log());
    let mut second = Raw::socket(&d.socket);
    second.initialize(json!({}));
    second.ok(
        "session/load",
        json!({"sessionId": s, "cwd": cwd, "mcpServers": [],
               "_meta": {"traceparent": traceparent("9999999999999999")}}),
    );
    // The first attachment's span ended at the re-attach: exported while the session lives.
    let before = collector.until("the first attachment's span", |x| {
        x.name == "acpd.session"
            && x.attrs.get("acpd.session.opened").map(String::as_str) == Some("new")
    });
    assert_eq!(before.attrs["acpd.session.id"], s);
    // The second's ends with the child's teardown, when the daemon stops.
    drop(second);
    d.terminate();
    let span = collector.until("the re-attach span", |x| {
        x.name == "acpd.session" && x.parent == "9999999999999999"
    });
    assert_eq!(span.attrs["acpd.session.opened"], "re-attach");
    assert_eq!(span.attrs["acpd.session.id"], s);
    assert_eq!(span.attrs["acpd.provider"], "fast");
    collector.until("the re-attached session's acpd.teardown", |x| {
        x.name == "acpd.teardown" && x.parent == span.id
    });
}
