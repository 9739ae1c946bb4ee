#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! Isolation with the real claude-agent-acp 0.101.0 (the `claude` preset, installed by `acpd
//! install claude`) on tests/interop/mock-model.mjs, through `acpd run` and through `acpd mcp`
//! (this test as its MCP client: newline-delimited JSON-RPC on its stdio, `initialize`, then
//! `tools/call`). The mock scripts the model: `WRITE <path> <content>` edits a file with Claude
//! Code's Read and Write tools, `BASH <command>` runs a command with its Bash tool,
//! `DELEGATE <json>` calls acpd's offered `delegate` tool, and `MOCK_USAGE=<n>` makes every reply
//! report n input tokens.
//!
//! - A worktree per run: two runs at once edit the same file of one repository differently;
//!   each lands on its own branch `acpd/<run id>`, the parent's checkout untouched.
//! - The sandbox: a Bash command that appends to `~/.ssh/authorized_keys` and writes the
//!   parent's checkout and a file beside it changes nothing under `sandbox = "landlock"`, and
//!   the run completes; the same command without the sandbox changes all three. The provider
//!   allows every permission, so it is the kernel that refuses, not Claude Code.
//! - A tool filter through the MCP `delegate` tool: with `Bash` denied the command never runs.
//! - A budget: tokens past it end the run `error`, category `budget`; a run nested under it
//!   (Claude Code delegating back through acpd to the echo agent, whose reported usage pushes
//!   the root over) is cancelled with it.
//!
//! Every scenario ends with no process of its tree left (found by its HOME). One scenario at a
//! time: each starts Claude Code, and the machine may be small. Skipped, printing why, only
//! when node is missing (see presets.rs).

mod world;

use crate::common::{BIN, output_text};
use crate::presets::installed;

use std::path::PathBuf;

use serde_json::{Value, json};
use world::{Mcp, Serve, World, delegated, git, one_at_a_time, tool_text};

// ---- a worktree per run ----

/// Two results of runs that each wrote `notes.txt` of `world`'s repository: each on its own
/// branch with its own content, the parent's checkout untouched, the worktrees removed.
fn assert_two_branches(world: &World, results: [(&Value, &str); 2]) {
    let mut branches = Vec::new();
    for (result, content) in results {
        assert_eq!(
            result["stopReason"],
            "completed",
            "{result}\n{}",
            world.asked()
        );
        let ws = &result["workspace"];
        let branch = ws["branch"].as_str().unwrap_or_else(|| panic!("{result}"));
        assert_eq!(
            branch,
            format!("acpd/{}", result["runId"].as_str().unwrap())
        );
        assert_eq!(ws["changed"], json!(["notes.txt"]), "{result}");
        assert_eq!(
            git(&world.repo(), &["show", &format!("{branch}:notes.txt")]),
            format!("{content}\n"),
            "{result}"
        );
        // The run was disposed: its worktree is gone, its branch kept.
        let path = PathBuf::from(ws["path"].as_str().unwrap());
        assert!(!path.exists(), "{} outlived its run", path.display());
        branches.push(branch.to_string());
    }
    assert_ne!(branches[0], branches[1]);
    assert_eq!(world.notes(), "original\n");
    assert_eq!(git(&world.repo(), &["status", "--porcelain"]), "");
}

#[test]
fn two_acpd_runs_at_once_edit_one_file_each_on_a_branch_of_its_own() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let world = World::new(data, &[("claude", "workspace = \"worktree\"")], "");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| world.run("claude", "WRITE notes.txt from run A"));
        let b = s.spawn(|| world.run("claude", "WRITE notes.txt from run B"));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (v, code, stderr) in [&a, &b] {
        assert_eq!(*code, 0, "{v}\n{stderr}\n{}", world.asked());
    }
    assert_two_branches(&world, [(&a.0, "from run A"), (&b.0, "from run B")]);
    world.assert_nothing_left(&[]);
}

