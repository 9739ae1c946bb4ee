#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic
//! Sessions that outlive their connection, over a real `acpd serve` and real clients (`acpd
//! connect` driven by the ACP SDK, or raw socket connections): a closing connection detaches
//! its bridge sessions (`detach_timeout`), another connection attaches them again with their
//! child and its unanswered permission requests, they expire, SIGTERM reaps them; warm spares
//! (`warm`, `warm_max_age`) are taken by sessions, replaced, recycled, and count in the
//! limits. This binary makes itself a subreaper (PID 1 here reaps nothing), so orphans it
//! adopts are reaped by pid before survivors are counted.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::client::AcpClient;
use common::daemon::Daemon;
use common::raw::{Raw, gone_within, subreaper};
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// The graces of the provider (3 × 300 ms) plus slack for a loaded 2-core machine.
const LADDER: Duration = Duration::from_millis(900 + 5000);

/// How long a test waits for a state it expects the daemon to reach.
const SETTLE: Duration = Duration::from_secs(15);

/// What a test's daemon runs: top-level keys, the provider's extra keys, and whether the echo
/// keeps its sessions on disk (`--sessions`, so a fresh child can `session/load` them).
#[derive(Default)]
struct Setup {
    top: &'static str,
    provider: &'static str,
    sessions: bool,
    /// Started through `sh`, which first appends a line to `<env>/spawns` (every start
    /// counted, however short the child's life).
    count_spawns: bool,
}

/// A config whose default (and only configured) provider `p` is the echo agent with fast
/// graces, started in the env's directory when no request names a cwd (where the sessions
/// here are opened: a spare is only handed to a child for the directory it runs in).
fn env(setup: &Setup) -> Env {
    let env = Env::raw("");
    let sessions = if setup.sessions {
        let dir = env.path().join("echo-sessions");
        std::fs::create_dir_all(&dir).unwrap();
        format!(", \"--sessions\", \"{}\"", dir.display())
    } else {
        String::new()
    };
    let command = if setup.count_spawns {
        let log = env.path().join("spawns");
        format!(
            "\"sh\", \"-c\", \"echo $$ >> '{}'; exec '{BIN}' agent echo{}\"",
            log.display(),
            sessions.replace(", ", " ").replace('"', "'")
        )
    } else {
        format!("\"{BIN}\", \"agent\", \"echo\"{sessions}")
    };
    let toml = format!(
        "default_provider = \"p\"\n{top}\n[providers.p]\n\
         command = [{command}]\ncwd = {cwd:?}\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n{provider}\n",
        top = setup.top,
        provider = setup.provider,
        cwd = env.path().to_str().unwrap(),
    );
    std::fs::write(&env.config, toml).unwrap();
    env
}

/// The shared fixture on the config `setup` describes.
fn daemon(setup: &Setup) -> Daemon {
    Daemon::start(env(setup))
}

/// What this file asks of its daemon beyond the shared fixture: sessions, spares, children.
trait Detach {
    fn cwd(&self) -> &Path;
    fn sessions(&self) -> Vec<Value>;
    fn session_in(&self, sid: &str, state: &str) -> Value;
    fn session_counts(&self, attached: u64, detached: u64);
    fn spares(&self) -> u64;
    fn echo_children(&self) -> Vec<i32>;
    fn only_spare(&self) -> i32;
    fn only_spare_beside(&self, busy: &[i32]) -> i32;
    fn connect(&self) -> Raw;
}

impl Detach for Daemon {
    fn cwd(&self) -> &Path {
        self.env.path()
    }

