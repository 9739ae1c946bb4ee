#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! A differential test against an agent people run: claude-agent-acp (pinned in
//! tests/interop/package.json), fully offline against tests/interop/mock-model.mjs, a stand-in
//! for the Anthropic Messages API. tests/interop/differential.mjs drives one sequence with the
//! official TypeScript SDK's client (a) directly against the agent and (b) through `acpd
//! stdio`, and prints what each side answered; this file asserts on that.
//!
//! (a) checks the agent and the mock behave as (b) expects, so a failure in (b) is acpd's.
//! (b) checks acpd is transparent: what the agent advertises, the turn's updates, the listing
//! and a `session/load` in a new `acpd stdio` process, under acpd's own session id.
//!
//! Skipped, printing why, only when node is missing; an `npm ci` that fails is a failure.
//! `ACPD_REAL_AGENT_DIRECT_ONLY=1` runs (a) alone (and skips (b), saying so).

use crate::common;
use crate::node::{self, interop_dir};

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use common::BIN;
use serde_json::{Value, json};

/// The one prompt differential.mjs sends; the mock answers `REPLY <prompt>`.
const PROMPT: &str = "hello differential";
const REPLY: &str = "REPLY hello differential";
/// The title the mock gives when the agent asks for one (a background call that may not have
/// landed when the session is listed, when the agent shows the first prompt instead).
const TITLES: [&str; 2] = ["Differential session", PROMPT];
/// The kinds of one turn claude-agent-acp 0.101.0 sends for the mock's reply (two text deltas),
/// leaving out the ones it sends on its own schedule (commands, title).
const TURN: [&str; 5] = [
    "usage_update",
    "agent_message_chunk",
    "agent_message_chunk",
    "usage_update",
    "usage_update",
];
const DIRECT_ONLY: &str = "ACPD_REAL_AGENT_DIRECT_ONLY";

/// The version `package.json` pins for `package`, and the one installed, if any.
fn pinned_and_installed(package: &str) -> (String, Option<String>) {
    let dir = interop_dir();
    let read = |p: PathBuf| -> Option<Value> {
        serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
    };
    let pinned =
        read(dir.join("package.json")).expect("tests/interop/package.json")["dependencies"]
            [package]
            .as_str()
            .expect("the package is pinned")
            .to_owned();
    let installed = read(dir.join("node_modules").join(package).join("package.json"))
        .and_then(|v| v["version"].as_str().map(str::to_owned));
    (pinned, installed)
}

/// `true` when node and the pinned packages are ready; `false` (with the reason printed) when
/// node is missing. Missing or stale packages are installed with `npm ci`; its failure fails.
fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if Command::new("node").arg("--version").output().is_err() {
            eprintln!("SKIPPED: node is not installed, so the real-agent differential cannot run");
            return false;
        }
        let stale = [
            "@agentclientprotocol/claude-agent-acp",
            "@agentclientprotocol/sdk",
        ]
        .iter()
        .any(|p| {
            let (pinned, installed) = pinned_and_installed(p);
            installed.as_deref() != Some(pinned.as_str())
        });
        if stale {
            node::install().unwrap_or_else(|why| panic!("{why}"));
        }
        true
    })
}

/// The differential's report, run once for both tests (None when skipped).
fn report() -> Option<&'static Value> {
    static REPORT: OnceLock<Value> = OnceLock::new();
    if !ready() {
        return None;
    }
    Some(REPORT.get_or_init(|| {
        let work = tempfile::tempdir().unwrap();
        let mut cmd = Command::new("node");
        cmd.arg(interop_dir().join("differential.mjs"))
            .arg("--work")
            .arg(work.path());
        if std::env::var_os(DIRECT_ONLY).is_none() {
            cmd.args(["--acpd", BIN]);
        }
        let out = cmd
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .env_remove("ACPD_MAX_DEPTH")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "differential.mjs failed\n{stdout}\n{stderr}"
        );
        let v: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}\n{stderr}"));
        eprintln!("timings (ms): {}", v["timings"]);
        for side in ["direct", "acpd"] {
            if !v[side].is_null() {
                eprintln!("{side} steps (ms): {}", v[side]["steps"]);
            }
        }
        v
    }))
}

