#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! Nested delegation end to end, with real processes: an editor opens a bridge session whose
//! child (the echo agent, `offer_delegation = true`) is offered acpd as the MCP server `acpd`
//! in `session/new`, and its `:delegate` directive calls that server's `delegate` tool
//! through the MCP SDK — the grandchild's traffic reaches the editor as a nested Subagent
//! Session; a grandchild that hides its depth and finds the socket by itself is refused at
//! depth 3 with `max_depth = 2` (acpd counts depth from the connecting process's ancestry);
//! cancelling the top session cancels the nested run; closing it, or disposing a run whose
//! child delegated, leaves no process of the tree. This binary is a subreaper, so orphans it
//! adopts are reaped before they are counted.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::raw::{Line, Raw, Serve, gone_within, subreaper};
use common::*;
use serde_json::{Value, json};

/// Long enough for a loaded 2-core machine to run the ladder (3 × 300 ms graces) on a tree
/// of three agents and two `acpd mcp` processes.
const REAPED: Duration = Duration::from_secs(20);

fn config(dir: &Path, socket_env: bool) -> String {
    config_with(dir, socket_env, 2)
}

fn config_with(dir: &Path, socket_env: bool, max_depth: u32) -> String {
    let socket = dir.join("run/acpd.sock");
    let env = if socket_env {
        format!("env = {{ ACPD_SOCKET = \"{}\" }}\n", socket.display())
    } else {
        String::new()
    };
    format!(
        "max_depth = {max_depth}\ndetach_timeout = \"0s\"\ndefault_provider = \"p\"\n\
         [providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         description = \"the echo agent, delegating\"\n\
         offer_delegation = true\n{env}\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    )
}

fn daemon(socket_env: bool) -> (Env, Serve) {
    daemon_with(socket_env, 2)
}

fn daemon_with(socket_env: bool, max_depth: u32) -> (Env, Serve) {
    let env = Env::raw("");
    std::fs::write(&env.config, config_with(env.path(), socket_env, max_depth)).unwrap();
    let serve = Serve::start(&env);
    (env, serve)
}

fn editor(serve: &Serve) -> Raw {
    let mut raw = serve.connect();
    raw.initialize(json!({"subagents": {}}));
    raw
}

/// The `session/update` lines seen so far whose update is a `subagent_update` under `parent`.
fn announcements(raw: &Raw, parent: &str) -> Vec<Value> {
    updates(raw)
        .filter(|p| p["sessionId"] == parent && p["update"]["sessionUpdate"] == "subagent_update")
        .map(|p| p["update"].clone())
        .collect()
}

fn updates(raw: &Raw) -> impl Iterator<Item = Value> + '_ {
    raw.seen
        .iter()
        .filter(|l: &&Line| l.method() == "session/update")
        .map(|l| l.value["params"].clone())
}

/// Reads until a `subagent_update` under `parent` matches `pred`; returns it.
fn until_announced(raw: &mut Raw, parent: &str, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        if let Some(a) = announcements(raw, parent).into_iter().find(|a| pred(a)) {
            return a;
        }
        let line = raw.next();
        raw.seen.push(line);
    }
}

/// Every live process below `pid` (children, grandchildren, …), from /proc.
fn descendants(pid: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let after = &stat[stat.rfind(')')? + 2..];
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let at = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == at).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

/// The pid of the bridge session's child, from `_acpd/runs`.
fn session_pid(raw: &mut Raw, sid: &str) -> i32 {
    let runs = raw.ok("_acpd/runs", json!({}));
    runs["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sessionId"] == sid)
        .and_then(|s| s["pid"].as_i64())
        .unwrap_or_else(|| panic!("{sid} not in _acpd/runs: {runs}")) as i32
}