    /// The live bridge sessions `acpd runs --json` lists.
    fn sessions(&self) -> Vec<Value> {
        self.cli_json(&["runs"])["sessions"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `acpd runs` lists `sid` in `state`; returns its entry.
    fn session_in(&self, sid: &str, state: &str) -> Value {
        let mut last = Vec::new();
        let seen = eventually(SETTLE, || {
            last = self.sessions();
            last.iter()
                .any(|s| s["sessionId"] == sid && s["state"] == state)
        });
        assert!(seen, "{sid} never {state}; acpd runs: {last:?}");
        last.into_iter().find(|s| s["sessionId"] == sid).unwrap()
    }

    /// Waits until `status.sessions` is `{attached, detached}`.
    fn session_counts(&self, attached: u64, detached: u64) {
        let want = json!({"attached": attached, "detached": detached});
        let mut last = Value::Null;
        let settled = eventually(SETTLE, || {
            last = self.status()["sessions"].clone();
            last == want
        });
        assert!(settled, "status.sessions never {want}: {last}");
    }

    fn spares(&self) -> u64 {
        self.status()["spares"]["p"].as_u64().unwrap_or(0)
    }

    /// The echo agents the daemon spawned (its children running `acpd agent echo`).
    fn echo_children(&self) -> Vec<i32> {
        children_of(self.pid().as_raw())
            .into_iter()
            .filter(|&pid| is_echo(pid))
            .collect()
    }

    /// Waits until the pool holds one spare and it is the daemon's only echo child (nothing
    /// else alive, nothing being recycled); returns its pid.
    fn only_spare(&self) -> i32 {
        self.only_spare_beside(&[])
    }

    /// As [`Daemon::only_spare`], the children of the sessions `busy` aside.
    fn only_spare_beside(&self, busy: &[i32]) -> i32 {
        let others = |d: &Daemon| {
            let mut kids = d.echo_children();
            kids.retain(|k| !busy.contains(k));
            kids
        };
        // The spare's process first, without asking the daemon: a query's `initialize` may
        // probe the agent, and that probe would compete with the spare for a slot.
        assert!(
            eventually(SETTLE, || others(self).len() == 1),
            "no spare process: {:?}",
            others(self)
        );
        let mut last = (0, Vec::new());
        let settled = eventually(SETTLE, || {
            last = (self.spares(), others(self));
            last.0 == 1 && last.1.len() == 1
        });
        assert!(
            settled,
            "never one spare alone (spares, echo children): {last:?}; log: {}",
            self.log()
        );
        last.1[0]
    }

    fn connect(&self) -> Raw {
        let mut raw = Raw::socket(&self.socket);
        raw.initialize(json!({}));
        raw
    }
}

/// Processes whose parent is `parent` (from /proc/<pid>/stat).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut kids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| ppid(pid) == Some(parent))
        .collect();
    kids.sort_unstable();
    kids
}

fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses, the last ')' ends it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A live (not zombie) `acpd agent echo`.
fn is_echo(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
            args.windows(2).any(|w| w == [b"agent".as_slice(), b"echo"])
        })
        .unwrap_or(false)
}

/// Runs one prompt over a raw connection; its streamed text (the lines before are kept).
fn prompt(raw: &mut Raw, sid: &str, text: &str) -> String {
    raw.seen.clear();
    let id = raw.send_prompt(sid, text);
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(
        answer["result"]["stopReason"], "end_turn",
        "{text:?}: {answer}"
    );
    raw.chunk_text(sid)
}

fn load_params(sid: &str, cwd: &Path) -> Value {
    json!({"sessionId": sid, "cwd": cwd, "mcpServers": []})
}

/// Reads the SDK client's notifications until a chunk of `sid` contains `needle`.
async fn until_chunk(client: &mut AcpClient, sid: &str, needle: &str) -> String {
    loop {
        let (method, params) = client.next_note().await;
        let text = params["update"]["content"]["text"].as_str().unwrap_or("");
        if method == "session/update" && params["sessionId"] == sid && text.contains(needle) {
            return text.to_string();
        }
    }
}

/// A prompt through the SDK client, sent again while the agent still finishes an earlier
/// turn (one whose answer went to a connection that is gone, so nobody here sees it end).
async fn prompt_when_idle(client: &mut AcpClient, sid: &str, text: &str) -> String {
    let deadline = Instant::now() + SETTLE;
    loop {
        match client.prompt(sid, text).await {
            Ok(r) => {
                assert_eq!(r["stopReason"], "end_turn", "{r}");
                return client.drain_text(sid);
            }
            Err(e) if e.message.contains("in progress") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("prompt {text:?}: {e:?}"),
        }
    }
}

// ---- Detach and attach again ----------------------------------------------------------------

