#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! A real agent calls `acpd mcp`'s `delegate`: claude-agent-acp (pinned in
//! tests/interop/package.json, driving the Claude Code binary it ships), offline against
//! tests/interop/mock-model.mjs, gets `acpd mcp --in-process` in `session/new`'s `mcpServers`.
//! The prompt `DELEGATE <json>` makes the mock answer with a `ToolSearch` (Claude Code defers
//! MCP tools, unless `ENABLE_TOOL_SEARCH=false`) and then a `tool_use` of
//! `mcp__acpd__delegate`; the client allows the permission request; acpd runs the echo agent;
//! the mock's next request carries the echo's output as the `tool_result`, which the mock
//! answers `RESULT <tool result>`, the end of the client's turn.
//! tests/interop/delegate.mjs drives it and reports what the client and the mock saw; this file
//! asserts on that — directly, with the agent as `acpd stdio`'s child (depth 2), and with
//! `acpd mcp` using a running `acpd serve` (the run in `acpd runs`) — and attacks it: a depth
//! refusal, a refused permission, arguments outside the schema (Claude Code passes them on),
//! 2 MB of output, a `session/cancel` mid-run (Claude Code cancels the MCP call; the next
//! delegate still works), the client leaving, the agent or `acpd mcp` SIGKILLed while the
//! delegated child runs. Every scenario ends with no process of its tree left.
//!
//! Skipped, printing why, only when node is missing; an `npm ci` that fails is a failure.

use crate::common;
use crate::node::{self, interop_dir};

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::client::AcpClient;
use common::*;
use serde_json::{Value, json};

/// `true` when node and the pinned packages are ready (installed with `npm ci` when missing or
/// stale); `false`, with the reason printed, when node is missing.
fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if Command::new("node").arg("--version").output().is_err() {
            eprintln!("SKIPPED: node is not installed, so no real agent can call delegate");
            return false;
        }
        let dir = interop_dir();
        let read = |p: PathBuf| -> Option<Value> {
            serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
        };
        let pins = read(dir.join("package.json")).expect("tests/interop/package.json");
        let stale = pins["dependencies"]
            .as_object()
            .expect("pinned dependencies")
            .iter()
            .any(|(package, version)| {
                let installed = read(dir.join("node_modules").join(package).join("package.json"));
                installed.as_ref().map(|v| &v["version"]) != Some(version)
            });
        if stale {
            node::install().unwrap_or_else(|why| panic!("{why}"));
        }
        true
    })
}