#[test]
fn a_childs_delegation_is_a_nested_subagent_session_and_depth_3_is_refused() {
    let (_env, serve) = daemon(true);
    let mut raw = editor(&serve);
    let sid = raw.new_session(Path::new("/tmp"), "p");

    let id = raw.send_prompt(&sid, ":delegate hello from the grandchild");
    let answer = raw.answer(&json!(id));
    assert_eq!(
        answer.value["result"]["stopReason"], "end_turn",
        "{answer:?}"
    );
    let announced = announcements(&raw, &sid);
    let first = announced.first().unwrap_or_else(|| {
        panic!(
            "no subagent_update under {sid}; seen: {:?}",
            raw.seen_text()
        )
    });
    assert_eq!(first["state"]["state"], "running");
    assert_eq!(first["description"], "the echo agent, delegating");
    let sub = first["sessionId"].as_str().unwrap().to_string();
    assert_ne!(sub, sid);
    assert_eq!(
        raw.chunk_text(&sub),
        "hello from the grandchild",
        "the grandchild's traffic arrives under the nested session"
    );
    let last = announced.last().unwrap();
    assert_eq!(last["sessionId"], sub.as_str());
    assert_eq!(
        last["state"],
        json!({"state": "idle", "stopReason": "end_turn"})
    );
    assert_eq!(
        raw.chunk_text(&sid),
        "delegated: hello from the grandchild\n",
        "the delegate tool's result reaches the child"
    );

    // The grandchild (depth 2) is not offered acpd; it finds the socket itself, hides
    // ACPD_DEPTH, and is refused by its ancestry.
    raw.seen.clear();
    let id = raw.send_prompt(&sid, ":delegate :delegate deeper");
    raw.answer(&json!(id));
    let text = raw.chunk_text(&sid);
    assert!(
        text.contains("DEPTH_EXCEEDED") && text.contains("run depth 3 exceeds the depth limit 2"),
        "{text}"
    );
}

#[test]
fn cancelling_the_top_session_cancels_the_nested_run_and_closing_it_leaves_nothing() {
    subreaper();
    let (_env, serve) = daemon(false);
    let mut raw = editor(&serve);
    let sid = raw.new_session(Path::new("/tmp"), "p");
    let child = session_pid(&mut raw, &sid);

    let id = raw.send_prompt(&sid, ":delegate :hang");
    let running = until_announced(&mut raw, &sid, |a| a["state"]["state"] == "running");
    let sub = running["sessionId"].as_str().unwrap().to_string();
    let tree = descendants(child);
    assert!(!tree.is_empty(), "the child's acpd mcp runs below it");
    let runs = raw.ok("_acpd/runs", json!({}));
    let nested: Vec<&Value> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["depth"] == 2)
        .collect();
    assert_eq!(nested.len(), 1, "one run at depth 2: {runs}");
    assert_eq!(nested[0]["parent"], format!("session:{sid}"));
    let grandchild = nested[0]["pid"].as_i64().unwrap() as i32;

    raw.line(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
            .to_string(),
    );
    let answer = raw.answer(&json!(id));
    assert_eq!(answer.value["result"]["stopReason"], "cancelled");
    let idle = until_announced(&mut raw, &sid, |a| a["state"]["state"] == "idle");
    assert_eq!(idle["sessionId"], sub.as_str());
    assert_eq!(idle["state"]["stopReason"], "cancelled");

    // Cancelled from the editor by the nested session's own id.
    raw.seen.clear();
    let id = raw.send_prompt(&sid, ":delegate :hang");
    let running = until_announced(&mut raw, &sid, |a| a["state"]["state"] == "running");
    let sub = running["sessionId"].as_str().unwrap().to_string();
    raw.line(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sub}})
            .to_string(),
    );
    let idle = until_announced(&mut raw, &sid, |a| a["state"]["state"] == "idle");
    assert_eq!(idle["state"]["stopReason"], "cancelled");
    let answer = raw.answer(&json!(id));
    assert_eq!(answer.value["result"]["stopReason"], "end_turn");
    assert!(
        raw.chunk_text(&sid).starts_with("delegate failed:"),
        "{}",
        raw.chunk_text(&sid)
    );

    // One more nested run, hanging; then the editor goes away mid-turn.
    raw.seen.clear();
    raw.send_prompt(&sid, ":delegate :hang");
    until_announced(&mut raw, &sid, |a| a["state"]["state"] == "running");
    let mut tree = descendants(child);
    tree.push(child);
    tree.push(grandchild);
    drop(raw);
    for pid in tree {
        assert!(gone_within(pid, REAPED), "pid {pid} of the tree survived");
    }
}