/// An editor that dies with a permission request unanswered: its session waits, detached, with
/// the same child; a new connection's `session/load` attaches it at once (the echo here cannot
/// load sessions, so only a re-attach can succeed), is asked that permission again, and its
/// answer reaches the turn that asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_session_is_attached_again_with_its_child_and_its_pending_permission() {
    subreaper();
    let d = daemon(&Setup::default());
    let cwd = d.cwd().to_path_buf();
    let mut first = d.client();
    first.initialize(json!({})).await;
    let sid = first.new_session(&cwd, None).await;
    assert!(sid.starts_with("acpd-"), "{sid}");
    let r = first.prompt(&sid, ":pid").await.unwrap();
    assert_eq!(r["stopReason"], "end_turn");
    let pid = pid_after(&first.drain_text(&sid), "pid ");
    let _unanswered = first.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": ":permission\nafter it"}]}),
    );
    let ask = first.next_request().await;
    assert_eq!(ask.method, "session/request_permission");
    assert_eq!(ask.params["sessionId"], sid, "{}", ask.params);
    // The editor goes away (its `acpd connect` killed) without answering.
    first.process.start_kill().unwrap();
    first.process.wait().await.unwrap();
    drop(ask);
    drop(first);

    let entry = d.session_in(&sid, "detached");
    assert_eq!(
        (entry["pid"].as_i64(), entry["provider"].as_str()),
        (Some(pid as i64), Some("p")),
        "{entry}"
    );
    d.session_counts(0, 1);
    assert!(exists(pid), "the detached session's child {pid} is gone");

    let mut second = d.client();
    second.initialize(json!({})).await;
    let loaded = second
        .request("session/load", load_params(&sid, &cwd))
        .await;
    assert!(
        loaded.is_ok(),
        "session/load of a detached session: {loaded:?}"
    );
    let ask = tokio::time::timeout(SETTLE, second.requests.recv())
        .await
        .unwrap_or_else(|_| {
            panic!("the permission request pending at detach was not asked again after re-attach")
        })
        .expect("connection open");
    assert_eq!(ask.method, "session/request_permission");
    assert_eq!(ask.params["sessionId"], sid, "{}", ask.params);
    let option = ask.params["options"][0]["optionId"]
        .as_str()
        .unwrap()
        .to_string();
    ask.reply(json!({"outcome": {"outcome": "selected", "optionId": option}}));
    let text = until_chunk(&mut second, &sid, "permission: ").await;
    assert_eq!(text, format!("permission: selected {option}\n"));
    assert_eq!(until_chunk(&mut second, &sid, "after").await, "after it");

    let entry = d.session_in(&sid, "attached");
    assert_eq!(entry["pid"].as_i64(), Some(pid as i64), "{entry}");
    d.session_counts(1, 0);
    let text = prompt_when_idle(&mut second, &sid, "again\n:pid").await;
    assert_eq!(pid_after(&text, "pid "), pid, "{text:?}");
    assert!(text.starts_with("again\n"), "{text:?}");
    second.close().await;
    let (status, _) = d.terminate();
    assert!(status.success(), "{status}");
    assert!(gone_within(pid, LADDER), "{pid} survived the daemon");
}

/// With `detach_timeout = "1s"` a detached session's child lives about that long, no less, and
/// is then torn down; a later `session/load` is an ordinary load (a fresh child of the echo
/// with `--sessions` replays the history under the acpd id).
#[test]
fn a_detached_session_expires_and_a_later_load_starts_a_fresh_child() {
    subreaper();
    let d = daemon(&Setup {
        top: "detach_timeout = \"1s\"",
        sessions: true,
        ..Setup::default()
    });
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    let closed = Instant::now();
    drop(a);
    assert!(
        gone_within(pid, Duration::from_secs(1) + LADDER),
        "the detached child {pid} outlived detach_timeout; log: {}",
        d.log()
    );
    let lived = closed.elapsed();
    assert!(
        lived >= Duration::from_secs(1),
        "the child died {lived:?} after its connection closed, before detach_timeout"
    );
    d.session_counts(0, 0);
    assert_eq!(d.sessions(), Vec::<Value>::new());

    let mut b = d.connect();
    let loaded = b.call("session/load", load_params(&sid, d.cwd()));
    assert!(loaded.get("error").is_none(), "{loaded}");
    let replayed = b.chunk_text(&sid);
    assert!(
        replayed.contains(&format!("pid {pid}\n")),
        "no history replayed under {sid}: {replayed:?}; seen {:?}",
        b.seen_text()
    );
    let fresh = pid_after(&prompt(&mut b, &sid, ":pid"), "pid ");
    assert_ne!(fresh, pid);
    let entry = d.session_in(&sid, "attached");
    assert_eq!(entry["pid"].as_i64(), Some(fresh as i64), "{entry}");
}

/// `detach_timeout = "0s"`: the session ends with its connection.
#[test]
fn without_detach_the_child_dies_with_the_connection() {
    subreaper();
    let d = daemon(&Setup {
        top: "detach_timeout = \"0s\"",
        ..Setup::default()
    });
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    assert_eq!(
        d.session_in(&sid, "attached")["pid"].as_i64(),
        Some(pid as i64)
    );
    drop(a);
    assert!(
        gone_within(pid, LADDER),
        "the child {pid} outlived its connection with detach off"
    );
    d.session_counts(0, 0);
    assert_eq!(d.sessions(), Vec::<Value>::new());
    // Nothing to attach: a load is an ordinary one, which this echo (no --sessions) refuses.
    let mut b = d.connect();
    let loaded = b.call("session/load", load_params(&sid, d.cwd()));
    assert!(loaded.get("error").is_some(), "{loaded}");
}

/// A session open on a live connection is that connection's: another one cannot load it (nor
/// resume it), and the attempt leaves it working where it is.
#[test]
fn a_session_open_on_a_live_connection_cannot_be_loaded_from_another() {
    subreaper();
    let d = daemon(&Setup::default());
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    let mut b = d.connect();
    for method in ["session/load", "session/resume"] {
        let answer = b.call(method, load_params(&sid, d.cwd()));
        let e = &answer["error"];
        assert!(
            e["code"].as_i64() == Some(-32600)
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("another connection")),
            "{method} of a session open elsewhere: {answer}"
        );
    }
    assert_eq!(b.chunk_text(&sid), "", "b got a's session traffic");
    let text = prompt(&mut a, &sid, "still mine\n:pid");
    assert_eq!(pid_after(&text, "pid "), pid, "{text:?}");
    assert!(text.starts_with("still mine\n"), "{text:?}");
    let entry = d.session_in(&sid, "attached");
    assert_eq!(entry["pid"].as_i64(), Some(pid as i64), "{entry}");
    d.session_counts(1, 0);
}

