//! `metrics_listen`, `_acpd/metrics` and `acpd status --metrics`: a real Prometheus server
//! (Debian's `prometheus`, which `.ci/run` installs) scrapes `acpd serve` and its PromQL answers
//! are the runs the test made; the text is strict Prometheus text; the HTTP side answers only
//! `GET /metrics` and a hostile scraper cannot hold the daemon.
//!
//! Ports: both servers bind port 0 and say which port the kernel gave them (acpd's log line
//! `metrics on http://ADDR/metrics`, Prometheus's `Listening on`), so no port is guessed and
//! nothing can take it between a probe and the bind.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::daemon::Daemon;
use crate::common::raw::Raw;
use crate::common::{Env, eventually};

/// A daemon serving metrics on a port the kernel picks, and that port.
pub(super) fn daemon() -> (Daemon, SocketAddr) {
    let d = Daemon::start(Env::new(
        "metrics_listen = \"127.0.0.1:0\"\n\
         [providers.broken]\ncommand = [\"/nonexistent/acpd-test-agent\"]\n",
    ));
    let mut addr = None;
    let found = eventually(Duration::from_secs(10), || {
        addr = d
            .log()
            .split("metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok());
        addr.is_some()
    });
    assert!(found, "no `metrics on` line in the log: {}", d.log());
    (d, addr.unwrap())
}

/// One HTTP/1.1 exchange on a fresh connection: the status code and the body.
fn http(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: acpd\r\nConnection: close\r\n\r\n"),
    )
}

/// Strict Prometheus text (0.0.4): every sample belongs to the family its `# TYPE` announced
/// just before (a histogram's `_bucket`, `_sum`, `_count`), names and labels are well formed,
/// values are numbers, no family appears twice. Returns the families seen.
fn strict_families(text: &str) -> Vec<String> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut families: Vec<String> = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(name_ok(name), "bad HELP name: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect(line);
            assert!(name_ok(name), "bad TYPE name: {line}");
            assert!(
                ["counter", "gauge", "histogram", "untyped"].contains(&kind),
                "bad TYPE: {line}"
            );
            assert!(!families.contains(&name.to_string()), "{name} twice");
            families.push(name.to_string());
            current = Some((name.to_string(), kind.to_string()));
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line: {line:?}"
        );
        let (series, value) = line.rsplit_once(' ').expect(line);
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "value: {line}"
        );
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, Some(l.strip_suffix('}').expect(line))),
            None => (series, None),
        };
        let (family, kind) = current.as_ref().expect("a sample before any TYPE");
        let suffix = name.strip_prefix(family.as_str()).expect(line);
        let allowed: &[&str] = if kind == "histogram" {
            &["_bucket", "_sum", "_count"]
        } else {
            &[""]
        };
        assert!(
            allowed.contains(&suffix),
            "{name} is not of family {family}"
        );
        for pair in labels.into_iter().flat_map(|l| l.split("\",")) {
            let (key, value) = pair.split_once("=\"").expect(line);
            assert!(name_ok(key), "label name: {line}");
            assert!(
                !value.trim_end_matches('"').contains('"'),
                "label value: {line}"
            );
        }
    }
    families
}

const FAMILIES: [&str; 18] = [
    "acpd_connections_total",
    "acpd_connections_open",
    "acpd_runs_started_total",
    "acpd_runs_ended_total",
    "acpd_child_start_failures_total",
    "acpd_child_start_seconds",
    "acpd_turn_seconds",
    "acpd_forwarded_messages_total",
    "acpd_forwarded_bytes_total",
    "acpd_limit_hits_total",
    "acpd_teardown_steps_total",
    "acpd_children",
    "acpd_sessions",
    "acpd_spares",
    "acpd_queued_starts",
    "acpd_otel_spans_exported_total",
    "acpd_otel_spans_dropped_total",
    "acpd_otel_values_cut_total",
];