#[test]
fn disposing_a_run_whose_child_delegated_reaps_the_nested_run() {
    subreaper();
    let (_env, serve) = daemon(false);
    let mut raw = editor(&serve);
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "p", "cwd": "/tmp",
               "prompt": [{"type": "text", "text": ":delegate nested output"}]}),
    )["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let result = raw.wait_run(&run);
    assert_eq!(result["stopReason"], "completed", "{result}");
    assert_eq!(output_text(&result), "delegated: nested output\n");

    let id = raw.send(
        "_acpd/subagent/send",
        json!({"runId": run, "prompt": [{"type": "text", "text": ":delegate :hang"}]}),
    );
    raw.answer(&json!(id));
    let mut nested = None;
    assert!(
        eventually(REAPED, || {
            let runs = raw.ok("_acpd/runs", json!({}));
            nested = runs["runs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["depth"] == 2 && r["state"] == "running")
                .and_then(|r| r["pid"].as_i64());
            nested.is_some()
        }),
        "the nested run never showed at depth 2"
    );
    let top = raw.ok("_acpd/runs", json!({}))["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == run.as_str())
        .and_then(|r| r["pid"].as_i64())
        .unwrap() as i32;
    let mut tree = descendants(top);
    tree.push(top);
    tree.push(nested.unwrap() as i32);
    raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
    for pid in tree {
        assert!(gone_within(pid, REAPED), "pid {pid} of the tree survived");
    }
    let runs = raw.ok("_acpd/runs", json!({}));
    assert_eq!(
        runs["runs"],
        json!([]),
        "the nested run went with its parent"
    );
}

#[test]
fn acpd_stdio_offers_its_own_socket_to_delegating_children() {
    let env = Env::raw("");
    std::fs::write(&env.config, config(env.path(), false)).unwrap();
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({"subagents": {}}));
    let sid = raw.new_session(Path::new("/tmp"), "p");
    let id = raw.send_prompt(&sid, ":delegate through stdio");
    raw.answer(&json!(id));
    let announced = announcements(&raw, &sid);
    assert!(!announced.is_empty(), "seen: {:?}", raw.seen_text());
    let sub = announced[0]["sessionId"].as_str().unwrap();
    assert_eq!(raw.chunk_text(sub), "through stdio");
    assert_eq!(raw.chunk_text(&sid), "delegated: through stdio\n");
}

#[test]
fn each_level_is_announced_under_the_one_above() {
    let (_env, serve) = daemon_with(false, 3);
    let mut raw = editor(&serve);
    let sid = raw.new_session(Path::new("/tmp"), "p");
    let id = raw.send_prompt(&sid, ":delegate :delegate deepest");
    raw.answer(&json!(id));
    let first = announcements(&raw, &sid);
    let sub1 = first[0]["sessionId"].as_str().unwrap().to_string();
    let second = announcements(&raw, &sub1);
    assert!(
        !second.is_empty(),
        "the great-grandchild is announced under the grandchild's session; seen: {:?}",
        raw.seen_text()
    );
    let sub2 = second[0]["sessionId"].as_str().unwrap().to_string();
    assert_eq!(raw.chunk_text(&sub2), "deepest");
    assert_eq!(raw.chunk_text(&sub1), "delegated: deepest\n");
    assert_eq!(raw.chunk_text(&sid), "delegated: delegated: deepest\n");
    assert_eq!(
        second.last().unwrap()["state"],
        json!({"state": "idle", "stopReason": "end_turn"})
    );
}

#[test]
fn a_delegated_runs_own_delegation_is_announced_under_its_subagent_session() {
    let (_env, serve) = daemon(false);
    let mut raw = editor(&serve);
    let sid = raw.new_session(Path::new("/tmp"), "p");
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "p", "cwd": "/tmp", "parentSessionId": sid,
               "prompt": [{"type": "text", "text": ":delegate from the run's child"}]}),
    );
    let run_session = run["sessionId"].as_str().unwrap().to_string();
    let result = raw.wait_run(run["runId"].as_str().unwrap());
    assert_eq!(output_text(&result), "delegated: from the run's child\n");
    let nested = announcements(&raw, &run_session);
    assert!(!nested.is_empty(), "seen: {:?}", raw.seen_text());
    let sub = nested[0]["sessionId"].as_str().unwrap();
    assert_eq!(raw.chunk_text(sub), "from the run's child");
}