/// SIGTERM while a session is detached (and a spare waits): the daemon reaps both and exits 0
/// within the graces' bound.
#[test]
fn sigterm_while_a_session_is_detached_leaves_no_process() {
    subreaper();
    let d = daemon(&Setup {
        provider: "warm = 1",
        ..Setup::default()
    });
    let spare = d.only_spare();
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    drop(a);
    d.session_in(&sid, "detached");
    let mut kids = Vec::new();
    let settled = eventually(SETTLE, || {
        kids = d.echo_children();
        d.spares() == 1 && kids.len() == 2
    });
    assert!(settled, "no replacement spare beside the session: {kids:?}");
    assert!(kids.contains(&pid), "{pid} is not among {kids:?}");
    assert_eq!(pid, spare, "the session did not take the spare");
    let (status, took) = d.terminate();
    assert_eq!(status.code(), Some(0), "{status}");
    // cancel_grace + eof_grace + term_grace = 0.9 s; the bound adds a margin.
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    for kid in kids {
        assert!(
            gone_within(kid, LADDER),
            "{kid} survived the daemon's SIGTERM"
        );
    }
}

// ---- Warm spares ----------------------------------------------------------------------------

/// A session takes the ready spare (its child is the spare's process), a replacement with
/// another pid takes its place, and the next session takes that one.
#[test]
fn a_session_takes_the_warm_spare_and_a_replacement_follows() {
    subreaper();
    let d = daemon(&Setup {
        provider: "warm = 1",
        ..Setup::default()
    });
    let spare = d.only_spare();
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    assert_eq!(pid, spare, "the session did not start on the spare");
    let mut kids = Vec::new();
    let replaced = eventually(SETTLE, || {
        kids = d.echo_children();
        d.spares() == 1 && kids.len() == 2
    });
    assert!(replaced, "no replacement spare: {kids:?}");
    let replacement = *kids.iter().find(|&&k| k != spare).unwrap();
    assert!(exists(spare), "the session's child is gone");
    let mut b = d.connect();
    let sid2 = b.new_session(d.cwd(), "p");
    let pid2 = pid_after(&prompt(&mut b, &sid2, ":pid"), "pid ");
    assert_eq!(
        pid2, replacement,
        "the second session did not take the replacement"
    );
}

/// With `warm_max_age = "2s"` a spare is recycled: not before it is 2 s old, then a new spare
/// (another process) takes its place and the old process is gone.
#[test]
fn an_old_spare_is_recycled() {
    subreaper();
    let started = Instant::now();
    let d = daemon(&Setup {
        provider: "warm = 1\nwarm_max_age = \"2s\"",
        ..Setup::default()
    });
    let old = d.only_spare();
    // Checked every clamp(2 s / 4, 1 s, 60 s) = 1 s: recycled within 3 s of being ready.
    assert!(
        gone_within(old, Duration::from_secs(3) + LADDER),
        "the spare {old} was never recycled; log: {}",
        d.log()
    );
    let lived = started.elapsed();
    assert!(
        lived >= Duration::from_secs(2),
        "the spare was recycled after {lived:?}, younger than warm_max_age"
    );
    let new = d.only_spare();
    assert_ne!(new, old);
}

/// A spare holds its claim on `max_concurrent`: with one slot and one spare, a delegated start
/// gets CAPACITY; a session takes the spare (and its slot), and while it lives a delegated
/// start still gets CAPACITY.
#[test]
fn spares_count_in_the_limits() {
    subreaper();
    let d = daemon(&Setup {
        provider: "max_concurrent = 1\nwarm = 1",
        ..Setup::default()
    });
    let spare = d.only_spare();
    let mut a = d.connect();
    let start =
        json!({"provider": "p", "prompt": [{"type": "text", "text": "hi"}], "cwd": d.cwd()});
    let capacity = |answer: &Value| answer["error"]["data"]["code"] == "CAPACITY";
    let answer = a.call("_acpd/subagent/start", start.clone());
    assert!(capacity(&answer), "a start beside the spare: {answer}");
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    assert_eq!(pid, spare, "the session did not take the spare");
    let answer = a.call("_acpd/subagent/start", start);
    assert!(capacity(&answer), "a start beside the session: {answer}");
    let status = d.status();
    assert_eq!(
        status["limits"]["providers"]["p"]["live"].as_u64(),
        Some(1),
        "{status}"
    );
    assert_eq!(d.echo_children(), vec![pid]);
}

