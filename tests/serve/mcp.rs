#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic
//! `acpd mcp` end to end: an MCP client from the official Rust SDK (`rmcp`) drives the real
//! binary over stdio — `delegate` to the echo agent, parallel runs, follow-ups, progress
//! notifications, cancellation, every error path — with the runs in the `acpd mcp` process
//! and through a running `acpd serve`, where they show in `acpd status` and `acpd runs`.
//! Every test ends with no process of its own left.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, ProgressNotificationParam, Request,
    ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestHandle, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

/// Records every progress notification.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }
}

/// A running `acpd mcp` and the client connected to it.
struct Mcp {
    client: Option<RunningService<RoleClient, Recorder>>,
    child: tokio::process::Child,
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    log: PathBuf,
}

impl Drop for Mcp {
    fn drop(&mut self) {
        // A failed test must not leave it behind: SIGTERM disposes its runs.
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
}

impl Mcp {
    async fn spawn(env: &Env, args: &[&str]) -> Mcp {
        let log = env.path().join(format!("mcp-{}.log", next_id()));
        let mut cmd = env.acpd();
        cmd.arg("mcp")
            .args(args)
            .env("ACPD_LOG", "info")
            .env_remove("ACPD_SOCKET")
            .env("XDG_RUNTIME_DIR", env.path().join("no-runtime-dir"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = tokio::process::Command::from(cmd).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take().unwrap();
        let recorder = Recorder::default();
        let progress = recorder.progress.clone();
        let client = recorder.serve((stdout, stdin)).await.unwrap();
        Mcp {
            client: Some(client),
            child,
            progress,
            log,
        }
    }

    fn client(&self) -> &RunningService<RoleClient, Recorder> {
        self.client.as_ref().unwrap()
    }

    fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn params(tool: &str, args: Value) -> CallToolRequestParams {
        CallToolRequestParams::new(tool.to_string())
            .with_arguments(args.as_object().cloned().unwrap())
    }

    async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        self.client()
            .call_tool(Self::params(tool, args))
            .await
            .unwrap_or_else(|e| panic!("{tool} failed: {e}\n{}", self.log()))
    }

    /// A call whose handle can be cancelled; its progress token names its notifications.
    async fn call_cancellable(&self, tool: &str, args: Value) -> RequestHandle<RoleClient> {
        let request = ClientRequest::CallToolRequest(Request::new(Self::params(tool, args)));
        self.client()
            .send_cancellable_request(request, PeerRequestOptions::no_options())
            .await
            .unwrap()
    }

    fn progress_of(&self, handle: &RequestHandle<RoleClient>) -> Vec<ProgressNotificationParam> {
        self.progress
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.progress_token == handle.progress_token)
            .cloned()
            .collect()
    }

    /// The client disconnects; `acpd mcp` disposes everything and exits 0.
    async fn close(mut self) {
        let client = self.client.take().unwrap();
        let _ = client.cancel().await;
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("acpd mcp did not exit after its client disconnected")
            .unwrap();
        assert!(status.success(), "acpd mcp exited {status}\n{}", self.log());
    }
}

/// A number of its own for each `acpd mcp` of this test binary (its log file).
fn next_id() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("")
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().unwrap_or(Value::Null)
}

fn is_error(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
}

/// A tool error with this stable name and code, and a hint on what to do.
fn assert_typed(r: &CallToolResult, name: &str, code: i64) {
    let s = structured(r);
    assert!(is_error(r), "not a tool error: {s}");
    assert_eq!(s["error"]["name"], name, "{s}");
    assert_eq!(s["error"]["code"], code, "{s}");
    assert!(!s["error"]["hint"].as_str().unwrap_or("").is_empty(), "{s}");
    assert!(text(r).starts_with(name), "{}", text(r));
}

/// The processes whose parent is `pid`, acpd's sentinel aside.
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …; comm may hold spaces, so read after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        // acpd's sentinel (one per acpd) is not part of any run's tree.
        let sentinel = std::fs::read(format!("/proc/{child}/cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"sentinel".as_slice()));
        if ppid == Some(pid) && !sentinel {
            out.push(child);
        }
    }
    out
}

fn all_gone(pids: &[i32]) -> bool {
    eventually(Duration::from_secs(15), || pids.iter().all(|p| !exists(*p)))
}