/// One run of delegate.mjs with these arguments (after `--work DIR --acpd BIN`), or None when
/// skipped. Runs one at a time: each starts a Claude Code, and the machine may be small.
fn delegate(args: &[&str]) -> Option<Value> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    if !ready() {
        return None;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let out = Command::new("node")
        .arg(interop_dir().join("delegate.mjs"))
        .arg("--work")
        .arg(work.path())
        .args(["--acpd", BIN])
        .args(args)
        .env_remove("ACPD_CONFIG")
        .env_remove("ACPD_DEPTH")
        .env_remove("ACPD_MAX_DEPTH")
        .env_remove("ACPD_SOCKET")
        .env_remove("ENABLE_TOOL_SEARCH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "delegate.mjs failed\n{stdout}\n{stderr}"
    );
    let mut report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}\n{stderr}"));
    // What acpd logged, for a failing assertion to show (the tempdir goes away).
    let log = std::fs::read_to_string(work.path().join("agent.stderr")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    report["stderrTail"] = json!(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    eprintln!("steps (ms): {} total {}", report["steps"], report["ms"]);
    Some(report)
}

/// The `tool_result`s of the delegate tool in the last request to the model that carried one.
fn delegate_results(report: &Value) -> Vec<Value> {
    let requests = report["modelRequests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    requests
        .iter()
        .rev()
        .filter_map(|r| r["toolResults"].as_array())
        .find(|results| !results.is_empty())
        .map(|results| {
            results
                .iter()
                .filter(|r| r["name"] == "mcp__acpd__delegate")
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Everything the agent streamed as its reply text.
fn reply_text(report: &Value) -> String {
    report["updates"]
        .as_array()
        .map(|updates| {
            updates
                .iter()
                .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
                .filter_map(|u| u["content"]["text"].as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The one permission request, for the delegate tool, with the input the model gave.
fn assert_asked_once(report: &Value) {
    let asked = report["permissions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(asked.len(), 1, "{report}");
    assert_eq!(
        asked[0]["toolCall"]["title"], "mcp__acpd__delegate",
        "{report}"
    );
    assert_eq!(
        asked[0]["toolCall"]["rawInput"], report["input"],
        "{report}"
    );
    assert_eq!(asked[0]["chose"], "allow_once", "{report}");
}

/// Nothing of the run is left: not acpd's processes, not the agent's.
fn assert_nothing_left(report: &Value) {
    assert_eq!(
        report["left"],
        json!([]),
        "processes outlived the run: {report}"
    );
}

/// The completed delegation, as the model got it: Claude Code hands the model the tool's
/// `structuredContent` (the whole result) as the text; returns the echo's output.
fn completed_output(report: &Value) -> String {
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["stopReason"], "end_turn", "{report}");
    assert_eq!(report["exit"], 0, "{report}");
    assert_asked_once(report);
    let requests = report["modelRequests"].as_array().unwrap();
    assert!(
        requests.iter().any(|r| r["tools"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("mcp__acpd__delegate")))),
        "the delegate tool never reached the model: {report}"
    );
    let results = delegate_results(report);
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(results[0]["isError"], false, "{report}");
    let sent: Value = serde_json::from_str(results[0]["text"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("the tool result is not the result JSON ({e}): {report}"));
    assert_eq!(sent["stopReason"], "completed", "{sent}");
    assert_eq!(sent["provider"], "echo", "{sent}");
    let output = sent["text"].as_str().unwrap().to_owned();
    assert_eq!(output_text(&sent), output, "{sent}");
    // The model's answer to the tool result is the end of the client's turn.
    assert_eq!(
        reply_text(report),
        format!("RESULT {}", results[0]["text"].as_str().unwrap()),
        "{report}"
    );
    output
}

#[test]
fn claude_agent_acp_calls_delegate_and_the_echo_output_reaches_the_model() {
    let Some(report) = delegate(&["--via", "direct"]) else {
        return;
    };
    let output = completed_output(&report);
    // The echo agent ran (its own pid, which the mock never wrote) at depth 1, in the
    // session's directory: `acpd mcp` runs where Claude Code starts it.
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], "delegated hello", "{output}");
    let pid = pid_after(&output, "pid ");
    assert!(pid > 0 && !exists(pid), "{output}");
    assert_eq!(lines[2], "ACPD_DEPTH=1", "{output}");
    assert_eq!(
        lines[3],
        format!("cwd {}", report["project"].as_str().unwrap()),
        "{output}"
    );
    assert_nothing_left(&report);
}

#[test]
fn without_tool_search_claude_code_offers_every_acpd_tool_up_front() {
    let Some(report) = delegate(&["--via", "direct", "--tool-search", "false"]) else {
        return;
    };
    let output = completed_output(&report);
    assert!(output.starts_with("delegated hello\npid "), "{output}");
    let requests = report["modelRequests"].as_array().unwrap();
    let offered: Vec<&str> = requests
        .iter()
        .filter_map(|r| r["tools"].as_array())
        .find(|t| t.contains(&json!("mcp__acpd__delegate")))
        .unwrap()
        .iter()
        .filter_map(|t| t.as_str())
        .filter(|t| t.starts_with("mcp__acpd__"))
        .collect();
    let tools = [
        "delegate",
        "providers",
        "subagent_cancel",
        "subagent_dispose",
        "subagent_list",
        "subagent_send",
        "subagent_start",
        "subagent_wait",
    ];
    let want: Vec<String> = tools.iter().map(|t| format!("mcp__acpd__{t}")).collect();
    assert_eq!(offered, want, "{report}");
    // The model called the tool at once: no ToolSearch result in what it got back.
    for r in requests {
        let results = r["toolResults"].as_array().cloned().unwrap_or_default();
        assert!(results.iter().all(|x| x["name"] != "ToolSearch"), "{r}");
    }
    assert_nothing_left(&report);
}

#[test]
fn under_acpd_stdio_the_delegated_run_is_a_grandchild_at_depth_two() {
    let Some(report) = delegate(&["--via", "stdio"]) else {
        return;
    };
    let output = completed_output(&report);
    assert!(output.starts_with("delegated hello\npid "), "{output}");
    assert!(output.contains("\nACPD_DEPTH=2\n"), "{output}");
    assert_nothing_left(&report);
}

#[test]
fn a_depth_refusal_reaches_the_model_as_a_tool_error_with_the_hint() {
    let Some(report) = delegate(&["--via", "stdio", "--max-depth", "1"]) else {
        return;
    };
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["stopReason"], "end_turn", "{report}");
    assert_asked_once(&report);
    let results = delegate_results(&report);
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(results[0]["isError"], true, "{report}");
    let text = results[0]["text"].as_str().unwrap();
    assert!(text.starts_with("DEPTH_EXCEEDED"), "{text}");
    assert!(text.contains("do this work yourself"), "{text}");
    assert_eq!(reply_text(&report), format!("RESULT ERROR {text}"));
    assert_nothing_left(&report);
}

/// A delegated echo that runs until cancelled, so the attacks land while it runs.
const HANG: &str = r#"{"provider":"echo","prompt":"working\n:hang","label":"hang"}"#;

/// The echo the attack found running, and that it was killed as asked.
fn attacked(report: &Value, what: &str) -> i32 {
    assert_eq!(report["killed"]["what"], what, "{report}");
    assert!(report["killed"]["pid"].as_i64().is_some(), "{report}");
    assert_asked_once(report);
    report["killed"]["echo"].as_i64().unwrap() as i32
}

#[test]
fn the_client_leaving_mid_delegate_leaves_no_process_direct_or_through_acpd() {
    for via in ["direct", "stdio"] {
        let Some(report) = delegate(&["--via", via, "--input", HANG, "--kill", "stdin"]) else {
            return;
        };
        let echo = attacked(&report, "stdin");
        assert!(!exists(echo), "{via}: {report}");
        assert_eq!(report["exit"], 0, "{via}: {report}");
        assert_nothing_left(&report);
    }
}

#[test]
fn the_agent_sigkilled_mid_delegate_under_acpd_stdio_leaves_no_process() {
    let Some(report) = delegate(&["--via", "stdio", "--input", HANG, "--kill", "agent"]) else {
        return;
    };
    let echo = attacked(&report, "agent");
    // acpd answers the pending prompt `cancelled`, naming the agent's death (issue 30).
    assert_eq!(report["stopReason"], "cancelled", "{report}");
    assert_eq!(
        report["sessionEnded"]["data"]["category"], "process-exit",
        "{report}"
    );
    assert_eq!(
        report["sessionEnded"]["data"]["signal"], "SIGKILL",
        "{report}"
    );
    // The agent's own child (the Claude Code binary, holding `acpd mcp`'s stdin) is in its
    // process group: acpd's ladder for the dead agent takes it, and with it the delegated run.
    assert!(!exists(echo), "{report}");
    assert_eq!(report["exit"], 0, "{report}");
    assert_nothing_left(&report);
}

#[test]
fn acpd_mcp_sigkilled_mid_delegate_is_a_tool_error_and_its_child_dies_with_it() {
    let Some(report) = delegate(&["--via", "direct", "--input", HANG, "--kill", "mcp"]) else {
        return;
    };
    let echo = attacked(&report, "mcp");
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["stopReason"], "end_turn", "{report}");
    let results = delegate_results(&report);
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(results[0]["isError"], true, "{report}");
    assert!(!exists(echo), "{report}");
    assert_nothing_left(&report);
}

/// The bug the SIGKILL scenario above found, without node: a bridged agent that dies leaving
/// a descendant in its process group (as claude-agent-acp leaves Claude Code) — `acpd stdio`
/// must finish that group's ladder before it exits when its client then goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acpd_stdio_reaps_a_dead_bridged_agents_group_before_exiting() {
    let env = Env::raw(&format!(
        "default_provider = \"fast\"\n[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ));
    let mut client = AcpClient::spawn(&env);
    client.initialize(json!({})).await;
    let session = client.new_session(env.path(), None).await;
    let r = client.prompt(&session, ":grandchild").await;
    assert!(r.is_ok(), "{r:?}");
    let grandchild = pid_after(&client.drain_text(&session), "grandchild ");
    assert!(exists(grandchild));
    let r = client.prompt(&session, ":signal KILL").await;
    let ended = r.expect("a prompt open when its agent dies ends, not fails");
    assert_eq!(ended["stopReason"], "cancelled", "{ended}");
    assert_eq!(
        ended["_meta"]["acpd"]["sessionEnded"]["data"]["signal"], "SIGKILL",
        "{ended}"
    );
    let status = client.close().await;
    assert!(status.success(), "{status}");
    assert!(
        eventually(Duration::from_secs(5), || !exists(grandchild)),
        "the dead agent's grandchild {grandchild} outlived acpd stdio"
    );
}

#[test]
fn a_session_cancel_reaches_acpd_mcp_as_an_mcp_cancellation_and_the_next_delegate_works() {
    let again = r#"{"provider":"echo","prompt":"again"}"#;
    let Some(report) = delegate(&[
        "--via", "direct", "--input", HANG, "--cancel", "1", "--then", again,
    ]) else {
        return;
    };
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["stopReason"], "cancelled", "{report}");
    // The echo went while Claude Code and `acpd mcp` stayed: Claude Code cancelled the tool
    // call (MCP `notifications/cancelled`), and acpd cancelled and disposed the run for it.
    let c = &report["cancelled"];
    assert_eq!(c["agentAlive"], true, "{report}");
    assert_eq!(c["mcpAlive"], true, "{report}");
    assert!(!exists(c["echo"].as_i64().unwrap() as i32), "{report}");
    // The same `acpd mcp` serves the next turn's delegate.
    assert_eq!(report["second"]["stopReason"], "end_turn", "{report}");
    let results = delegate_results(&report);
    assert_eq!(results.len(), 2, "{report}");
    assert_eq!(results[0]["isError"], true, "{report}");
    assert_eq!(results[1]["isError"], false, "{report}");
    let sent: Value = serde_json::from_str(results[1]["text"].as_str().unwrap()).unwrap();
    assert_eq!(sent["text"], "again", "{sent}");
    assert_nothing_left(&report);
}

#[test]
fn a_refused_permission_starts_no_child() {
    let Some(report) = delegate(&["--via", "direct", "--input", HANG, "--permission", "reject"])
    else {
        return;
    };
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["stopReason"], "end_turn", "{report}");
    assert_eq!(report["permissions"][0]["chose"], "reject_once", "{report}");
    // A hanging echo, had one started, would have been seen.
    assert_eq!(report["echoesSeen"], json!([]), "{report}");
    let results = delegate_results(&report);
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(results[0]["isError"], true, "{report}");
    assert_nothing_left(&report);
}

#[test]
fn through_a_running_daemon_the_agents_run_shows_in_acpd_runs_and_is_cancelled_there() {
    let again = r#"{"provider":"echo","prompt":"again"}"#;
    let Some(report) = delegate(&[
        "--via", "direct", "--input", HANG, "--cancel", "1", "--then", again, "--daemon", "1",
    ]) else {
        return;
    };
    assert_eq!(report["error"], Value::Null, "{report}");
    // While the echo ran, the daemon listed it: Claude Code's delegation is one of its runs.
    let runs = report["runs"]["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(runs.len(), 1, "{report}");
    assert_eq!(runs[0]["provider"], "echo", "{report}");
    assert_eq!(runs[0]["label"], "hang", "{report}");
    assert_eq!(runs[0]["state"], "running", "{report}");
    assert_eq!(runs[0]["pid"], report["cancelled"]["echo"], "{report}");
    assert_eq!(runs[0]["depth"], 1, "{report}");
    assert_eq!(report["stopReason"], "cancelled", "{report}");
    assert_eq!(report["cancelled"]["mcpAlive"], true, "{report}");
    assert_eq!(report["second"]["stopReason"], "end_turn", "{report}");
    let results = delegate_results(&report);
    assert_eq!(results.len(), 2, "{report}");
    assert_eq!(results[1]["isError"], false, "{report}");
    // The agent gone, the daemon holds nothing of it, and stops cleanly.
    assert_eq!(report["runsAfter"]["runs"], json!([]), "{report}");
    assert_eq!(report["daemonExit"], 0, "{report}");
    assert_nothing_left(&report);
}

#[test]
fn arguments_the_schema_forbids_reach_acpd_and_come_back_as_typed_errors_with_hints() {
    // Claude Code does not check MCP tool input against the schema (an unknown provider
    // outside the enum, a number for the prompt): acpd mcp is the one that refuses.
    let Some(report) = delegate(&[
        "--via",
        "direct",
        "--input",
        r#"{"provider":"nope","prompt":"x"}"#,
        "--then",
        r#"{"prompt":42}"#,
    ]) else {
        return;
    };
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["second"]["stopReason"], "end_turn", "{report}");
    assert_eq!(report["echoesSeen"], json!([]), "{report}");
    let results = delegate_results(&report);
    assert_eq!(results.len(), 2, "{report}");
    let (first, second) = (
        results[0]["text"].as_str().unwrap(),
        results[1]["text"].as_str().unwrap(),
    );
    assert_eq!(results[0]["isError"], true, "{report}");
    assert!(first.starts_with("NO_PROVIDER"), "{first}");
    assert!(first.contains("(claude, echo)"), "{first}");
    assert_eq!(results[1]["isError"], true, "{report}");
    assert!(second.starts_with("INVALID_REQUEST"), "{second}");
    assert!(second.contains("input schema"), "{second}");
    assert_nothing_left(&report);
}

#[test]
fn two_megabytes_of_delegated_output_reach_claude_code_whole() {
    let Some(report) = delegate(&[
        "--via",
        "direct",
        "--input",
        r#"{"provider":"echo","prompt":":chunks 100 20000"}"#,
    ]) else {
        return;
    };
    assert_eq!(report["error"], Value::Null, "{report}");
    assert_eq!(report["stopReason"], "end_turn", "{report}");
    // Over its token limit Claude Code saves the result to a file and hands the model that
    // path and the result's shape: the whole result arrived, and nothing broke on the way.
    let results = delegate_results(&report);
    assert_eq!(results.len(), 1, "{report}");
    assert_eq!(results[0]["isError"], false, "{report}");
    let text = results[0]["text"].as_str().unwrap();
    eprintln!("what the model got: {text}");
    assert!(text.contains("exceeds maximum allowed tokens"), "{text}");
    // The saved file is the whole result: the echo's 100 chunks of 20000 bytes.
    let saved = report["savedResults"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(saved.len(), 1, "{}", report["savedResults"]);
    assert_eq!(
        saved[0]["textChars"], 2_000_000,
        "{}",
        report["savedResults"]
    );
    assert_nothing_left(&report);
}