/// SIGTERM: the daemon reaps the nested tree before it exits; SIGKILL: the next daemon's sweep
/// does.
#[test]
fn no_process_of_a_nested_tree_outlives_the_daemon() {
    subreaper();
    for signal in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGKILL,
    ] {
        let (env, mut serve) = daemon(false);
        let mut raw = editor(&serve);
        let sid = raw.new_session(Path::new("/tmp"), "p");
        let child = session_pid(&mut raw, &sid);
        raw.send_prompt(&sid, ":delegate :hang");
        until_announced(&mut raw, &sid, |a| a["state"]["state"] == "running");
        let runs = raw.ok("_acpd/runs", json!({}));
        let mut tree = descendants(child);
        tree.push(child);
        tree.extend(
            runs["runs"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["pid"].as_i64().map(|p| p as i32)),
        );
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(serve.pid() as i32), signal).unwrap();
        let _ = serve.child.wait();
        if signal == nix::sys::signal::Signal::SIGKILL {
            // PDEATHSIG ends the daemon's direct children; what they started waits for the
            // next daemon's sweep.
            let _next = Serve::start(&env);
            for pid in &tree {
                assert!(gone_within(*pid, REAPED), "pid {pid} survived the sweep");
            }
        } else {
            for pid in &tree {
                assert!(gone_within(*pid, REAPED), "pid {pid} survived SIGTERM");
            }
        }
    }
}

/// A process inside a child's tree that dials the socket itself and acts as an editor: it may
/// not open, list, close or delete bridge sessions (one it opened would start at the top of
/// the depth count; one it closed could be its own parent's).
#[test]
fn a_child_cannot_open_or_touch_bridge_sessions_through_the_socket() {
    let env = Env::raw("");
    let socket = env.path().join("run/acpd.sock");
    let out = env.path().join("hostile.json");
    let script = env.path().join("hostile.py");
    let client = python_client(&socket);
    std::fs::write(
        &script,
        format!(
            r#"{client}
answers = [call(1, "initialize", {{"protocolVersion": 1}})]
answers.append(call(2, "session/new", {{"cwd": "/tmp", "mcpServers": []}}))
answers.append(call(3, "session/list", {{}}))
answers.append(call(4, "session/close", {{"sessionId": sys.argv[1]}}))
open({out:?} + ".tmp", "w").write(json.dumps(answers))
import os; os.rename({out:?} + ".tmp", {out:?})
time.sleep(600)
"#
        ),
    )
    .unwrap();
    std::fs::write(
        &env.config,
        format!(
            "detach_timeout = \"0s\"\ndefault_provider = \"p\"\n\
             [providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
             [providers.h]\n\
             command = [\"sh\", \"-c\", \"python3 {script} \\\"$0\\\" & exec {BIN} agent echo\", \"VICTIM\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            script = script.display(),
        ),
    )
    .unwrap();
    let serve = Serve::start(&env);
    let mut raw = editor(&serve);
    let victim = raw.new_session(Path::new("/tmp"), "p");
    // The victim's id reaches the hostile script through its provider's argv.
    let config = std::fs::read_to_string(&env.config)
        .unwrap()
        .replace("VICTIM", &victim);
    std::fs::write(&env.config, config).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    assert!(
        eventually(REAPED, || {
            std::fs::read_to_string(env.path().join("daemon.log"))
                .unwrap_or_default()
                .contains("config reloaded")
        }),
        "the daemon never reloaded"
    );
    let hostile = raw.new_session(Path::new("/tmp"), "h");
    assert!(
        eventually(REAPED, || out.exists()),
        "the hostile script never finished"
    );
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(
        answers[0].get("result").is_some(),
        "initialize: {}",
        answers[0]
    );
    for answer in &answers[1..] {
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("inside the process tree of a child"),
            "refused, saying why: {answer}"
        );
    }
    // The victim is untouched: it still answers a prompt.
    let id = raw.send_prompt(&victim, "still here");
    let answer = raw.answer(&json!(id));
    assert_eq!(answer.value["result"]["stopReason"], "end_turn");
    assert_eq!(raw.chunk_text(&victim), "still here");
    drop(hostile);
}