#[test]
fn two_mcp_delegates_in_flight_edit_one_file_each_on_a_branch_of_its_own() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let echo = format!(
        "[providers.echo]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\nworkspace = \"worktree\"\n"
    );
    let world = World::new(data, &[("claude", "workspace = \"worktree\"")], &echo);
    let mut mcp = Mcp::start(&world, &["--in-process"]);
    let cwd = world.repo();
    let ask = |text: &str| json!({"prompt": text, "cwd": cwd, "workspace": "worktree"});
    let first = mcp.send("delegate", ask("WRITE notes.txt from delegate A"));
    let second = mcp.send("delegate", ask("WRITE notes.txt from delegate B"));
    let (a, b) = (mcp.result(first), mcp.result(second));
    assert_eq!(a["isError"], false, "{a}");
    assert_eq!(b["isError"], false, "{b}");
    assert_two_branches(
        &world,
        [
            (delegated(&a), "from delegate A"),
            (delegated(&b), "from delegate B"),
        ],
    );

    // subagent_dispose keeps a run's branch, unless keepBranch is false (the echo agent, for
    // a quick run that writes a file).
    for keep in [true, false] {
        let started = mcp.call(
            "subagent_start",
            json!({"provider": "echo", "cwd": cwd, "prompt": ":write notes.txt echo\nok"}),
        );
        let run_id = started["structuredContent"]["runId"]
            .as_str()
            .unwrap()
            .to_string();
        let done = mcp.call("subagent_wait", json!({"runId": run_id}));
        let branch = delegated(&done)["workspace"]["branch"]
            .as_str()
            .unwrap()
            .to_string();
        let mut args = json!({"runId": run_id});
        if !keep {
            args["keepBranch"] = json!(false);
        }
        let disposed = mcp.call("subagent_dispose", args);
        assert_eq!(
            disposed["structuredContent"]["disposed"], true,
            "{disposed}"
        );
        let listed = git(&world.repo(), &["branch", "--list", &branch]);
        assert_eq!(
            !listed.trim().is_empty(),
            keep,
            "keepBranch {keep}: {listed:?}"
        );
    }
    mcp.close();
    assert_eq!(world.notes(), "original\n");
    world.assert_nothing_left(&[]);
}

// ---- the sandbox ----

/// The Bash command that writes where a sandboxed child may not: `~/.ssh/authorized_keys`,
/// the parent's checkout (outside the run's worktree) and a file beside it.
fn intrusion(world: &World) -> String {
    format!(
        "BASH echo ssh-ed25519 INTRUDER >> {keys}; echo INTRUDER > {notes}; \
         echo INTRUDER > {outside}",
        keys = world.home().join(".ssh/authorized_keys").display(),
        notes = world.repo().join("notes.txt").display(),
        outside = world.path().join("outside.txt").display(),
    )
}

/// What of the intrusion's targets changed in `world` (nothing, when it was refused).
fn intruded(world: &World) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if world.keys() != "ssh-ed25519 ORIGINAL\n" {
        changed.push("authorized_keys");
    }
    if world.notes() != "original\n" {
        changed.push("the parent's checkout");
    }
    if world.path().join("outside.txt").exists() {
        changed.push("outside.txt");
    }
    changed
}

/// The sandboxed run completed, and Bash told the model its writes were refused.
#[track_caller]
fn assert_refused_by_the_kernel(result: &Value, said: &str) {
    assert_eq!(result["stopReason"], "completed", "{result}");
    assert!(said.starts_with("RESULT ERROR"), "{said}");
    assert!(said.contains("Permission denied"), "{said}");
}

const BOXED: &[(&str, &str)] = &[
    ("boxed", "workspace = \"worktree\"\nsandbox = \"landlock\""),
    ("open", "workspace = \"worktree\""),
];

#[test]
fn under_landlock_an_acpd_run_writes_neither_authorized_keys_nor_outside_its_worktree() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let world = World::new(data, BOXED, "");
    let (v, code, stderr) = world.run("boxed", &intrusion(&world));
    eprintln!("sandboxed: {v}");
    assert_eq!(code, 0, "{v}\n{stderr}\n{}", world.asked());
    assert_eq!(intruded(&world), Vec::<&str>::new(), "{v}");
    assert_refused_by_the_kernel(&v, &output_text(&v));
    world.assert_nothing_left(&[]);

    // Control: the same command, the same provider but for the sandbox, writes all three.
    let (v, code, stderr) = world.run("open", &intrusion(&world));
    assert_eq!(code, 0, "{v}\n{stderr}");
    assert_eq!(
        intruded(&world),
        ["authorized_keys", "the parent's checkout", "outside.txt"],
        "{v}"
    );
    world.assert_nothing_left(&[]);
}

