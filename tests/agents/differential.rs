#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! The differential harness of issue 19: an editor cannot tell acpd from the agent.
//!
//! For each agent people run — claude-agent-acp 0.101, codex-acp 2.6, gemini-cli 0.61
//! (`--acp`), opencode 1.18 (`acp`), pinned in tests/interop/package.json — the official
//! TypeScript SDK's client runs one ACP sequence (tests/interop/agents.mjs: initialize,
//! authenticate, new, prompt, both cancels, list, load and resume of an open and of a closed
//! session, fork, set_mode / set_model / set_config_option, close, delete of a known and an
//! unknown id, an unknown `_` method, logout, the agent's stderr; then, on connections of
//! their own, a session loaded after the agent — or acpd, with `warm = 1` — was started again)
//! directly against the agent, through `acpd stdio` and through `acpd serve` + `acpd connect`,
//! all offline against tests/interop/mock-model.mjs; for claude and codex also over acpd's
//! network face (issue 31), by the SDK's Streamable HTTP client (`https`) and its WebSocket
//! client (`wss`). A fifth agent, the scripted child `acpd agent echo` (run directly too), adds
//! what the real agents do not do on demand: an elicitation/create round trip (the editor
//! advertises elicitation and accepts with content), elicitation/complete and
//! `$/cancel_request` from the agent to the editor. Answers are compared after normalizing
//! session ids, timestamps and `_meta.acpd` away; the per-agent table (method → same / differs
//! / not offered) is printed.
//!
//! Any difference fails the test unless it is in [`KNOWN`]: the differences acpd is known to
//! have today, each with its cause. That list is the to-do list of issue 19: a fix removes its
//! entry (an entry that no longer differs is printed as `FIXED?`).
//!
//! Skipped, printing why, when node is missing or the pinned packages are not installed and
//! `npm ci` cannot install them (no registry).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::common::remote::Cert;
use crate::node::{self, interop_dir};

const BIN: &str = env!("CARGO_BIN_EXE_acpd");

/// The packages agents.mjs runs, as pinned in package.json.
const PACKAGES: [&str; 5] = [
    "@agentclientprotocol/sdk",
    "@agentclientprotocol/claude-agent-acp",
    "@agentclientprotocol/codex-acp",
    "@google/gemini-cli",
    "opencode-ai",
];

/// Sides compared with the agent run directly, for every agent.
const SIDES: [&str; 2] = ["stdio", "serve"];

/// The network sides (issue 31), for the agents in [`NETWORK_AGENTS`]: `acpd serve --listen
/// https://127.0.0.1:0` with a certificate made here and a token from `acpd token create`,
/// reached by the TypeScript SDK's own network clients (`createHttpStream`: POST + SSE;
/// `createWebSocketStream` on `ws`) — clients nobody here wrote, on the same editor code as the
/// other sides. Only for two agents: each side runs the whole sequence with its own agents, and
/// the face below `server::serve` is the same for every agent.
const NETWORK: [&str; 2] = ["https", "wss"];
const NETWORK_AGENTS: [&str; 2] = ["claude", "codex"];

/// A difference acpd is known to have: `row` of agents.mjs differs on `sides` for `agents`.
struct Known {
    agents: &'static [&'static str],
    row: &'static str,
    sides: &'static [&'static str],
    /// What differs and where in acpd it comes from.
    why: &'static str,
    /// Differs only by timing: `same` in a run says nothing about a fix.
    racy: bool,
}