/// Reads until acpd asks the client something; the lines before are kept in `seen`.
fn next_request(raw: &mut Raw, what: &str) -> common::raw::Line {
    if let Some(at) = raw.seen.iter().position(|l| l.is_request()) {
        return raw.seen.remove(at);
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(line) = raw.next_within(left) else {
            panic!("{what} never came; seen: {:?}", raw.seen_text());
        };
        if line.is_request() {
            return line;
        }
        raw.seen.push(line);
    }
}

/// `session/resume` attaches a detached session too, raw: the unanswered permission request is
/// asked again and its answer reaches the turn, the answer of the old connection's prompt
/// reaches nobody, the session detaches a second time, and `session/close` from yet another
/// connection ends it.
#[test]
fn resume_attaches_again_and_close_ends_a_detached_session() {
    subreaper();
    let d = daemon(&Setup::default());
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    a.send_prompt(&sid, ":permission\nafter it");
    let ask = next_request(&mut a, "the permission request");
    assert_eq!(ask.method(), "session/request_permission", "{}", ask.text());
    drop(a);
    d.session_in(&sid, "detached");

    let mut b = d.connect();
    let resumed = b.call("session/resume", load_params(&sid, d.cwd()));
    assert!(resumed.get("error").is_none(), "{resumed}");
    let ask = next_request(
        &mut b,
        "the permission request pending at detach, asked again after re-attach,",
    );
    assert_eq!(
        (ask.method(), &ask.value["params"]["sessionId"]),
        ("session/request_permission", &json!(sid)),
        "{}",
        ask.text()
    );
    let reply = json!({"jsonrpc": "2.0", "id": ask.value["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}});
    b.line(&reply.to_string());
    assert_eq!(
        b.until_chunk(&sid, "permission: "),
        "permission: selected allow\n"
    );
    b.until_chunk(&sid, "after it");
    // The echo takes a new prompt once the old turn is over.
    let deadline = Instant::now() + SETTLE;
    let answer = loop {
        let id = b.send_prompt(&sid, ":pid");
        let answer = b.answer(&json!(id)).value;
        let busy = answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("in progress"));
        if !busy || Instant::now() >= deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let strays: Vec<String> = b
        .seen
        .iter()
        .filter(|l| l.is_response())
        .map(|l| l.text())
        .collect();
    assert!(
        strays.is_empty(),
        "answers this connection never asked for: {strays:?}"
    );
    let text = b.chunk_text(&sid);
    assert!(text.contains(&format!("pid {pid}\n")), "{text:?}");
    drop(b);
    let entry = d.session_in(&sid, "detached");
    assert_eq!(entry["pid"].as_i64(), Some(pid as i64), "{entry}");

    let mut c = d.connect();
    let closed = c.call("session/close", json!({"sessionId": sid}));
    assert_eq!(closed["result"], json!({}), "{closed}");
    assert!(
        gone_within(pid, LADDER),
        "the closed detached session's child {pid} lives on"
    );
    d.session_counts(0, 0);
    assert_eq!(d.sessions(), Vec::<Value>::new());
}

/// A detached session whose child dies is forgotten: not counted, not listed, and a load is
/// no re-attach to a corpse (this echo cannot load, so it fails).
#[test]
fn a_detached_session_whose_child_dies_is_forgotten() {
    subreaper();
    let d = daemon(&Setup::default());
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    drop(a);
    d.session_in(&sid, "detached");
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    assert!(gone_within(pid, LADDER), "{pid} survived SIGKILL");
    d.session_counts(0, 0);
    assert_eq!(d.sessions(), Vec::<Value>::new());
    let mut b = d.connect();
    let loaded = b.call("session/load", load_params(&sid, d.cwd()));
    assert!(loaded.get("error").is_some(), "{loaded}");
}

/// Utility children take spares too: a `session/list` (the echo with `--sessions` lists) runs
/// on the spare, which is then gone, and a new spare takes its place.
#[test]
fn a_listing_takes_the_spare() {
    subreaper();
    let d = daemon(&Setup {
        provider: "warm = 1",
        sessions: true,
        ..Setup::default()
    });
    let spare = d.only_spare();
    let mut a = d.connect();
    let listed = a.ok("session/list", json!({}));
    assert!(listed["sessions"].is_array(), "{listed}");
    assert!(
        gone_within(spare, LADDER),
        "the listing did not run on the spare {spare} (it is still alive)"
    );
    let new = d.only_spare();
    assert_ne!(new, spare);
}

/// The pool follows the client capabilities of the last session that took one: a session
/// whose editor advertises other capabilities starts cold (the old spare is dropped), the new
/// spare is initialized with its capabilities, and the next such session takes it.
#[test]
fn spares_follow_the_capabilities_of_the_last_taker() {
    subreaper();
    let d = daemon(&Setup {
        provider: "warm = 1",
        ..Setup::default()
    });
    let old = d.only_spare();
    let caps = json!({"fs": {"readTextFile": true, "writeTextFile": false}, "terminal": false});
    let mut a = Raw::socket(&d.socket);
    a.initialize(caps.clone());
    let sid = a.new_session(d.cwd(), "p");
    let cold = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    assert_ne!(
        cold, old,
        "a session with other capabilities took the spare"
    );
    assert!(
        gone_within(old, LADDER),
        "the spare {old} of the old capabilities lives on"
    );
    let new = d.only_spare_beside(&[cold]);
    assert_ne!(new, old);
    let mut b = Raw::socket(&d.socket);
    b.initialize(caps);
    let sid2 = b.new_session(d.cwd(), "p");
    let pid2 = pid_after(&prompt(&mut b, &sid2, ":pid"), "pid ");
    assert_eq!(
        pid2, new,
        "the session did not take the spare of its capabilities"
    );
}

/// Issue 19: loading a session open on this very connection is the agent's to answer, as
/// directly: it replays the history (under the acpd id) and the session stays open.
#[test]
fn loading_a_session_open_on_this_connection_replays_it() {
    let d = daemon(&Setup {
        sessions: true,
        ..Setup::default()
    });
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    assert_eq!(prompt(&mut a, &sid, "said once"), "said once");
    a.seen.clear();
    let answer = a.call("session/load", load_params(&sid, d.cwd()));
    assert_eq!(answer["result"], json!({}), "{answer}");
    let replayed: Vec<&Value> = a
        .seen
        .iter()
        .filter(|l| l.method() == "session/update")
        .map(|l| &l.value["params"])
        .collect();
    assert_eq!(replayed.len(), 2, "{replayed:?}");
    assert!(
        replayed.iter().all(|p| p["sessionId"] == sid),
        "{replayed:?}"
    );
    let text = prompt(&mut a, &sid, "still open");
    assert_eq!(text, "still open");
}

/// The echo's session files (`--sessions`): child id → the file's JSON.
fn echo_sessions(d: &Daemon) -> std::collections::BTreeMap<String, Value> {
    std::fs::read_dir(d.env.path().join("echo-sessions"))
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            // Not a write in progress (a temporary file renamed into place).
            path.extension().filter(|x| *x == "json")?;
            let value: Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
            Some((path.file_stem()?.to_str()?.to_string(), value))
        })
        .collect()
}

/// The child id of the session whose history holds `said`.
fn echo_session_with(d: &Daemon, said: &str) -> String {
    let all = echo_sessions(d);
    let found = all
        .iter()
        .find(|(_, v)| v["history"].to_string().contains(said));
    found
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("no session said {said:?}: {all:?}"))
}