#[test]
fn under_landlock_an_mcp_delegate_writes_neither_authorized_keys_nor_outside_its_worktree() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let world = World::new(data, BOXED, "");
    let mut mcp = Mcp::start(&world, &["--in-process"]);
    let ask = |provider: &str| {
        json!({"provider": provider, "prompt": intrusion(&world),
                                      "cwd": world.repo()})
    };
    let r = mcp.call("delegate", ask("boxed"));
    eprintln!("sandboxed: {r}");
    assert_eq!(r["isError"], false, "{r}\n{}", world.asked());
    assert_eq!(intruded(&world), Vec::<&str>::new(), "{r}");
    assert_refused_by_the_kernel(delegated(&r), &tool_text(&r));

    let r = mcp.call("delegate", ask("open"));
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        intruded(&world),
        ["authorized_keys", "the parent's checkout", "outside.txt"],
        "{r}"
    );
    mcp.close();
    world.assert_nothing_left(&[]);
}

// ---- a tool filter ----

#[test]
fn an_mcp_delegate_whose_filter_forbids_bash_never_runs_the_models_bash_call() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let echo = format!("[providers.echo]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n");
    let world = World::new(data, &[("claude", "")], &echo);
    let marker = world.path().join("MARKER");
    let prompt = format!("BASH touch {}", marker.display());
    let mut mcp = Mcp::start(&world, &["--in-process"]);

    // Control: without a filter the command runs.
    let r = mcp.call("delegate", json!({"prompt": prompt, "cwd": world.repo()}));
    assert_eq!(r["isError"], false, "{r}\n{}", world.asked());
    assert!(
        marker.exists(),
        "without a filter Bash should have run: {r}"
    );
    std::fs::remove_file(&marker).unwrap();

    let r = mcp.call(
        "delegate",
        json!({"prompt": prompt, "cwd": world.repo(), "toolFilter": {"deny": ["Bash"]}}),
    );
    eprintln!("with toolFilter deny Bash: {r}");
    assert!(
        !marker.exists(),
        "Bash ran under a filter that forbids it: {r}"
    );
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(delegated(&r)["stopReason"], "completed", "{r}");
    // Claude Code told the model the tool does not exist, and the model said so.
    let said = tool_text(&r);
    assert!(
        said.starts_with("RESULT ERROR") && said.contains("Bash"),
        "{said}"
    );

    // A provider that cannot enforce a filter refuses it, as a tool error the model can read.
    let r = mcp.call(
        "delegate",
        json!({"provider": "echo", "prompt": "hi", "toolFilter": {"deny": ["Bash"]}}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(
        r["structuredContent"]["error"]["name"], "UNSUPPORTED_CAPABILITY",
        "{r}"
    );
    // A filter that names nothing, a permission rule for a name, a list that is no list, and
    // a keepBranch that is no boolean are refused before anything starts.
    for filter in [
        json!({}),
        json!({"deny": ["Bash(rm:*)"]}),
        json!({"deny": "Bash"}),
    ] {
        let r = mcp.call(
            "delegate",
            json!({"prompt": prompt, "cwd": world.repo(), "toolFilter": filter}),
        );
        assert_eq!(
            r["structuredContent"]["error"]["name"], "INVALID_REQUEST",
            "{r}"
        );
    }
    let r = mcp.call(
        "subagent_dispose",
        json!({"runId": "x", "keepBranch": "no"}),
    );
    assert_eq!(
        r["structuredContent"]["error"]["name"], "INVALID_REQUEST",
        "{r}"
    );
    assert!(!marker.exists());
    mcp.close();
    world.assert_nothing_left(&[]);
}

// ---- a budget ----

#[track_caller]
fn assert_budget(result: &Value) {
    assert_eq!(result["stopReason"], "error", "{result}");
    assert_eq!(result["failure"]["category"], "budget", "{result}");
    let diagnostic = result["diagnostic"].as_str().unwrap_or_default();
    assert!(diagnostic.contains("token budget is spent"), "{diagnostic}");
}

#[test]
fn an_acpd_run_past_its_token_budget_ends_budget() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let world = World::new(data, &[("claude", "budget = { tokens = 1000 }")], "");
    // Control: the mock's usual few tokens are within the budget.
    let (v, code, stderr) = world.run("claude", "hello");
    assert_eq!(code, 0, "{v}\n{stderr}\n{}", world.asked());
    assert_eq!(v["stopReason"], "completed", "{v}");

    let (v, code, stderr) = world.run("claude", "hello MOCK_USAGE=50000");
    eprintln!("past the budget: {v}");
    assert_eq!(code, 1, "{v}\n{stderr}");
    assert_budget(&v);
    world.assert_nothing_left(&[]);
}