/// The differences acpd has today (measured on main, 2026-12-01). Remove an entry with the fix
/// that makes the row `same`.
const KNOWN: &[Known] = &[
    // acpd serve's children are the daemon's, shared by every connection: their stderr goes to
    // its log (`child_stderr = "log"`, serve's default) or to the daemon's own stderr, never to
    // `acpd connect`'s, which is what the editor reads. Carrying it over the socket would take
    // an acpd extension `acpd connect` writes out; `acpd stdio` forwards it (agent stderr is
    // `same` there). The echo child writes a line at start, codex-acp none (so it does not
    // differ).
    // The network sides have no process of their own for the editor to read: the same cause.
    Known {
        agents: &["claude", "gemini", "opencode", "echo"],
        row: "agent stderr",
        sides: &["serve", "https", "wss"],
        why: "serve keeps a child's stderr in the daemon's log, not on acpd connect's stderr",
        racy: false,
    },
    // gemini-cli 0.61's `session/load` starts a chat recording for the id before it looks the
    // session up, and the recording rewrites the session's file; whether the lookup then finds
    // the session ("No previous sessions found for this project" when not) depends on timing.
    // Seen both ways directly (3 of 3 refused in one run, accepted in another) and through acpd
    // (both rows `same` alone; refused through acpd while accepted directly during a loaded
    // full test run, 2026-12-07). Not settled: whether acpd's timing makes the refusal likelier.
    Known {
        agents: &["gemini"],
        row: "session/load (open)",
        sides: &["stdio", "serve"],
        why: "gemini-cli's load races its own chat recording rewriting the session file",
        racy: true,
    },
    Known {
        agents: &["gemini"],
        row: "session/load (after a restart, warm = 1)",
        sides: &["stdio", "serve"],
        why: "gemini-cli's load races its own chat recording rewriting the session file",
        racy: true,
    },
];

fn read_json(p: PathBuf) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
}

/// The packages whose installed version is not the pinned one.
fn stale() -> Vec<&'static str> {
    let dir = interop_dir();
    let pins = read_json(dir.join("package.json")).expect("tests/interop/package.json");
    PACKAGES
        .into_iter()
        .filter(|p| {
            let pinned = pins["dependencies"][*p].as_str();
            let installed = read_json(dir.join("node_modules").join(p).join("package.json"));
            pinned.is_none()
                || installed
                    .and_then(|v| v["version"].as_str().map(str::to_owned))
                    .as_deref()
                    != pinned
        })
        .collect()
}

/// `None` when node and the pinned packages are ready, else why the tests skip.
fn not_ready() -> Option<&'static str> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        if Command::new("node").arg("--version").output().is_err() {
            return Some("node is not installed".into());
        }
        if stale().is_empty() {
            return None;
        }
        match node::install() {
            Ok(()) if stale().is_empty() => None,
            Ok(()) => Some(format!(
                "the pinned agents are not installed after `npm ci` in {}",
                interop_dir().display()
            )),
            Err(why) => Some(format!("the pinned agents are not installed and {why}")),
        }
    })
    .as_deref()
}