/// Every mismatch found, so one run reports all of them.
#[derive(Default)]
struct Mismatches(Vec<String>);

impl Mismatches {
    fn same(&mut self, what: &str, got: &Value, want: &Value) {
        if got != want {
            self.0.push(format!("{what}: got {got}, want {want}"));
        }
    }
    fn check(&mut self, what: &str, ok: bool, detail: &Value) {
        if !ok {
            self.0.push(format!("{what}: {detail}"));
        }
    }
    fn assert_none(self, side: &str, report: &Value) {
        assert!(
            self.0.is_empty(),
            "{side}: {} mismatch(es):\n  {}\n\nreport: {report}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}

fn texts(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The one listed session, checked to be `id` in the project with a title the agent gives.
fn check_listing(m: &mut Mismatches, side: &str, list: &Value, id: &Value, project: &Value) {
    m.same(
        &format!("{side} session/list error"),
        &list["error"],
        &Value::Null,
    );
    let sessions = list["sessions"].as_array().cloned().unwrap_or_default();
    m.check(
        &format!("{side} session/list lists exactly the one session"),
        sessions.len() == 1,
        list,
    );
    let Some(first) = sessions.first() else {
        return;
    };
    m.same(&format!("{side} listed sessionId"), &first["sessionId"], id);
    m.same(&format!("{side} listed cwd"), &first["cwd"], project);
    m.check(
        &format!("{side} listed title is the generated one or the prompt"),
        TITLES.iter().any(|t| first["title"] == *t),
        &first["title"],
    );
}

/// (a): the agent, run directly against the mock, does what (b) compares against.
#[test]
fn claude_agent_acp_runs_offline_against_the_mock() {
    let Some(report) = report() else { return };
    let d = &report["direct"];
    let mut m = Mismatches::default();
    m.same("run error", &report["error"], &Value::Null);
    m.same("first process error", &d["error"], &Value::Null);
    m.same("first process exit", &d["exit"], &json!(0));
    let init = &d["initialize"];
    m.same("protocolVersion", &init["protocolVersion"], &json!(1));
    m.same(
        "agent version",
        &init["agentInfo"]["version"],
        &json!("0.101.0"),
    );
    let caps = &init["agentCapabilities"];
    m.same("loadSession", &caps["loadSession"], &json!(true));
    m.check(
        "sessionCapabilities.list",
        caps["sessionCapabilities"]["list"].is_object(),
        caps,
    );
    let id = &d["sessionId"];
    m.check(
        "a session id",
        id.as_str().is_some_and(|s| !s.is_empty()),
        id,
    );
    m.same("stopReason", &d["stopReason"], &json!("end_turn"));
    m.same("turn kinds", &d["turn"]["kinds"], &json!(TURN));
    m.same(
        "turn text",
        &d["turn"]["texts"],
        &json!({ "agent_message_chunk": REPLY }),
    );
    m.same("turn sessionIds", &d["turn"]["sessionIds"], &json!([id]));
    m.same("permission requests", &d["permissionRequests"], &json!(0));
    check_listing(&mut m, "direct", &d["list"], id, &report["project"]);

    let l = &d["load"];
    m.same("second process error", &l["error"], &Value::Null);
    m.same("second process exit", &l["exit"], &json!(0));
    m.same(
        "replay kinds",
        &l["replay"]["kinds"],
        &json!(["user_message_chunk", "agent_message_chunk"]),
    );
    m.same(
        "replay text",
        &l["replay"]["texts"],
        &json!({ "user_message_chunk": PROMPT, "agent_message_chunk": REPLY }),
    );
    m.same(
        "replay sessionIds",
        &l["replay"]["sessionIds"],
        &json!([id]),
    );
    m.same("session/load answer's sessionId", &l["sessionId"], id);

    let asked = report["modelRequests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    m.check(
        "the mock model got the prompt",
        asked
            .iter()
            .any(|r| r["path"] == "/v1/messages" && r["user"] == PROMPT),
        &report["modelRequests"],
    );
    m.assert_none("(a) claude-agent-acp directly", report);
}

/// `v` without `_meta.acpd` (and without `_meta` when nothing else was in it).
fn without_acpd_meta(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove("acpd");
        if meta.is_empty() {
            v.as_object_mut().unwrap().remove("_meta");
        }
    }
    v
}

/// (b): the same sequence through `acpd stdio` answers as the agent does, under acpd's ids.
#[test]
fn acpd_stdio_is_transparent_to_claude_agent_acp() {
    if std::env::var_os(DIRECT_ONLY).is_some() {
        eprintln!("SKIPPED: {DIRECT_ONLY} is set, so only the direct part (a) runs");
        return;
    }
    let Some(report) = report() else { return };
    let (d, a) = (&report["direct"], &report["acpd"]);
    let mut m = Mismatches::default();
    m.same("run error", &report["error"], &Value::Null);
    m.same("first process error", &a["error"], &Value::Null);
    m.same("first acpd exit", &a["exit"], &json!(0));

    let (di, ai) = (&d["initialize"], &a["initialize"]);
    m.same(
        "protocolVersion",
        &ai["protocolVersion"],
        &di["protocolVersion"],
    );
    m.same(
        "agentCapabilities (minus _meta.acpd)",
        &without_acpd_meta(&ai["agentCapabilities"]),
        &di["agentCapabilities"],
    );
    m.check(
        "agentCapabilities._meta.acpd stays",
        ai["agentCapabilities"]["_meta"]["acpd"].is_object(),
        &ai["agentCapabilities"],
    );
    m.same("authMethods", &ai["authMethods"], &di["authMethods"]);

    let id = &a["sessionId"];
    m.check(
        "a session id",
        id.as_str().is_some_and(|s| !s.is_empty()),
        id,
    );
    m.same("session/new answer's fields", &a["newKeys"], &d["newKeys"]);
    m.same("stopReason", &a["stopReason"], &d["stopReason"]);
    m.same("turn kinds", &a["turn"]["kinds"], &d["turn"]["kinds"]);
    m.same("turn text", &a["turn"]["texts"], &d["turn"]["texts"]);
    m.same("turn sessionIds", &a["turn"]["sessionIds"], &json!([id]));
    m.same(
        "permission requests",
        &a["permissionRequests"],
        &d["permissionRequests"],
    );
    check_listing(&mut m, "acpd", &a["list"], id, &report["project"]);

    let (dl, al) = (&d["load"], &a["load"]);
    m.check("a second acpd process ran", al.is_object(), al);
    m.same("second process error", &al["error"], &Value::Null);
    m.same("second acpd exit", &al["exit"], &json!(0));
    m.same("session/load answer's fields", &al["keys"], &dl["keys"]);
    if !dl["sessionId"].is_null() {
        m.same("session/load answer's sessionId", &al["sessionId"], id);
    }
    m.same(
        "replay kinds",
        &al["replay"]["kinds"],
        &dl["replay"]["kinds"],
    );
    m.same(
        "replay text",
        &al["replay"]["texts"],
        &dl["replay"]["texts"],
    );
    m.same(
        "replay sessionIds",
        &al["replay"]["sessionIds"],
        &json!([id]),
    );

    // Differences the spec does not (yet) hold acpd to, said so a reader sees them.
    let (dn, an) = (texts(&d["notifications"]), texts(&a["notifications"]));
    if dn != an {
        eprintln!("note: notifications outside session/update differ: direct {dn:?}, acpd {an:?}");
    }
    m.assert_none("(b) claude-agent-acp through acpd stdio", report);
}