/// A config with the `fast` echo provider (see common), described, and a broken one.
fn env() -> Env {
    Env::new(&format!(
        "[providers.broken]\ncommand = [\"{}\"]\ndescription = \"An agent that is not installed\"\n",
        "/nonexistent/acpd-test-agent"
    ))
}

fn prompt_pid(extra: &str) -> String {
    format!(":pid\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_runs_one_subagent_to_the_end() {
    let env = env();
    let mcp = Mcp::spawn(&env, &["--in-process"]).await;

    let tools = mcp.client().list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for want in [
        "delegate",
        "subagent_start",
        "subagent_wait",
        "subagent_send",
        "subagent_cancel",
        "subagent_dispose",
        "subagent_list",
        "providers",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    let delegate = tools.iter().find(|t| t.name == "delegate").unwrap();
    let description = delegate.description.as_deref().unwrap();
    for provider in [
        "echo (default)",
        "fast",
        "broken: An agent that is not installed",
    ] {
        assert!(description.contains(provider), "{description}");
    }
    assert_eq!(
        delegate.input_schema["properties"]["provider"]["enum"],
        json!(["broken", "echo", "fast"])
    );
    assert_eq!(delegate.input_schema["required"], json!(["prompt"]));

    let r = mcp.call("delegate", json!({"prompt": "hello"})).await;
    assert!(!is_error(&r), "{r:?}");
    assert_eq!(text(&r), "hello");
    let s = structured(&r);
    assert_eq!(s["stopReason"], "completed");
    assert_eq!(s["provider"], "echo");
    assert_eq!(s["text"], "hello");

    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let r = mcp
        .call(
            "delegate",
            json!({"provider": "fast", "prompt": "{\"n\": 3}", "outputSchema": schema, "label": "json"}),
        )
        .await;
    assert!(!is_error(&r), "{r:?}");
    assert_eq!(structured(&r)["structured"], json!({"n": 3}));

    // The output does not fit the schema: an honest error, not a success.
    let r = mcp
        .call(
            "delegate",
            json!({"provider": "fast", "prompt": "{\"n\": \"three\"}", "outputSchema": schema}),
        )
        .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["failure"]["category"], "output-schema");

    // delegate keeps nothing.
    let list = mcp.call("subagent_list", json!({})).await;
    assert_eq!(structured(&list)["runs"], json!([]), "{list:?}");
    let providers = mcp.call("providers", json!({})).await;
    let p = &structured(&providers)["providers"];
    assert_eq!(p.as_array().unwrap().len(), 3, "{p}");
    assert!(children_of(mcp.pid()).is_empty());
    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_runs_and_a_follow_up() {
    let env = env();
    let mcp = Mcp::spawn(&env, &["--in-process"]).await;
    parallel_and_follow_up(&mcp, |_| {}).await;
    mcp.close().await;
}

/// Three runs at once, each collected by its own `subagent_wait`, then a follow-up turn on
/// one, a busy send, a cancel and disposal. `during` sees the three runs' ids while they run.
async fn parallel_and_follow_up(mcp: &Mcp, during: impl FnOnce(&[String])) {
    let began = Instant::now();
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = mcp
            .call(
                "subagent_start",
                json!({"provider": "fast", "prompt": format!(":sleep 1500\nrun {i}"), "label": format!("part-{i}")}),
            )
            .await;
        assert!(!is_error(&r), "{r:?}");
        let s = structured(&r);
        assert!(s["sessionId"].is_string(), "{s}");
        ids.push(s["runId"].as_str().unwrap().to_string());
    }
    let list = structured(&mcp.call("subagent_list", json!({})).await);
    assert_eq!(list["runs"].as_array().unwrap().len(), 3, "{list}");
    for run in list["runs"].as_array().unwrap() {
        assert!(run["label"].as_str().unwrap().starts_with("part-"), "{run}");
    }
    during(&ids);
    let waits = ids
        .iter()
        .map(|id| mcp.call("subagent_wait", json!({"runId": id})));
    let results = futures::future::join_all(waits).await;
    // Three 1.5 s turns, in parallel.
    assert!(
        began.elapsed() < Duration::from_millis(4000),
        "{:?}",
        began.elapsed()
    );
    for (i, r) in results.iter().enumerate() {
        assert!(!is_error(r), "{r:?}");
        assert_eq!(text(r), format!("run {i}"));
        assert_eq!(structured(r)["turn"], 1);
    }

    // A follow-up on the kept-alive child.
    let sent = mcp
        .call("subagent_send", json!({"runId": ids[0], "prompt": "again"}))
        .await;
    assert!(!is_error(&sent), "{sent:?}");
    assert_eq!(structured(&sent)["turn"], 2);
    let r = mcp.call("subagent_wait", json!({"runId": ids[0]})).await;
    assert_eq!(text(&r), "again");
    assert_eq!(structured(&r)["turn"], 2);

    // A send while a turn runs is RUN_BUSY; a cancel ends that turn as aborted.
    let sent = mcp
        .call("subagent_send", json!({"runId": ids[1], "prompt": ":hang"}))
        .await;
    assert!(!is_error(&sent), "{sent:?}");
    let busy = mcp
        .call("subagent_send", json!({"runId": ids[1], "prompt": "more"}))
        .await;
    assert_typed(&busy, "RUN_BUSY", -33009);
    let cancelled = mcp.call("subagent_cancel", json!({"runId": ids[1]})).await;
    assert!(!is_error(&cancelled), "{cancelled:?}");
    let r = mcp.call("subagent_wait", json!({"runId": ids[1]})).await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["stopReason"], "aborted");
    assert!(text(&r).contains("stopReason aborted"), "{}", text(&r));

    for id in &ids {
        let r = mcp.call("subagent_dispose", json!({"runId": id})).await;
        assert!(!is_error(&r), "{r:?}");
    }
    let list = structured(&mcp.call("subagent_list", json!({})).await);
    assert_eq!(list["runs"], json!([]));
    let r = mcp.call("subagent_wait", json!({"runId": ids[0]})).await;
    assert_typed(&r, "RUN_ENDED", -33010);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_cancellation() {
    let env = env();
    let mcp = Mcp::spawn(&env, &["--in-process"]).await;

    // Progress while the child streams, strictly increasing, saying what came.
    let handle = mcp
        .call_cancellable(
            "delegate",
            json!({"provider": "fast", "prompt": ":timed 4 8 300"}),
        )
        .await;
    let token = handle.progress_token.clone();
    let response = handle.await_response().await.unwrap();
    let ServerResult::CallToolResult(r) = response else {
        panic!("{response:?}")
    };
    assert!(!is_error(&r), "{r:?}");
    let progress: Vec<_> = mcp
        .progress
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.progress_token == token)
        .cloned()
        .collect();
    assert!(progress.len() >= 3, "{progress:?}");
    assert!(progress.windows(2).all(|w| w[0].progress < w[1].progress));
    assert!(
        progress.iter().any(|p| p
            .message
            .as_deref()
            .unwrap_or("")
            .contains("bytes of output")),
        "{progress:?}"
    );

    // An MCP cancellation of `delegate` cancels the child, which goes with its tree.
    let handle = mcp
        .call_cancellable(
            "delegate",
            json!({"provider": "fast", "prompt": prompt_pid(":hang")}),
        )
        .await;
    let mut pid = None;
    assert!(
        eventually_async(Duration::from_secs(10), || {
            pid = mcp.progress_of(&handle).iter().find_map(|p| {
                let m = p.message.as_deref()?;
                m.split("last: pid ").nth(1)?.trim().parse::<i32>().ok()
            });
            pid.is_some()
        })
        .await,
        "no progress named the child's pid: {:?}",
        mcp.progress_of(&handle)
    );
    let pid = pid.unwrap();
    assert!(exists(pid));
    handle
        .cancel(Some("the user pressed Esc".into()))
        .await
        .unwrap();
    assert!(
        all_gone(&[pid]),
        "the cancelled delegate's child {pid} survived"
    );
    // The cancelled delegate's run is disposed once its tree is gone, which the tool call's
    // end does not wait for.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let list = loop {
        let list = structured(&mcp.call("subagent_list", json!({})).await);
        if list["runs"] == json!([]) || std::time::Instant::now() >= deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(list["runs"], json!([]), "{list}");

    // Cancelling a subagent_wait cancels the run's turn; the run stays for more.
    let started = mcp
        .call(
            "subagent_start",
            json!({"provider": "fast", "prompt": ":hang"}),
        )
        .await;
    let run_id = structured(&started)["runId"].as_str().unwrap().to_string();
    let handle = mcp
        .call_cancellable("subagent_wait", json!({"runId": run_id}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.cancel(None).await.unwrap();
    let r = mcp.call("subagent_wait", json!({"runId": run_id})).await;
    assert_eq!(structured(&r)["stopReason"], "aborted", "{r:?}");
    let again = mcp
        .call(
            "subagent_send",
            json!({"runId": run_id, "prompt": "still here"}),
        )
        .await;
    assert!(!is_error(&again), "{again:?}");
    let r = mcp.call("subagent_wait", json!({"runId": run_id})).await;
    assert_eq!(text(&r), "still here");
    mcp.close().await;
}

async fn eventually_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_typed_and_says_what_to_do() {
    let env = env();
    let mcp = Mcp::spawn(&env, &["--in-process"]).await;
    every_error(&mcp).await;
    mcp.close().await;
}

async fn every_error(mcp: &Mcp) {
    let r = mcp
        .call("delegate", json!({"provider": "nope", "prompt": "x"}))
        .await;
    assert_typed(&r, "NO_PROVIDER", -33001);
    assert!(text(&r).contains("echo, fast"), "{}", text(&r));

    for bad in [
        json!({}),
        json!({"prompt": 3}),
        json!({"prompt": "x", "bogus": 1}),
        json!({"prompt": "  "}),
        json!({"prompt": "x", "outputSchema": "not an object"}),
    ] {
        let r = mcp.call("delegate", bad.clone()).await;
        assert_typed(&r, "INVALID_REQUEST", -33012);
    }
    let r = mcp.call("subagent_wait", json!({})).await;
    assert_typed(&r, "INVALID_REQUEST", -33012);
    let r = mcp.call("subagent_list", json!({"x": 1})).await;
    assert_typed(&r, "INVALID_REQUEST", -33012);
    let r = mcp
        .call(
            "delegate",
            json!({"prompt": "x", "cwd": "/nonexistent/dir"}),
        )
        .await;
    assert_typed(&r, "INVALID_CWD", -33004);
    let r = mcp
        .call(
            "delegate",
            json!({"prompt": "x", "outputSchema": {"$ref": "https://example.com/s.json"}}),
        )
        .await;
    assert_typed(&r, "UNSUPPORTED_SCHEMA", -33003);
    let r = mcp
        .call("delegate", json!({"provider": "broken", "prompt": "x"}))
        .await;
    assert_typed(&r, "START_FAILED", -33007);

    for tool in ["subagent_wait", "subagent_cancel", "subagent_dispose"] {
        let r = mcp.call(tool, json!({"runId": "no-such-run"})).await;
        assert_typed(&r, "UNKNOWN_RUN", -33008);
    }
    let r = mcp
        .call(
            "subagent_send",
            json!({"runId": "no-such-run", "prompt": "x"}),
        )
        .await;
    assert_typed(&r, "UNKNOWN_RUN", -33008);

    // A tool that does not exist is a protocol error.
    let e = mcp
        .client()
        .call_tool(Mcp::params("rm_rf", json!({})))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("subagent_start"), "{e}");

    // A child that fails: a tool error with the stop reason, the diagnostic, the partial
    // output, and the facts in structured content.
    let r = mcp
        .call(
            "delegate",
            json!({"provider": "fast", "prompt": "partial\n:crash 3"}),
        )
        .await;
    assert!(is_error(&r));
    let s = structured(&r);
    assert_eq!(s["stopReason"], "error", "{s}");
    assert_eq!(s["failure"]["category"], "process-exit");
    assert_eq!(s["failure"]["exitCode"], 3);
    let t = text(&r);
    assert!(t.contains("stopReason error"), "{t}");
    assert!(t.contains("exit code: 3"), "{t}");
    assert!(t.contains("partial\n"), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_and_sigterm_leave_no_process() {
    let env = env();
    // The client goes away mid-run.
    let mcp = Mcp::spawn(&env, &["--in-process"]).await;
    for _ in 0..2 {
        let r = mcp
            .call(
                "subagent_start",
                json!({"provider": "fast", "prompt": ":grandchild\n:hang"}),
            )
            .await;
        assert!(!is_error(&r), "{r:?}");
    }
    assert!(
        eventually(Duration::from_secs(10), || descendants(mcp.pid()).len()
            >= 4),
        "two children and their grandchildren: {:?}",
        descendants(mcp.pid())
    );
    let tree = descendants(mcp.pid());
    mcp.close().await;
    assert!(all_gone(&tree), "survivors of a disconnect: {tree:?}");

    // SIGTERM with a delegate in flight and a started run.
    let mcp = Mcp::spawn(&env, &["--in-process"]).await;
    let r = mcp
        .call(
            "subagent_start",
            json!({"provider": "fast", "prompt": ":hang"}),
        )
        .await;
    assert!(!is_error(&r));
    let _pending = mcp
        .call_cancellable("delegate", json!({"provider": "fast", "prompt": ":hang"}))
        .await;
    assert!(
        eventually(Duration::from_secs(10), || children_of(mcp.pid()).len()
            >= 2),
        "{:?}",
        children_of(mcp.pid())
    );
    let tree = descendants(mcp.pid());
    let mut mcp = mcp;
    kill(Pid::from_raw(mcp.pid()), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), mcp.child.wait())
        .await
        .expect("acpd mcp did not exit on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}\n{}", mcp.log());
    assert!(all_gone(&tree), "survivors of SIGTERM: {tree:?}");
}

/// Every process below `pid`.
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for c in children_of(p) {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

fn socket_arg<E: std::borrow::Borrow<Env>>(d: &Daemon<E>) -> [&str; 2] {
    ["--socket", d.socket.to_str().unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_running_daemon_the_runs_show_in_status() {
    let env = env();
    let daemon = Daemon::start(&env);
    let mcp = Mcp::spawn(&env, &socket_arg(&daemon)).await;
    assert!(
        mcp.log().contains("runs live in the acpd daemon"),
        "{}",
        mcp.log()
    );
    // The tools describe the daemon's providers.
    let tools = mcp.client().list_all_tools().await.unwrap();
    let delegate = tools.iter().find(|t| t.name == "delegate").unwrap();
    assert!(
        delegate
            .description
            .as_deref()
            .unwrap()
            .contains("broken: An agent")
    );

    // The daemon has no caller directory over a socket: acpd mcp's own is used.
    let r = mcp.call("delegate", json!({"prompt": "hello\n:cwd"})).await;
    assert!(!is_error(&r), "{r:?}");
    let cwd = std::fs::canonicalize(env.path()).unwrap();
    assert_eq!(text(&r).trim_end(), format!("hello\ncwd {}", cwd.display()));

    // Three parallel runs, visible to the operator while they run.
    parallel_and_follow_up(&mcp, |ids| {
        let status = daemon.cli_json(&["status"]);
        assert_eq!(status["runs"], 3, "{status}");
        let runs = daemon.cli_json(&["runs"]);
        let listed: Vec<&str> = runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["runId"].as_str().unwrap())
            .collect();
        for id in ids {
            assert!(listed.contains(&id.as_str()), "{runs}");
        }
        assert!(
            runs["runs"].as_array().unwrap().iter().all(|r| r["label"]
                .as_str()
                .unwrap()
                .starts_with("part-")
                && r["pid"].is_i64()),
            "{runs}"
        );
    })
    .await;

    // Progress ticks while the daemon's child works.
    let handle = mcp
        .call_cancellable(
            "delegate",
            json!({"provider": "fast", "prompt": ":sleep 1500\ndone"}),
        )
        .await;
    let token = handle.progress_token.clone();
    let ServerResult::CallToolResult(r) = handle.await_response().await.unwrap() else {
        panic!()
    };
    assert_eq!(text(&r), "done");
    let ticks = mcp
        .progress
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.progress_token == token)
        .count();
    assert!(ticks >= 2, "{ticks}");

    // An MCP cancellation cancels the daemon's run, whose child goes.
    let handle = mcp
        .call_cancellable(
            "delegate",
            json!({"provider": "fast", "prompt": ":hang", "label": "doomed"}),
        )
        .await;
    let mut pid = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            let runs = daemon.cli_json(&["runs"]);
            pid = runs["runs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["label"] == "doomed")
                .and_then(|r| r["pid"].as_i64());
            pid.is_some()
        }),
        "the run never showed in acpd runs"
    );
    let pid = pid.unwrap() as i32;
    handle.cancel(None).await.unwrap();
    assert!(all_gone(&[pid]), "the cancelled run's child {pid} survived");
    assert!(eventually(Duration::from_secs(10), || {
        daemon.cli_json(&["status"])["runs"] == 0
    }));

    every_error(&mcp).await;

    // Disconnecting disposes the connection's runs in the daemon.
    let r = mcp
        .call(
            "subagent_start",
            json!({"provider": "fast", "prompt": ":hang", "label": "left"}),
        )
        .await;
    assert!(!is_error(&r));
    let runs = daemon.cli_json(&["runs"]);
    let left = runs["runs"][0]["pid"].as_i64().unwrap() as i32;
    mcp.close().await;
    assert!(all_gone(&[left]), "a run left by a gone client survived");
    assert!(eventually(Duration::from_secs(10), || {
        daemon.cli_json(&["status"])["runs"] == 0
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_daemon_runs_live_in_process() {
    let env = env();
    // A socket named but nobody there: in-process, said on stderr.
    let missing = env.path().join("nobody.sock");
    let mcp = Mcp::spawn(&env, &["--socket", missing.to_str().unwrap()]).await;
    let r = mcp.call("delegate", json!({"prompt": "local"})).await;
    assert_eq!(text(&r), "local");
    assert!(
        mcp.log().contains("runs live in this process"),
        "{}",
        mcp.log()
    );
    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_goes_away_is_reported_then_found_again() {
    let env = env();
    let daemon = Daemon::start(&env);
    let mcp = Mcp::spawn(&env, &socket_arg(&daemon)).await;
    let r = mcp.call("delegate", json!({"prompt": "one"})).await;
    assert_eq!(text(&r), "one");
    drop(daemon);
    let r = mcp.call("subagent_list", json!({})).await;
    assert_typed(&r, "DAEMON_GONE", -32603);
    assert!(text(&r).contains("acpd serve"), "{}", text(&r));
    let daemon = Daemon::start(&env);
    let r = mcp.call("delegate", json!({"prompt": "two"})).await;
    assert_eq!(text(&r), "two", "{r:?}");
    // acpd mcp's one connection, and the query's own.
    assert_eq!(daemon.cli_json(&["status"])["connections"], 2);
    mcp.close().await;
}

/// Lines an MCP client may send that rmcp alone drops or answers without an id: each gets a
/// JSON-RPC error with the request's id (null when it has none), in order, and the server
/// still answers the next good request.
#[test]
fn every_unusable_line_gets_an_error_with_its_id() {
    use std::io::{BufRead, BufReader, Write};
    let env = env();
    let mut child = env
        .acpd()
        .args(["mcp", "--in-process"])
        .env_remove("ACPD_SOCKET")
        .env("XDG_RUNTIME_DIR", env.path().join("no-runtime-dir"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let _ = tx.send(serde_json::from_str(&line).unwrap_or(json!({ "raw": line })));
        }
    });
    let next = || {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("acpd mcp did not answer a line (it was dropped)")
    };
    let mut send = |line: &str| {
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    };
    send(
        &json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": { "name": "t", "version": "1" } } })
        .to_string(),
    );
    assert_eq!(next()["id"], 1);
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    send("this is not json");
    let v = next();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(
        v.as_object().unwrap().contains_key("id") && v["id"].is_null(),
        "{v}"
    );

    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"subagent_list","arguments":{{"x":{}{}}}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    send(&deep);
    let v = next();
    assert_eq!(
        (v["id"].clone(), v["error"]["code"].clone()),
        (json!(7), json!(-32600)),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nested deeper"),
        "{v}"
    );

    send(r#"{"jsonrpc":"2.0","id":"eight","method":"tools/call","params":[1]}"#);
    let v = next();
    assert_eq!(v["id"], "eight", "{v}");
    assert!(v["error"]["code"].is_i64(), "{v}");

    // Hostile review of issue 18: arguments that are not an object were answered -32601
    // (method not found), for a method the server has.
    for (n, args) in ["5", "\"x\"", "[1]", "true"].iter().enumerate() {
        send(&format!(
            r#"{{"jsonrpc":"2.0","id":"a{n}","method":"tools/call","params":{{"name":"subagent_list","arguments":{args}}}}}"#
        ));
        let v = next();
        assert_eq!(v["id"], format!("a{n}"), "{v}");
        assert_eq!(v["error"]["code"], -32602, "arguments {args}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("tools/call"),
            "{v}"
        );
    }

    send(r#"{"foo":"bar"}"#);
    let v = next();
    assert!(
        v.as_object().unwrap().contains_key("id") && v["id"].is_null(),
        "{v}"
    );
    assert_eq!(v["error"]["code"], -32600, "{v}");

    send(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#);
    let v = next();
    assert_eq!(v["id"], 9, "{v}");
    assert!(v["result"]["tools"].is_array(), "{v}");

    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "acpd mcp did not exit at EOF");
        std::thread::sleep(Duration::from_millis(20));
    }
}