/// The grandchild's permission request reaches the editor, under the nested session's id, and
/// the editor's answer reaches the grandchild.
#[test]
fn a_nested_runs_permission_request_is_asked_of_the_editor() {
    let (_env, serve) = daemon(false);
    let mut raw = editor(&serve);
    let sid = raw.new_session(Path::new("/tmp"), "p");
    let id = raw.send_prompt(&sid, ":delegate :permission");
    let request = loop {
        let line = raw.next();
        if line.is_request() && line.method() == "session/request_permission" {
            break line;
        }
        raw.seen.push(line);
    };
    let announced = announcements(&raw, &sid);
    let sub = announced[0]["sessionId"].as_str().unwrap().to_string();
    assert_eq!(request.value["params"]["sessionId"], sub.as_str());
    let option = request.value["params"]["options"][0]["optionId"]
        .as_str()
        .unwrap()
        .to_string();
    raw.line(
        &json!({"jsonrpc": "2.0", "id": request.value["id"],
                "result": {"outcome": {"outcome": "selected", "optionId": option}}})
        .to_string(),
    );
    raw.answer(&json!(id));
    assert_eq!(
        raw.chunk_text(&sub),
        format!("permission: selected {option}\n")
    );
    assert!(
        announcements(&raw, &sid)
            .iter()
            .any(|a| a["state"]["state"] == "requires_action"),
        "the nested session showed it waits on the editor"
    );
}

/// A process that leaves its child's tree by a double fork (reparented to acpd) and dials the
/// socket is never taken for a top-level client, with cgroup containment or process groups.
#[test]
fn an_escaped_descendant_is_still_its_childs() {
    escapee("auto");
    escapee("process-group");
}