/// Runs agents.mjs for `agent` on its sides and checks the table against [`KNOWN`];
/// the report, or `None` when it could not run (printed why).
fn differential(agent: &str) -> Option<Value> {
    if let Some(why) = not_ready() {
        eprintln!("SKIPPED: {why}, so the {agent} differential cannot run");
        return None;
    }
    let work = tempfile::tempdir().unwrap();
    let mut sides = vec!["direct"];
    sides.extend(SIDES);
    let mut node = Command::new("node");
    node.arg(interop_dir().join("agents.mjs"))
        .args(["--agent", agent, "--acpd", BIN, "--work"])
        .arg(work.path());
    if NETWORK_AGENTS.contains(&agent) {
        sides.extend(NETWORK);
        let cert = Cert::new(work.path());
        // Node reads its extra CA only at start; fetch and `ws` both trust it then.
        node.arg("--cert")
            .arg(&cert.cert)
            .arg("--key")
            .arg(&cert.key)
            .env("NODE_EXTRA_CA_CERTS", &cert.cert);
    }
    let out = node
        .args(["--sides", &sides.join(",")])
        .env_remove("ACPD_CONFIG")
        .env_remove("ACPD_DEPTH")
        .env_remove("ACPD_MAX_DEPTH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agents.mjs failed\n{stdout}\n{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}\n{stderr}"));
    eprintln!("{}", report["text"].as_str().unwrap_or(""));
    eprintln!("timings (ms): {}", report["timings"]);
    assert!(report["error"].is_null(), "the run failed: {report}");
    for side in &sides {
        let s = &report["sides"][side];
        assert!(
            s["error"].is_null(),
            "{agent} {side}: {} (exit {}, stderr tail:\n{})",
            s["error"],
            s["exit"],
            s["stderrTail"].as_str().unwrap_or("")
        );
    }
    // The agent really ran offline against the mock: otherwise "same" could mean "failed alike".
    let prompt = &report["sides"]["direct"]["rows"]["session/prompt"];
    assert_eq!(
        prompt["answer"]["stopReason"], "end_turn",
        "{agent} directly: {prompt}"
    );
    // codex-acp puts a warning about the mock's unknown model before the reply; the echo
    // child answers with the prompt itself, which the normalizer writes `<title>`.
    let text = prompt["updates"]["texts"]["agent_message_chunk"]
        .as_str()
        .unwrap_or("");
    let reply = if agent == "echo" {
        "<title>"
    } else {
        "REPLY hello differential"
    };
    assert!(text.ends_with(reply), "{agent} directly: {prompt}");

    let table = report["table"].as_object().expect("a table");
    let mut unexpected = Vec::new();
    let mut fixed = Vec::new();
    for (row, verdicts) in table {
        for &side in &sides[1..] {
            let verdict = verdicts[side].as_str().unwrap_or("missing");
            let known = KNOWN
                .iter()
                .find(|k| k.row == row && k.agents.contains(&agent) && k.sides.contains(&side));
            match (verdict, known) {
                ("differs", None) => {
                    unexpected.push(format!("{row} ({side}): {}", report["diffs"][row][side]))
                }
                ("differs", Some(k)) => eprintln!("known: {row} ({side}): {}", k.why),
                (_, Some(k)) if !k.racy => {
                    fixed.push(format!("{row} ({side}) is `{verdict}` now: {}", k.why))
                }
                _ => {}
            }
        }
    }
    for f in &fixed {
        eprintln!("FIXED? remove from KNOWN in tests/agents/differential.rs: {agent} {f}");
    }
    assert!(
        unexpected.is_empty(),
        "{agent}: through acpd the editor sees {} difference(s) not in KNOWN:\n  {}\n\n{}",
        unexpected.len(),
        unexpected.join("\n  "),
        report["text"].as_str().unwrap_or("")
    );
    Some(report)
}

#[test]
fn claude_agent_acp_through_acpd_answers_as_directly() {
    differential("claude");
}

#[test]
fn codex_acp_through_acpd_answers_as_directly() {
    differential("codex");
}

#[test]
fn gemini_cli_through_acpd_answers_as_directly() {
    differential("gemini");
}

#[test]
fn opencode_through_acpd_answers_as_directly() {
    differential("opencode");
}

/// The scripted child: elicitation both ways and `$/cancel_request` from either side, which no
/// real agent does on demand, plus the whole sequence above.
#[test]
fn scripted_echo_child_through_acpd_answers_as_directly() {
    let Some(report) = differential("echo") else {
        return;
    };
    // Each of these ran (`same`, not `not run`) and did what it is for, directly.
    for row in [
        "elicitation/create",
        "elicitation/complete",
        "$/cancel_request (agent → editor)",
        "$/cancel_request (editor → agent)",
        "session/cancel",
    ] {
        for side in SIDES {
            assert_eq!(report["table"][row][side], "same", "{row} ({side})");
        }
    }
    let rows = &report["sides"]["direct"]["rows"];
    let text = |row: &str| rows[row]["updates"]["texts"]["agent_message_chunk"].clone();
    assert_eq!(
        text("elicitation/create"),
        "reply {\"action\":\"accept\",\"content\":{\"name\":\"Ada\"}}\ndone"
    );
    assert_eq!(
        rows["elicitation/create"]["elicitations"][0]["sessionId"],
        "<S1>"
    );
    assert_eq!(
        rows["elicitation/complete"]["completes"],
        serde_json::json!([{"elicitationId": "el-1"}])
    );
    let cancelled = &rows["$/cancel_request (agent → editor)"];
    assert_eq!(
        cancelled["cancelled"],
        serde_json::json!([true]),
        "{cancelled}"
    );
    assert_eq!(
        text("$/cancel_request (agent → editor)"),
        "error -32800\ndone"
    );
    let cancelled = &rows["$/cancel_request (editor → agent)"];
    assert_eq!(cancelled["error"]["code"], -32800, "{cancelled}");
}
