#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! Budgets end to end, with the echo agent under `acpd serve`: its `:usage N` directive
//! reports N tokens in context (a `usage_update`). A run past its token budget ends `error`
//! with category `budget` and its tree is reaped; `acpd runs` shows what each run spent
//! against its budget; a request may not ask more than its provider's; a run nested under
//! another (the echo agent delegating back through acpd) spends from the run above it and is
//! cancelled with it; the wall budget counts across turns, idle time included.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::raw::{Raw, Serve, gone_within, subreaper};
use common::*;
use serde_json::{Value, json};

/// Long enough for a loaded 2-core machine to run the ladder (3 × 300 ms graces) on a tree
/// of agents and `acpd mcp` processes.
const REAPED: Duration = Duration::from_secs(20);

/// Provider `p` has `budget`; `q`, the default (which a delegating child gets), has none.
fn daemon(budget: &str) -> (Env, Serve) {
    let echo = format!(
        "command = [\"{BIN}\", \"agent\", \"echo\"]\noffer_delegation = true\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    );
    let env = Env::raw(&format!(
        "max_depth = 2\ndetach_timeout = \"0s\"\ndefault_provider = \"q\"\n\
         [providers.p]\n{echo}budget = {budget}\n[providers.q]\n{echo}"
    ));
    let serve = Serve::start(&env);
    (env, serve)
}

fn editor(serve: &Serve) -> Raw {
    let mut raw = serve.connect();
    raw.initialize(json!({"subagents": {}}));
    raw
}

fn start(raw: &mut Raw, text: &str, extra: Value) -> Value {
    let mut params = json!({"provider": "p", "cwd": "/tmp",
                            "prompt": [{"type": "text", "text": text}]});
    if let (Some(p), Some(extra)) = (params.as_object_mut(), extra.as_object()) {
        p.extend(extra.clone());
    }
    raw.ok("_acpd/subagent/start", params)
}

/// The run `run_id` in `_acpd/runs`.
fn listed(raw: &mut Raw, run_id: &str) -> Value {
    let runs = raw.ok("_acpd/runs", json!({}));
    runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == run_id)
        .cloned()
        .unwrap_or_else(|| panic!("{run_id} not in {runs}"))
}

#[track_caller]
fn ended_budget(result: &Value, says: &str) {
    assert_eq!(result["stopReason"], "error", "{result}");
    assert_eq!(result["failure"]["category"], "budget", "{result}");
    let diagnostic = result["diagnostic"].as_str().unwrap_or_default();
    assert!(
        diagnostic.contains(says),
        "{diagnostic:?} should say {says:?}"
    );
}