/// Spare sessions made ahead: the files with no history yet, by cwd.
fn made_ahead(d: &Daemon) -> Vec<(String, String)> {
    echo_sessions(d)
        .into_iter()
        .filter(|(_, v)| v["history"].as_array().is_none_or(|h| h.is_empty()))
        .map(|(id, v)| (id, v["cwd"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn process_cwd(pid: i32) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap()
}

/// Issue 19 (warm means warm): once a session was opened in a cwd, the replacement spare is
/// started in that cwd and makes its `session/new` there ahead; the next session for that cwd
/// and params is handed that very session (the agent minted it before the editor asked), on
/// the spare's process. A session for another cwd does not take it: it starts cold, the spare
/// and its session are recycled (deleted at the agent), and the pool follows the new cwd. The
/// first session, in a/, starts cold: the first spare runs in the provider's cwd.
#[test]
fn a_spare_holds_a_session_for_the_last_cwd_and_hands_it_over() {
    subreaper();
    let d = daemon(&Setup {
        provider: "warm = 1",
        sessions: true,
        ..Setup::default()
    });
    let (a_dir, b_dir) = (d.cwd().join("a"), d.cwd().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let a_dir = a_dir.canonicalize().unwrap();
    let b_dir = b_dir.canonicalize().unwrap();
    let first = d.only_spare();
    let mut e = d.connect();
    let s1 = e.new_session(&a_dir, "p");
    let pid1 = pid_after(&prompt(&mut e, &s1, "one\n:pid"), "pid ");
    // The plain spare runs in the provider's cwd, not in a/: never handed to a session
    // there, and recycled as the pool moves to a/.
    assert_ne!(
        pid1, first,
        "the session in a/ took a spare started elsewhere"
    );
    assert!(
        gone_within(first, LADDER),
        "the spare started elsewhere lives on"
    );

    // The replacement: in a/, holding a session made there.
    let spare = d.only_spare_beside(&[pid1]);
    assert_eq!(process_cwd(spare), a_dir, "the spare was not started in a/");
    let ahead = made_ahead(&d);
    assert_eq!(ahead.len(), 1, "{ahead:?}");
    assert_eq!(Path::new(&ahead[0].1), a_dir, "{ahead:?}");
    let s2 = e.new_session(&a_dir, "p");
    let pid2 = pid_after(&prompt(&mut e, &s2, "two\n:pid"), "pid ");
    assert_eq!(pid2, spare, "the session for a/ did not take the spare");
    assert_eq!(
        echo_session_with(&d, "two"),
        ahead[0].0,
        "the session is not the one the spare made ahead"
    );

    // Another cwd: cold, the spare made for a/ recycled with its session.
    let spare2 = d.only_spare_beside(&[pid1, pid2]);
    let ahead2 = made_ahead(&d);
    assert_eq!(ahead2.len(), 1, "{ahead2:?}");
    let s3 = e.new_session(&b_dir, "p");
    let pid3 = pid_after(&prompt(&mut e, &s3, "three\n:pid"), "pid ");
    assert_ne!(pid3, spare2, "a session for b/ took the spare made for a/");
    assert_ne!(echo_session_with(&d, "three"), ahead2[0].0);
    assert!(gone_within(spare2, LADDER), "the spare for a/ lives on");
    let deleted = eventually(SETTLE, || !echo_sessions(&d).contains_key(&ahead2[0].0));
    assert!(deleted, "the recycled spare's session was not deleted");

    // The pool follows b/.
    let spare3 = d.only_spare_beside(&[pid1, pid2, pid3]);
    assert_eq!(process_cwd(spare3), b_dir);
    let ahead3 = made_ahead(&d);
    assert_eq!(ahead3.len(), 1, "{ahead3:?}");
    assert_eq!(Path::new(&ahead3[0].1), b_dir, "{ahead3:?}");
    let s4 = e.new_session(&b_dir, "p");
    let pid4 = pid_after(&prompt(&mut e, &s4, "four\n:pid"), "pid ");
    assert_eq!(pid4, spare3);
    assert_eq!(echo_session_with(&d, "four"), ahead3[0].0);
}

/// Other params (here an MCP server list) for the same cwd are another session: the spare's
/// is not handed over.
#[test]
fn a_spare_session_is_not_handed_to_other_params() {
    subreaper();
    let d = daemon(&Setup {
        provider: "warm = 1",
        sessions: true,
        ..Setup::default()
    });
    let first = d.only_spare();
    let mut e = d.connect();
    let s1 = e.new_session(d.cwd(), "p");
    let pid1 = pid_after(&prompt(&mut e, &s1, ":pid"), "pid ");
    assert_eq!(pid1, first);
    let spare = d.only_spare_beside(&[pid1]);
    let ahead = made_ahead(&d);
    assert_eq!(ahead.len(), 1, "{ahead:?}");
    let other = json!({"cwd": d.cwd(), "mcpServers": [{
        "name": "x", "command": "/bin/true", "args": [], "env": []
    }]});
    let s2 = e.ok("session/new", other)["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let pid2 = pid_after(&prompt(&mut e, &s2, "other\n:pid"), "pid ");
    assert_ne!(pid2, spare, "a session with other params took the spare");
    assert_ne!(echo_session_with(&d, "other"), ahead[0].0);
}

/// A client that goes away while its session streams (acpd's writes to it fail): the session
/// detaches, and once attached again it is really attached, its calls answered.
#[test]
fn a_session_detached_mid_stream_is_usable_once_attached_again() {
    subreaper();
    let d = daemon(&Setup::default());
    for round in 0..2 {
        let mut a = d.connect();
        let sid = a.new_session(d.cwd(), "p");
        a.send_prompt(&sid, ":pid\n:timed 20 100 20");
        let pid = pid_after(&a.until_chunk(&sid, "pid "), "pid ");
        a.until_chunk(&sid, "t=");
        drop(a);
        d.session_in(&sid, "detached");
        let mut b = d.connect();
        let loaded = b.call("session/load", load_params(&sid, d.cwd()));
        assert!(loaded.get("error").is_none(), "round {round}: {loaded}");
        // The old turn streams on for about 0.4 s; then the echo takes a prompt.
        let deadline = Instant::now() + SETTLE;
        let answer = loop {
            let id = b.send_prompt(&sid, ":pid");
            let Some(answer) = answer_within(&mut b, id, SETTLE) else {
                panic!(
                    "round {round}: a prompt to the re-attached session was never answered; \
                     acpd runs: {:?}; log: {}",
                    d.sessions(),
                    d.log()
                );
            };
            let busy = answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("in progress"));
            if !busy || Instant::now() >= deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        assert!(b.chunk_text(&sid).contains(&format!("pid {pid}\n")));
    }
}

/// The answer to request `id` within `timeout`, else None (lines before it kept in `seen`).
fn answer_within(raw: &mut Raw, id: u64, timeout: Duration) -> Option<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = raw.next_within(left)?;
        if line.is_response() && line.value["id"] == json!(id) {
            return Some(line.value);
        }
        raw.seen.push(line);
    }
}

/// A client that stops taking acpd's output (it shuts its reading side: acpd's next write fails)
/// while its session streams, still connected for writing: the session detaches, and once
/// attached again elsewhere it is really attached, its calls answered.
#[test]
fn a_session_whose_client_stops_reading_mid_stream_is_usable_once_attached_again() {
    use std::io::{BufRead, BufReader, Write};
    subreaper();
    let d = daemon(&Setup::default());
    for round in 0..2 {
        let stream = std::os::unix::net::UnixStream::connect(&d.socket).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut w = &stream;
        let mut read_until = |pred: &dyn Fn(&Value) -> bool| loop {
            let mut line = String::new();
            assert!(reader.read_line(&mut line).unwrap() > 0, "acpd hung up");
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if pred(&v) {
                return v;
            }
        };
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}});
        writeln!(w, "{init}").unwrap();
        read_until(&|v| v["id"] == 1);
        let new = json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
            "params": {"cwd": d.cwd(), "mcpServers": []}});
        writeln!(w, "{new}").unwrap();
        let sid = read_until(&|v| v["id"] == 2)["result"]["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        let p = json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
            "params": {"sessionId": sid, "prompt": [{"type": "text", "text": ":pid\n:timed 20 100 20"}]}});
        writeln!(w, "{p}").unwrap();
        let chunk = |v: &Value| {
            v["params"]["update"]["content"]["text"]
                .as_str()
                .map(str::to_string)
        };
        let pid_line = read_until(&|v| chunk(v).is_some_and(|t| t.starts_with("pid ")));
        let pid = pid_after(&chunk(&pid_line).unwrap(), "pid ");
        stream.shutdown(std::net::Shutdown::Read).unwrap();
        d.session_in(&sid, "detached");
        drop(reader);
        drop(stream);

        let mut b = d.connect();
        let loaded = b.call("session/load", load_params(&sid, d.cwd()));
        assert!(loaded.get("error").is_none(), "round {round}: {loaded}");
        let deadline = Instant::now() + SETTLE;
        let answer = loop {
            let id = b.send_prompt(&sid, ":pid");
            let Some(answer) = answer_within(&mut b, id, SETTLE) else {
                panic!(
                    "round {round}: a prompt to the re-attached session was never answered; \
                     acpd runs: {:?}; log: {}",
                    d.sessions(),
                    d.log()
                );
            };
            let busy = answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("in progress"));
            if !busy || Instant::now() >= deadline {
                break answer;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        assert!(b.chunk_text(&sid).contains(&format!("pid {pid}\n")));
    }
}