fn escapee(containment: &str) {
    let env = Env::raw("");
    let socket = env.path().join("run/acpd.sock");
    let out = env.path().join("escapee.json");
    let script = env.path().join("escapee.py");
    let client = python_client(&socket);
    std::fs::write(
        &script,
        format!(
            r#"{client}
call(1, "initialize", {{"protocolVersion": 1}})
answers = [os.getppid()]
answers.append(call(2, "_acpd/subagent/start", {{"provider": "p", "cwd": "/tmp", "prompt": [{{"type": "text", "text": "hi"}}]}}))
answers.append(call(3, "_acpd/runs", {{}}))
open({out:?} + ".tmp", "w").write(json.dumps(answers))
os.rename({out:?} + ".tmp", {out:?})
time.sleep(600)
"#
        ),
    )
    .unwrap();
    std::fs::write(
        &env.config,
        format!(
            "containment = \"{containment}\"\ndetach_timeout = \"0s\"\ndefault_provider = \"p\"\n\
             [providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
             [providers.h]\n\
             command = [\"sh\", \"-c\", \"(setsid python3 {script} &); sleep 1; exec {BIN} agent echo\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            script = script.display(),
        ),
    )
    .unwrap();
    let serve = Serve::start(&env);
    let mut raw = editor(&serve);
    let _session = raw.new_session(Path::new("/tmp"), "h");
    assert!(
        eventually(REAPED, || out.exists()),
        "the escapee never finished"
    );
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(
        answers[0],
        json!(serve.pid()),
        "the escapee was reparented to acpd, out of its child's tree"
    );
    // Whose it is cannot be told (a child may move itself into another child's cgroup, so
    // membership proves nothing), but it is below acpd: refused, never a top-level client.
    let message = answers[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("belongs to no run or session"),
        "never a top-level client: {}",
        answers[1]
    );
}

/// The start of a python script that connects to acpd's socket as a peer of its own: `call(id,
/// method, params)` sends a request and returns its answer. `json`, `os`, `sys` and `time` are
/// imported.
fn python_client(socket: &Path) -> String {
    format!(
        r#"import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect({socket:?})
f = s.makefile("rwb")
def call(i, method, params):
    f.write((json.dumps({{"jsonrpc": "2.0", "id": i, "method": method, "params": params}}) + "\n").encode())
    f.flush()
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == i:
            return msg"#
    )
}

/// A child that opens 80 connections to the daemon gets `max_connections_per_child` (8) of
/// them, the rest one LIMIT line each; an editor still connects (before, the child took every
/// `max_connections` slot).
#[test]
fn one_childs_connections_leave_room_for_editors() {
    let env = Env::raw("");
    let socket = env.path().join("run/acpd.sock");
    let out = env.path().join("flood.json");
    let script = env.path().join("flood.py");
    std::fs::write(
        &script,
        format!(
            r#"import json, os, socket, time
init = json.dumps({{"jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {{"protocolVersion": 1, "_meta": {{"acpd": {{"query": True}}}}}}}}) + "\n"
held, answers = [], []
for _ in range(80):
    s = socket.socket(socket.AF_UNIX)
    s.connect({socket:?})
    held.append(s)
for s in held:
    s.settimeout(30)
    try:
        s.sendall(init.encode())
        line = s.makefile("rb").readline()
        answers.append(json.loads(line) if line else {{"closed": True}})
    except Exception as e:
        answers.append({{"failed": str(e)}})
open({out:?} + ".tmp", "w").write(json.dumps(answers))
os.rename({out:?} + ".tmp", {out:?})
time.sleep(600)
"#
        ),
    )
    .unwrap();
    std::fs::write(
        &env.config,
        format!(
            "detach_timeout = \"0s\"\ndefault_provider = \"p\"\n\
             [providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             [providers.h]\n\
             command = [\"sh\", \"-c\", \"python3 {script} & exec {BIN} agent echo\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            script = script.display(),
        ),
    )
    .unwrap();
    let serve = Serve::start(&env);
    let mut raw = editor(&serve);
    let _session = raw.new_session(Path::new("/tmp"), "h");
    assert!(
        eventually(REAPED, || out.exists()),
        "the flooding child never finished"
    );
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let served = answers.iter().filter(|a| a.get("result").is_some()).count();
    let refused: Vec<&Value> = answers
        .iter()
        .filter(|a| a["error"]["data"]["limit"] == "max_connections_per_child")
        .collect();
    assert_eq!(served, 8, "{answers:?}");
    assert_eq!(refused.len(), 72, "{answers:?}");
    assert!(
        refused.iter().all(|a| a["id"].is_null()
            && a["error"]["data"]["code"] == "LIMIT"
            && a["error"]["data"]["value"] == 8),
        "{:?}",
        refused[0]
    );
    // An editor still gets in, and is served.
    let mut other = serve.connect();
    let init = other.initialize(json!({}));
    assert!(init.get("protocolVersion").is_some(), "{init}");
}