#[test]
fn an_mcp_delegate_past_its_token_budget_ends_budget() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let world = World::new(data, &[("claude", "")], "");
    let mut mcp = Mcp::start(&world, &["--in-process"]);
    let ask = |text: &str| {
        json!({"prompt": text, "cwd": world.repo(),
                                  "budget": {"tokens": 1000}})
    };
    let r = mcp.call("delegate", ask("hello"));
    assert_eq!(r["isError"], false, "{r}\n{}", world.asked());

    let r = mcp.call("delegate", ask("hello MOCK_USAGE=50000"));
    eprintln!("past the budget: {r}");
    assert_eq!(r["isError"], true, "{r}");
    assert_budget(delegated(&r));
    mcp.close();
    world.assert_nothing_left(&[]);
}

/// The echo agent as the nested run's provider `hang`; `max_depth` 2 lets a run's child
/// delegate once.
fn hang_provider() -> String {
    format!(
        "max_depth = 2\n[providers.hang]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    )
}

/// What the root's model asks: delegate to the echo agent, which starts a sleeper grandchild
/// that ignores SIGTERM, reports 1500 tokens (past the root's 1000) and waits for a cancel.
fn delegate_past_the_root() -> String {
    let nested = json!({"provider": "hang", "prompt": ":grandchild\n:usage 1500\n:hang"});
    format!("DELEGATE {nested}")
}

/// The nested run (so the model did call acpd's delegate tool) ended `budget` too, saying
/// that a run above it spent its budget, in what acpd logged.
#[track_caller]
fn assert_nested_ended_with_it(log: &str) {
    let nested_end = log
        .lines()
        .find(|l| l.contains("provider: hang") && l.contains("category: budget"))
        .unwrap_or_else(|| panic!("no budget end of the nested run: {log}"));
    assert!(nested_end.contains("a run above this one"), "{nested_end}");
}

#[test]
fn a_run_nested_under_an_acpd_run_is_cancelled_when_its_spending_ends_the_root() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let root = "offer_delegation = true\nbudget = { tokens = 1000 }";
    let world = World::new(data, &[("claude", root)], &hang_provider());
    let (v, code, stderr) = world.run("claude", &delegate_past_the_root());
    eprintln!("the root: {v}");
    assert_eq!(code, 1, "{v}\n{stderr}\n{}", world.asked());
    assert_budget(&v);
    assert_nested_ended_with_it(&stderr);
    world.assert_nothing_left(&[]);
}

#[test]
fn a_run_nested_under_an_mcp_delegate_is_cancelled_when_its_spending_ends_the_root() {
    let Some(data) = installed() else { return };
    let _one = one_at_a_time();
    let world = World::new(
        data,
        &[("claude", "offer_delegation = true")],
        &hang_provider(),
    );
    let ask = json!({"prompt": delegate_past_the_root(), "cwd": world.repo(),
                     "budget": {"tokens": 1000}});
    // Runs in the `acpd mcp` process, then in a daemon `acpd mcp` is a client of.
    for via in ["in-process", "daemon"] {
        let serve = (via == "daemon").then(|| Serve::start(&world));
        let mut mcp = match &serve {
            Some(serve) => Mcp::start(&world, &["--socket", serve.socket.to_str().unwrap()]),
            None => Mcp::start(&world, &["--in-process"]),
        };
        let r = mcp.call("delegate", ask.clone());
        eprintln!("the root ({via}): {r}");
        assert_eq!(r["isError"], true, "{r}\n{}", world.asked());
        assert_budget(delegated(&r));
        let log = serve.as_ref().map_or_else(|| mcp.raw.log(), Serve::log);
        assert_nested_ended_with_it(&log);
        // Nothing of either tree is left: only acpd mcp and the daemon, with its sentinel.
        let mut alive = vec![mcp.pid()];
        alive.extend(serve.as_ref().map(Serve::pid));
        world.assert_nothing_left(&alive);
        mcp.close();
        drop(serve);
        world.assert_nothing_left(&[]);
    }
}