/// `acpd status --metrics` is strict Prometheus text with every family (and `promtool check
/// metrics` agrees, where Prometheus is installed); `/metrics` answers the same families;
/// anything else on the port is 404.
#[test]
fn status_metrics_is_prometheus_text_and_the_port_serves_only_get_metrics() {
    let (d, addr) = daemon();
    // Families labelled by provider appear with their first event: one run.
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let run = start_run(&mut raw, "hello");
    assert_eq!(raw.wait_run(&run)["stopReason"], "completed");
    let params = json!({"provider": "broken", "cwd": "/tmp", "prompt": []});
    let refused = raw.call("_acpd/subagent/start", params);
    assert_eq!(
        refused["error"]["data"]["code"], "START_FAILED",
        "{refused}"
    );
    // A bridge session: one prompt through the relay, the session left attached.
    let session = raw.new_session(Path::new("/tmp"), "fast");
    let prompt = raw.send_prompt(&session, "through the relay");
    assert_eq!(
        raw.answer(&json!(prompt)).value["result"]["stopReason"],
        "end_turn"
    );
    let out = d.cli(&["status", "--metrics"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let families = strict_families(&text);
    for f in FAMILIES {
        assert!(families.iter().any(|s| s == f), "{f} missing: {text}");
    }
    // This test's connection and the status query, both from outside every child.
    assert!(
        text.contains("acpd_connections_open{kind=\"parent\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("acpd_children{provider=\"fast\",state=\"idle\"} 1"),
        "{text}"
    );
    let failed = "acpd_child_start_failures_total{provider=\"broken\",category=\"spawn\"} 1";
    assert!(text.contains(failed), "{text}");
    for line in [
        "acpd_sessions{state=\"attached\"} 1",
        "acpd_children{provider=\"fast\",state=\"attached\"} 1",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    let forwarded = |direction: &str| {
        let series = format!("acpd_forwarded_messages_total{{direction=\"{direction}\"}} ");
        let n = text.split(&series).nth(1).and_then(|r| r.lines().next());
        n.and_then(|n| n.parse::<u64>().ok()).unwrap_or(0)
    };
    // The prompt and its answer, the updates between: at least one each way.
    assert!(forwarded("parent_to_child") >= 1, "{text}");
    assert!(forwarded("child_to_parent") >= 2, "{text}");
    if which("promtool") {
        let mut check = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        check
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let checked = check.wait_with_output().unwrap();
        assert!(
            checked.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
    }

    let (code, body) = get(addr, "/metrics");
    assert_eq!(code, 200, "{body}");
    assert_eq!(strict_families(&body), families, "{body}");
    assert_eq!(get(addr, "/").0, 404);
    assert_eq!(get(addr, "/metrics/../status").0, 404);
    let post =
        "POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    assert_eq!(http(addr, post).0, 404);
    // A request head past the bound is refused, and the next scrape is served.
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: a\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let (code, _) = http(addr, &huge);
    assert!(code == 431 || code == 0, "an oversized head got {code}");
    assert_eq!(get(addr, "/metrics").0, 200);
}

/// A `metrics_listen` port that is taken stops `acpd serve` at start with one line naming the
/// address, the key and the OS error, and leaves no socket behind.
#[test]
fn a_taken_port_stops_serve_and_leaves_no_socket() {
    // Held by the test for its whole length: nothing can free it in between.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let env = Env::new(&format!("metrics_listen = \"{addr}\""));
    let socket = env.path().join("acpd.sock");
    let out = env
        .acpd()
        .args(["serve", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot serve metrics on {addr} (metrics_listen)"))
            && err.contains("in use"),
        "{err}"
    );
    assert!(!socket.exists(), "the socket was left behind");
}

/// `_acpd/metrics` is open to whoever may call `_acpd/status`, on the same terms: only after
/// `initialize`, params an object; the answer carries the text and its content type.
#[test]
fn the_socket_method_answers_like_status() {
    let (d, _) = daemon();
    let mut raw = Raw::socket(&d.socket);
    for method in ["_acpd/status", "_acpd/metrics"] {
        let early = raw.call(method, json!({}));
        assert!(
            early["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("initialize must complete")),
            "{method}: {early}"
        );
    }
    raw.initialize(json!({}));
    for method in ["_acpd/status", "_acpd/metrics"] {
        let bad = raw.call(method, json!([1]));
        assert_eq!(
            bad["error"]["data"]["code"], "INVALID_REQUEST",
            "{method}: {bad}"
        );
    }
    let reply = raw.ok("_acpd/metrics", json!({}));
    assert_eq!(
        reply["contentType"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = reply["text"].as_str().unwrap();
    assert!(strict_families(text).len() >= 10, "{text}");
}

/// A TCP connection to `to` from `source` (any 127.0.0.0/8 address is loopback on Linux).
fn connect_from(source: [u8; 4], to: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::from((source, 0)))?;
            socket.connect(to).await
        })
        .unwrap()
        .into_std()
        .unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// Whether acpd closed `s` (EOF), without waiting.
fn closed(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let gone = matches!((&*s).read(&mut byte), Ok(0));
    s.set_nonblocking(false).unwrap();
    gone
}

/// Silent connections cost their holder, not the next scraper: 28 held open from seven
/// addresses (more than the 16 served at once, more than the 4 one address may hold) keep
/// nobody out. A scraper from another address, and one from an address that holds 4, are
/// answered at once, each closing the oldest connection it competed with; the ACP socket
/// keeps answering; and acpd closes the idle ones itself (10 s for a request head).
#[test]
fn silent_connections_cost_their_holder_not_the_next_scraper() {
    let (d, addr) = daemon();
    let idle: Vec<TcpStream> = (0..28)
        .map(|n| connect_from([127, 0, 0, 2 + (n % 7) as u8], addr))
        .collect();
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    assert!(raw.ok("_acpd/status", json!({}))["pid"].is_u64());
    // Past the bounds, the oldest are closed at once (the accept loop is not held): 12 of
    // them to keep 16.
    assert!(
        eventually(Duration::from_secs(10), || idle
            .iter()
            .filter(|s| closed(s))
            .count()
            >= 12),
        "more than 16 idle connections were kept"
    );
    for source in [[127, 0, 0, 1], [127, 0, 0, 2]] {
        let started = std::time::Instant::now();
        let mut s = connect_from(source, addr);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: acpd\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "a scrape from {source:?} among silent connections got {answer:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(
        eventually(Duration::from_secs(30), || idle.iter().all(closed)),
        "acpd kept idle scrapers past its head timeout"
    );
    assert_eq!(get(addr, "/metrics").0, 200);
}

/// A run of the `fast` echo provider in /tmp; its id.
pub(super) fn start_run(raw: &mut Raw, text: &str) -> String {
    let params = json!({"provider": "fast", "cwd": "/tmp",
        "prompt": [{"type": "text", "text": text}]});
    let started = raw.ok("_acpd/subagent/start", params);
    started["runId"].as_str().expect("runId").to_string()
}

pub(super) fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Whether a real Prometheus can be started; says the test is skipped when not.
pub(super) fn prometheus_on_path() -> bool {
    let there = which("prometheus");
    if !there {
        println!(
            "skipped: no `prometheus` on PATH (Debian package prometheus; .ci/run installs it)"
        );
    }
    there
}

/// A Prometheus server on its own temporary config and storage, ended with the test.
pub(super) struct Prometheus {
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if !eventually(Duration::from_secs(20), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `target` every second; returns once it says where it listens.
    pub(super) fn start(dir: &Path, target: SocketAddr) -> (Prometheus, SocketAddr) {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: acpd\n    static_configs:\n      \
                 - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let p = Prometheus { child, log };
        let mut addr = None;
        let up = eventually(Duration::from_secs(30), || {
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            addr = log
                .lines()
                .filter(|l| l.contains("msg=\"Listening on\""))
                .find_map(|l| l.split("address=").nth(1))
                .and_then(|a| a.trim().parse().ok());
            addr.is_some()
        });
        assert!(up, "prometheus did not listen: {}", p.log());
        (p, addr.unwrap())
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An instant PromQL query: each series' labels and value.
    pub(super) fn query(&self, at: SocketAddr, promql: &str) -> Vec<(Value, f64)> {
        let Ok(mut answer) = ureq::get(format!("http://{at}/api/v1/query"))
            .query("query", promql)
            .call()
        else {
            return Vec::new();
        };
        let Ok(body) = answer.body_mut().read_to_string() else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| {
                let value = s["value"][1].as_str()?.parse().ok()?;
                Some((s["metric"].clone(), value))
            })
            .collect()
    }

    /// Waits (up to a minute: a scrape a second, then the query) until `promql`, summed by
    /// stop reason and category, says `made`; panics with what it said otherwise.
    pub(super) fn wait_for_outcomes(
        &self,
        at: SocketAddr,
        promql: &str,
        made: &BTreeMap<(String, String), f64>,
    ) {
        let mut seen = BTreeMap::new();
        let agreed = eventually(Duration::from_secs(60), || {
            seen = self
                .query(at, promql)
                .into_iter()
                .map(|(m, v)| {
                    let label = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                    ((label("stop_reason"), label("category")), v)
                })
                .collect();
            &seen == made
        });
        assert!(
            agreed,
            "PromQL `{promql}` said {seen:?}, the test made {made:?}; prometheus: {}",
            self.log()
        );
    }
}

/// The runs this test makes, by (stop reason, failure category), from their own results.
fn outcome(result: &Value) -> (String, String) {
    (
        result["stopReason"].as_str().unwrap().to_string(),
        result["failure"]["category"]
            .as_str()
            .unwrap_or("none")
            .to_string(),
    )
}

/// A real Prometheus scrapes `acpd serve` every second; the run counts its PromQL returns are
/// the ones this test produced: three completed, two cancelled, one agent error, one crash.
#[test]
fn prometheus_scrapes_the_runs_this_test_made() {
    if !prometheus_on_path() {
        return;
    }
    let (d, metrics) = daemon();
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let mut made: BTreeMap<(String, String), f64> = BTreeMap::new();
    let mut count = |result: Value| *made.entry(outcome(&result)).or_default() += 1.0;
    for text in ["one", "two", "three", ":error -32603 boom", ":crash 3"] {
        let run = start_run(&mut raw, text);
        count(raw.wait_run(&run));
    }
    for _ in 0..2 {
        let run = start_run(&mut raw, ":sleep 60000");
        raw.ok("_acpd/subagent/cancel", json!({"runId": run}));
        count(raw.wait_run(&run));
    }
    let key = |s: &str, c: &str| (s.to_string(), c.to_string());
    assert_eq!(made.get(&key("completed", "none")), Some(&3.0), "{made:?}");
    assert_eq!(made.get(&key("aborted", "none")), Some(&2.0), "{made:?}");
    assert_eq!(made.get(&key("error", "rpc")), Some(&1.0), "{made:?}");
    assert_eq!(
        made.get(&key("error", "process-exit")),
        Some(&1.0),
        "{made:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (prometheus, api) = Prometheus::start(dir.path(), metrics);
    let by_outcome = "sum by (stop_reason, category) (acpd_runs_ended_total)";
    prometheus.wait_for_outcomes(api, by_outcome, &made);
    let started = prometheus.query(api, "sum(acpd_runs_started_total{provider=\"fast\"})");
    assert_eq!(started.first().map(|s| s.1), Some(7.0), "{started:?}");
    // The crashed run's child was torn down: its ladder began by closing stdin.
    let eof = prometheus.query(api, "acpd_teardown_steps_total{step=\"eof\"}");
    assert!(eof.first().is_some_and(|s| s.1 >= 1.0), "{eof:?}");
    let up = prometheus.query(api, "up{job=\"acpd\"}");
    assert_eq!(up.first().map(|s| s.1), Some(1.0), "{up:?}");
}