/// A re-attach refused for the connection's session limit leaves the session detached, and a
/// later re-attach from a connection with room is really attached, its calls answered.
#[test]
fn a_reattach_refused_at_the_session_limit_leaves_the_session_attachable() {
    subreaper();
    let d = daemon(&Setup {
        top: "max_sessions_per_connection = 1",
        ..Setup::default()
    });
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    let pid = pid_after(&prompt(&mut a, &sid, ":pid"), "pid ");
    drop(a);
    d.session_in(&sid, "detached");
    let mut b = d.connect();
    let other = b.new_session(d.cwd(), "p");
    let refused = b.call("session/load", load_params(&sid, d.cwd()));
    assert_eq!(refused["error"]["data"]["code"], "LIMIT", "{refused}");
    let entry = d.session_in(&sid, "detached");
    assert_eq!(entry["pid"].as_i64(), Some(pid as i64), "{entry}");
    assert_eq!(prompt(&mut b, &other, "mine"), "mine");
    let mut c = d.connect();
    let loaded = c.call("session/load", load_params(&sid, d.cwd()));
    assert!(loaded.get("error").is_none(), "{loaded}");
    let id = c.send_prompt(&sid, ":pid");
    let Some(answer) = answer_within(&mut c, id, SETTLE) else {
        panic!(
            "a prompt to the re-attached session was never answered; acpd runs: {:?}; log: {}",
            d.sessions(),
            d.log()
        );
    };
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(pid_after(&c.chunk_text(&sid), "pid "), pid);
}

/// `acpd status` and `acpd runs` ask the daemon, not an agent: they start no child (a status
/// query must not spawn a heavy agent, nor take a slot a warm spare or a session needs). A
/// session does start one (so the count is seen to work).
#[test]
fn a_status_query_starts_no_agent() {
    let d = daemon(&Setup {
        count_spawns: true,
        ..Setup::default()
    });
    let spawns = || {
        std::fs::read_to_string(d.env.path().join("spawns"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    d.status();
    d.cli_json(&["runs"]);
    assert_eq!(
        spawns(),
        0,
        "status queries started agents; log: {}",
        d.log()
    );
    let mut a = d.connect();
    let sid = a.new_session(d.cwd(), "p");
    assert_eq!(prompt(&mut a, &sid, "hi"), "hi");
    assert!(spawns() >= 1, "the spawn count does not count");
}
