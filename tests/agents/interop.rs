//! Interop with an implementation nobody here wrote: the official ACP TypeScript SDK
//! (`@agentclientprotocol/sdk`, pinned in tests/interop/package.json). Its client drives
//! `acpd stdio`; an agent built on it runs as acpd's child. Skipped, with the reason printed,
//! only when node is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;
use crate::node::{self, interop_dir};

use std::process::Command;
use std::sync::OnceLock;

use common::*;
use serde_json::Value;

/// `true` when node and the SDK are ready; `false` (with the reason printed) when node is
/// missing. A node without the installable SDK is a failure, not a skip.
fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        if Command::new("node").arg("--version").output().is_err() {
            eprintln!(
                "SKIPPED: node is not installed, so the TypeScript SDK interop tests cannot run"
            );
            return false;
        }
        let dir = interop_dir();
        if !dir.join("node_modules/@agentclientprotocol/sdk").exists() {
            node::install().unwrap_or_else(|why| panic!("{why}"));
        }
        true
    })
}

fn ts_env() -> Env {
    let agent = interop_dir().join("agent.mjs");
    Env::raw(&format!(
        "[providers.ts]\ncommand = [\"node\", \"{}\"]\ncancel_grace = \"2s\"\neof_grace = \"500ms\"\nterm_grace = \"500ms\"\n",
        agent.display()
    ))
}

#[test]
fn typescript_client_drives_acpd_stdio() {
    if !ready() {
        return;
    }
    let env = Env::new("");
    let out = Command::new("node")
        .arg(interop_dir().join("client.mjs"))
        .arg(BIN)
        .arg(&env.config)
        .arg(env.path())
        .env_remove("ACPD_DEPTH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["protocolVersion"], 1);
    assert_eq!(v["acpd"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["stopReason"], "end_turn");
    assert_eq!(
        v["text"],
        "hello from typescript\npermission: selected allow\n"
    );
    assert_eq!(v["delegated"], "delegated");
    assert_eq!(v["delegatedStop"], "completed");
    assert_eq!(
        v["ext"],
        serde_json::json!(["_acpd/subagent/started", "_acpd/subagent/ended"])
    );
    assert_eq!(v["acpdExit"], 0);
}

#[test]
fn typescript_agent_runs_as_a_child() {
    if !ready() {
        return;
    }
    let env = ts_env();
    let (v, code, stderr) =
        run_json(
            env.acpd()
                .args(["run", "--json", "--provider", "ts", "hello"]),
        );
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(output_text(&v), "ts agent: hello");

    // A run timeout cancels the TypeScript agent's turn with session/cancel.
    let (v, code, _) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "ts",
        "--timeout",
        "500ms",
        "please cancel",
    ]));
    assert_eq!(
        (code, v["failure"]["category"].as_str()),
        (1, Some("timeout"))
    );
    assert_eq!(output_text(&v), "ts agent: please cancel");
}