#[test]
fn a_run_past_its_token_budget_ends_budget_and_runs_shows_what_it_spent() {
    subreaper();
    let (env, serve) = daemon("{ tokens = 1000 }");
    let mut raw = editor(&serve);

    // Within budget: listed with what it spent so far, out of its provider's budget.
    let run = start(&mut raw, ":usage 400\n:hang", json!({}));
    let run_id = run["runId"].as_str().unwrap().to_string();
    assert!(
        eventually(REAPED, || listed(&mut raw, &run_id)["tokens"] == 400),
        "{}",
        listed(&mut raw, &run_id)
    );
    let row = listed(&mut raw, &run_id);
    assert_eq!(row["budget"], json!({"tokens": 1000}), "{row}");
    let out = env
        .acpd()
        .args(["runs", "--socket"])
        .arg(&serve.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let header = text.lines().next().unwrap_or_default();
    let at = header.find("TOKENS").unwrap_or_else(|| panic!("{text}"));
    let line = text.lines().find(|l| l.starts_with(&run_id)).unwrap();
    assert!(
        line[..at + "TOKENS".len()].ends_with("400/1000"),
        "right-aligned under TOKENS:\n{text}"
    );
    raw.ok("_acpd/subagent/dispose", json!({"runId": run_id}));

    // Past it: cancelled, torn down, `budget`.
    let run = start(&mut raw, ":usage 600\n:usage 1500\n:hang", json!({}));
    let run_id = run["runId"].as_str().unwrap().to_string();
    let pid = listed(&mut raw, &run_id)["pid"].as_i64();
    let result = raw.wait_run(&run_id);
    ended_budget(&result, "token budget is spent");
    if let Some(pid) = pid {
        assert!(gone_within(pid as i32, REAPED), "the child is reaped");
    }
    assert_eq!(listed(&mut raw, &run_id)["tokens"], 1500);
}

#[test]
fn a_request_may_lower_its_providers_budget_but_not_raise_it() {
    let (_env, serve) = daemon("{ tokens = 1000, wall = \"10m\" }");
    let mut raw = editor(&serve);
    for (budget, says) in [
        (json!({"tokens": 1001}), "budget of 1000 tokens"),
        (json!({"wall": "1h"}), "budget of 10m"),
        (json!({"tokens": 5, "bogus": 1}), "bogus"),
        // Only the documented shape: an object, a duration written as it is.
        (json!([5, "5s"]), "`budget` as an object"),
        (
            json!({"wall": "5s\n"}),
            "budget.wall: \"5s\\n\" is not a duration",
        ),
        (
            json!({"wall": " 5s"}),
            "budget.wall: \" 5s\" is not a duration",
        ),
        (json!({"tokens": "5"}), "budget: invalid type"),
    ] {
        let answer = raw.call(
            "_acpd/subagent/start",
            json!({"provider": "p", "cwd": "/tmp", "budget": budget,
                   "prompt": [{"type": "text", "text": "hi"}]}),
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{answer}");
    }
    let run = start(
        &mut raw,
        ":usage 150\nhi",
        json!({"budget": {"tokens": 100}}),
    );
    let run_id = run["runId"].as_str().unwrap().to_string();
    ended_budget(&raw.wait_run(&run_id), "token budget is spent");
    assert_eq!(
        listed(&mut raw, &run_id)["budget"],
        json!({"tokens": 100, "wallS": 600})
    );
}

#[test]
fn a_nested_runs_spending_ends_the_run_above_it_and_itself() {
    subreaper();
    let (_env, serve) = daemon("{ tokens = 1000 }");
    let mut raw = editor(&serve);
    let sid = raw.new_session(Path::new("/tmp"), "p");
    // The run's child delegates back through acpd (to `q`, which has no budget of its own);
    // the nested run reports 1500 tokens and waits: 1500 is past the top run's 1000.
    let run = start(
        &mut raw,
        ":delegate :usage 1500\\n:hang",
        json!({"parentSessionId": sid}),
    );
    let run_id = run["runId"].as_str().unwrap().to_string();
    let run_session = run["sessionId"].as_str().unwrap().to_string();
    let result = raw.wait_run(&run_id);
    ended_budget(&result, "token budget is spent");
    // The nested run, announced under the run's Subagent Session, ended `budget` too, saying
    // it was a run above it that spent.
    let ended = loop {
        let nested = raw
            .seen
            .iter()
            .filter(|l| l.method() == "session/update")
            .map(|l| l.value["params"].clone())
            .find(|p| {
                p["sessionId"] == run_session
                    && p["update"]["sessionUpdate"] == "subagent_update"
                    && p["update"]["state"]["stopReason"] == "error"
            });
        if let Some(n) = nested {
            break n;
        }
        let line = raw.next();
        raw.seen.push(line);
    };
    let message = ended["update"]["state"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("category: budget") && message.contains("a run above this one"),
        "{ended}"
    );
    // Nothing of the tree is left running: only the spent top run is listed, without a child.
    assert!(
        eventually(REAPED, || {
            let runs = raw.ok("_acpd/runs", json!({}));
            let runs = runs["runs"].as_array().cloned().unwrap_or_default();
            runs.len() == 1 && runs[0]["pid"].is_null()
        }),
        "{}",
        raw.ok("_acpd/runs", json!({}))
    );
    assert_eq!(listed(&mut raw, &run_id)["tokens"], 1500);
}

#[test]
fn the_wall_budget_ends_a_run_that_idles_across_turns() {
    let (_env, serve) = daemon("{ wall = \"10m\" }");
    let mut raw = editor(&serve);
    let run = start(&mut raw, "first", json!({"budget": {"wall": "2s"}}));
    let run_id = run["runId"].as_str().unwrap().to_string();
    assert_eq!(raw.wait_run(&run_id)["stopReason"], "completed");
    // The second turn waits for a cancel that only the wall budget sends.
    let sent = raw.call(
        "_acpd/subagent/send",
        json!({"runId": run_id, "prompt": [{"type": "text", "text": ":hang"}]}),
    );
    if let Some(error) = sent.get("error") {
        // A machine slow enough for the 2 s to pass between the turns: the idle child is gone.
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains("its budget is spent"), "{sent}");
        return;
    }
    let result = raw.wait_run(&run_id);
    ended_budget(&result, "wall-time budget is spent");
    assert_eq!(result["turn"], 2, "{result}");
}

/// `acpd run --json ARGS` with provider `p` (its agent leaves a line in `started` each time it
/// is started) having `budget`.
fn run_with_budget(budget: &str, args: &[&str]) -> (Value, i32, String, bool) {
    let env = Env::raw("");
    let started = env.path().join("started");
    let script = format!(
        "echo started >> '{}'; exec '{BIN}' agent echo",
        started.display()
    );
    let argv = serde_json::to_string(&["/bin/sh", "-c", &script]).unwrap();
    std::fs::write(
        &env.config,
        format!(
            "[providers.p]\ncommand = {argv}\nbudget = {budget}\ncancel_grace = \"300ms\"\n\
             eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
        ),
    )
    .unwrap();
    let (v, code, stderr) = run_json(
        env.acpd()
            .args(["run", "--json", "--provider", "p"])
            .args(args),
    );
    (v, code, stderr, started.exists())
}

#[test]
fn acpd_run_budget_tokens_below_what_the_agent_reports_ends_budget_exit_1() {
    let (v, code, stderr, started) = run_with_budget(
        "{ tokens = 1000 }",
        &["--budget-tokens", "100", ":usage 150\n:hang"],
    );
    assert!(started);
    assert_eq!(code, 1, "{v}\n{stderr}");
    ended_budget(&v, "token budget is spent");
    // Within it, the same run completes.
    let (v, code, _, _) = run_with_budget(
        "{ tokens = 1000 }",
        &[
            "--budget-tokens",
            "200",
            "--budget-wall",
            "1m",
            ":usage 150\nhi",
        ],
    );
    assert_eq!((code, &v["stopReason"]), (0, &json!("completed")), "{v}");
}

#[test]
fn acpd_run_budget_wall_ends_a_run_that_hangs() {
    let (v, code, stderr, _) =
        run_with_budget("{ wall = \"10m\" }", &["--budget-wall", "1s", ":hang"]);
    assert_eq!(code, 1, "{v}\n{stderr}");
    ended_budget(&v, "wall-time budget is spent");
}

#[test]
fn acpd_run_budget_above_the_providers_is_refused_and_nothing_starts() {
    for (flags, says) in [
        (
            ["--budget-tokens", "5000"],
            "budget of 1000 tokens; ask for at most 1000",
        ),
        (["--budget-wall", "1h"], "budget of 10m"),
    ] {
        let (v, code, stderr, started) = run_with_budget(
            "{ tokens = 1000, wall = \"10m\" }",
            &[flags[0], flags[1], "hi"],
        );
        assert_eq!(code, 3, "{v}\n{stderr}");
        assert_eq!(v["error"]["name"], "INVALID_REQUEST", "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(says) && message.contains("provider \"p\""),
            "{message}"
        );
        assert!(
            stderr.contains("may lower the provider's budget, never raise it"),
            "{stderr}"
        );
        assert!(!started, "the agent was started");
    }
    // Bad values are usage errors, before anything is read or started.
    for flags in [
        ["--budget-tokens", "0"],
        ["--budget-tokens", "lots"],
        ["--budget-wall", "0s"],
        ["--budget-wall", "soon"],
    ] {
        let out = Env::new("")
            .acpd()
            .args(["run", "--provider", "fast", flags[0], flags[1], "hi"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{flags:?}: {stderr}");
        assert!(stderr.contains(flags[0]), "{stderr}");
    }
}

/// Every count JSON can write is counted: `1.2e3` and `1200.0` are 1200 tokens, a fraction
/// rounds up; a negative or non-numeric `used` is ignored (named once in the log), and does
/// not hide the counts after it.
#[test]
fn usage_written_as_a_float_is_counted_and_a_malformed_one_is_ignored() {
    subreaper();
    let (env, serve) = daemon("{ tokens = 1000 }");
    let mut raw = editor(&serve);
    let usage = |used: &str| {
        format!(
            ":raw-update {{\"sessionUpdate\":\"usage_update\",\"used\":{used},\"size\":200000}}\n"
        )
    };
    let script = [
        usage("-5"),
        usage("\"lots\""),
        usage("400.5"),
        ":hang".into(),
    ]
    .concat();
    let run = start(&mut raw, &script, json!({}));
    let run_id = run["runId"].as_str().unwrap().to_string();
    assert!(
        eventually(REAPED, || listed(&mut raw, &run_id)["tokens"] == 401),
        "{}",
        listed(&mut raw, &run_id)
    );
    raw.ok("_acpd/subagent/dispose", json!({"runId": run_id}));
    let log = std::fs::read_to_string(env.path().join("daemon.log")).unwrap_or_default();
    assert!(
        log.contains("ignoring the agent's usage_update.used -5: negative"),
        "{log}"
    );

    for written in ["1.2e3", "1200.0", "1e400"] {
        let run = start(
            &mut raw,
            &[usage(written), ":hang".into()].concat(),
            json!({}),
        );
        let run_id = run["runId"].as_str().unwrap().to_string();
        ended_budget(&raw.wait_run(&run_id), "token budget is spent");
        let spent = listed(&mut raw, &run_id)["tokens"].as_u64().unwrap();
        let expect = if written == "1e400" { u64::MAX } else { 1200 };
        assert_eq!(spent, expect, "{written}");
    }
}
