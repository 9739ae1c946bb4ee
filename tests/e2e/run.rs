//! `acpd run` end to end: every row of the outcome table against the real echo agent, with
//! exit codes, categories, partial output and diagnostic hygiene.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

use common::*;
use serde_json::Value;

fn run(env: &Env, prompt: &str) -> (Value, i32, String) {
    run_json(
        env.acpd()
            .args(["run", "--json", "--provider", "fast", prompt]),
    )
}

fn category(v: &Value) -> &str {
    v["failure"]["category"].as_str().unwrap_or("-")
}

/// A diagnostic carries fixed facts only: no prompt text, no path, no env value.
fn assert_clean_diagnostic(v: &Value) {
    let d = v["diagnostic"]
        .as_str()
        .expect("a non-completed result has a diagnostic");
    assert!(d.starts_with("Subagent failure (provider: fast"), "{d}");
    assert!(!d.contains("MARKER"), "prompt text leaked: {d}");
    assert!(!d.contains('/'), "a path leaked: {d}");
    assert!(!d.contains("hunter2"), "an env value leaked: {d}");
    assert!(d.len() <= 4096);
}

#[test]
fn hello_on_a_fresh_machine_without_config() {
    let out = base().args(["run", "hello"]).output().unwrap();
    assert_eq!(
        code(&out),
        0,
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
}

#[test]
fn end_turn_is_completed() {
    let env = Env::new("");
    let (v, code, _) = run(&env, "MARKER one\nline two");
    assert_eq!(code, 0);
    assert_eq!(v["stopReason"], "completed");
    assert_eq!(output_text(&v), "MARKER one\nline two");
    assert!(v.get("diagnostic").is_none() && v.get("failure").is_none());
    assert_eq!(v["provider"], "fast");
    assert_eq!(v["turn"], 1);
}

#[test]
fn stop_reasons_map_to_results_and_exit_codes() {
    let env = Env::new("");
    let cases = [
        ("max_tokens", "max-tokens", 5, "-"),
        ("max_turn_requests", "error", 1, "remote-limit"),
        ("refusal", "refusal", 4, "-"),
        ("cancelled", "aborted", 6, "remote-cancel"),
        ("finished_early", "error", 1, "unknown-stop-reason"),
    ];
    for (child, stop, exit, cat) in cases {
        let (v, code, _) = run(&env, &format!("MARKER partial\n:stop {child}"));
        assert_eq!(
            (v["stopReason"].as_str().unwrap(), code, category(&v)),
            (stop, exit, cat),
            "{child}: {v}"
        );
        assert_eq!(
            output_text(&v),
            "MARKER partial\n",
            "partial output kept for {child}"
        );
        assert_clean_diagnostic(&v);
    }
}

#[test]
fn typed_failure_record_turns_end_turn_into_error() {
    let env = Env::new("");
    let (v, code, _) = run(&env, ":meta-failure quota");
    assert_eq!(
        (v["stopReason"].as_str().unwrap(), code, category(&v)),
        ("error", 1, "quota")
    );
}

#[test]
fn json_rpc_errors_keep_their_code_and_auth_is_named() {
    let env = Env::new("");
    let (v, code, _) = run(&env, "MARKER\n:error -32603 boom /etc/passwd");
    assert_eq!(
        (v["stopReason"].as_str().unwrap(), code, category(&v)),
        ("error", 1, "rpc")
    );
    assert_eq!(v["failure"]["code"], -32603);
    assert_clean_diagnostic(&v);
    let (v, _, _) = run(&env, ":error -32000 login required");
    assert_eq!(category(&v), "auth");
}

#[test]
fn crash_mid_turn_is_process_exit_with_partial_output() {
    let env = Env::new("");
    let (v, code, stderr) = run(&env, "MARKER before the crash\n:crash 3");
    assert_eq!(
        (v["stopReason"].as_str().unwrap(), code, category(&v)),
        ("error", 1, "process-exit")
    );
    assert_eq!(v["failure"]["exitCode"], 3);
    assert_eq!(output_text(&v), "MARKER before the crash\n");
    assert_clean_diagnostic(&v);
    assert!(v["diagnostic"].as_str().unwrap().contains("exit code: 3"));
    assert!(!stderr.contains("panicked"));
    let (v, _, _) = run(&env, ":signal SIGKILL");
    assert_eq!(category(&v), "process-exit");
    assert_eq!(v["failure"]["signal"], "SIGKILL");
}

#[test]
fn crash_while_a_grandchild_holds_the_pipes_is_still_seen() {
    let env = Env::new("");
    let (v, _, _) = run(&env, ":grandchild\n:crash 4");
    assert_eq!(category(&v), "process-exit");
    assert_eq!(v["failure"]["exitCode"], 4);
    let grandchild = pid_after(&output_text(&v), "grandchild ");
    assert!(
        !exists(grandchild),
        "grandchild {grandchild} survived the run"
    );
}

#[test]
fn run_timeout_is_timeout() {
    let env = Env::new("");
    let (v, code, _) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "fast",
        "--timeout",
        "300ms",
        "MARKER\n:hang",
    ]));
    assert_eq!(
        (v["stopReason"].as_str().unwrap(), code, category(&v)),
        ("error", 1, "timeout")
    );
    assert_eq!(output_text(&v), "MARKER\n");
    assert_clean_diagnostic(&v);
}

#[test]
fn silence_past_idle_timeout_is_hung() {
    let env = Env::raw(&format!(
        "[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\nidle_timeout = \"300ms\"\n\
         cancel_grace = \"200ms\"\neof_grace = \"200ms\"\nterm_grace = \"200ms\"\n"
    ));
    let (v, code, _) = run(&env, "MARKER\n:hang-deaf");
    assert_eq!(
        (v["stopReason"].as_str().unwrap(), code, category(&v)),
        ("error", 1, "hung")
    );
    assert_eq!(output_text(&v), "MARKER\n");
}

#[test]
fn bad_lines_from_the_child_are_protocol_errors() {
    let env = Env::new("");
    for prompt in [":garbage", ":binary", ":oversize 17000000"] {
        let (v, code, stderr) = run(&env, &format!("MARKER\n{prompt}\n:hang-deaf"));
        assert_eq!(
            (v["stopReason"].as_str().unwrap(), code, category(&v)),
            ("error", 1, "protocol"),
            "{prompt}"
        );
        assert_eq!(output_text(&v), "MARKER\n", "{prompt}");
        assert!(!stderr.contains("panicked"));
    }
}

#[test]
fn ctrl_c_cancels_tears_down_and_exits_130() {
    let env = Env::new("");
    let mut child = env
        .acpd()
        .args(["run", "--provider", "fast", "MARKER\n:pid\n:hang"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "MARKER");
    let pid = pid_after(&lines.next().unwrap().unwrap(), "pid ");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(!exists(pid), "the child {pid} survived Ctrl-C");
}

#[test]
fn json_prints_one_object_for_a_failed_start() {
    let env = Env::new("");
    let (v, code, _) = run_json(
        env.acpd()
            .args(["run", "--json", "--provider", "nope", "hi"]),
    );
    assert_eq!(code, 3);
    assert_eq!(v["error"]["name"], "NO_PROVIDER");
    assert_eq!(v["error"]["code"], -33001);
}

#[test]
fn typed_start_errors() {
    let env = Env::raw(&format!(
        "[providers.initexit]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--fail-at\", \"initialize\", \"--exit-code\", \"3\"]\n\
         [providers.v2]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--protocol-version\", \"2\"]\n\
         [providers.auth]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--fail-at\", \"session-new\", \"--error-code\", \"-32000\"]\n\
         [providers.slow]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--hang-at\", \"session-new\"]\nhandshake_timeout = \"300ms\"\neof_grace = \"100ms\"\n\
         [providers.missing]\ncommand = [\"/nonexistent/agent-binary\"]\n"
    ));
    let cases = [
        ("initexit", "initialize", "process-exit"),
        ("v2", "initialize", "protocol-version"),
        ("auth", "session-new", "auth"),
        ("slow", "session-new", "timeout"),
        ("missing", "spawn", "spawn"),
    ];
    for (provider, stage, cat) in cases {
        let out = env
            .acpd()
            .args(["run", "--json", "--provider", provider, "hi"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        // Auth is its own exit code, at any stage.
        let exit = if cat == "auth" { 7 } else { 3 };
        assert_eq!(code(&out), exit, "{provider}: {v}");
        assert_eq!(v["error"]["name"], "START_FAILED", "{provider}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("stage: {stage}")) && msg.contains(&format!("category: {cat}")),
            "{provider}: {msg}"
        );
    }
    let out = env
        .acpd()
        .args(["run", "--json", "--provider", "initexit", "hi"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exit code: 3")
    );
}

#[test]
fn cwd_rules() {
    let env = Env::new("");
    let (v, code, _) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "fast",
        "--cwd",
        "/nonexistent/dir",
        "hi",
    ]));
    assert_eq!(
        (code, v["error"]["name"].as_str().unwrap()),
        (3, "INVALID_CWD")
    );
    std::fs::create_dir(env.path().join("sub")).unwrap();
    let (v, code, _) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "fast",
        "--cwd",
        "sub",
        ":cwd",
    ]));
    assert_eq!(code, 0);
    let expected = env.path().join("sub");
    assert_eq!(output_text(&v), format!("cwd {}\n", expected.display()));
    let (v, _, _) = run(&env, ":cwd");
    assert_eq!(
        output_text(&v),
        format!("cwd {}\n", env.path().display()),
        "the caller's cwd is the default"
    );
}

#[test]
fn depth_is_passed_down_and_enforced() {
    let env = Env::new("");
    let (v, _, _) = run(&env, ":env ACPD_DEPTH ACPD_MAX_DEPTH");
    assert_eq!(output_text(&v), "ACPD_DEPTH=1\nACPD_MAX_DEPTH=2\n");
    let (v, code, _) = run_json(env.acpd().env("ACPD_DEPTH", "2").args([
        "run",
        "--json",
        "--provider",
        "fast",
        "hi",
    ]));
    assert_eq!(
        (code, v["error"]["name"].as_str().unwrap()),
        (3, "DEPTH_EXCEEDED")
    );
    let (v, code, _) = run_json(env.acpd().env("ACPD_MAX_DEPTH", "0").args([
        "run",
        "--json",
        "--provider",
        "fast",
        "hi",
    ]));
    assert_eq!(
        (code, v["error"]["name"].as_str().unwrap()),
        (3, "DEPTH_EXCEEDED"),
        "an outer acpd's limit holds"
    );
}

#[test]
fn secrets_do_not_reach_the_child_unless_passed_through() {
    let env = Env::raw(&format!(
        "[providers.plain]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         [providers.pass]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\nenv_passthrough = [\"MY_API_KEY\"]\nenv = {{ EXTRA = \"set\" }}\n"
    ));
    for (provider, expected) in [
        ("plain", "MY_API_KEY unset\nEXTRA unset\n"),
        ("pass", "MY_API_KEY=hunter2\nEXTRA=set\n"),
    ] {
        let (v, _, _) = run_json(env.acpd().env("MY_API_KEY", "hunter2").args([
            "run",
            "--json",
            "--provider",
            provider,
            ":env MY_API_KEY EXTRA",
        ]));
        assert_eq!(output_text(&v), expected, "{provider}");
    }
}

#[test]
fn permission_policies_pick_by_kind_and_forward_falls_back_to_reject() {
    let env = Env::raw(&format!(
        "[providers.allow]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\npermission = \"allow\"\n\
         [providers.reject]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\npermission = \"reject\"\n\
         [providers.forward]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n"
    ));
    for (provider, expected) in [
        ("allow", "allow"),
        ("reject", "reject"),
        ("forward", "reject"),
    ] {
        let (v, _, _) = run_json(env.acpd().args([
            "run",
            "--json",
            "--provider",
            provider,
            ":permission\n:stop refusal",
        ]));
        assert_eq!(
            output_text(&v),
            format!("permission: selected {expected}\n"),
            "{provider}"
        );
        let nobody = v["diagnostic"].as_str().unwrap().contains("nobody to ask");
        assert_eq!(nobody, provider == "forward", "{provider}: {v}");
    }
}

#[test]
fn fs_requests_get_method_not_found() {
    let env = Env::new("");
    let (v, code, _) = run(&env, ":read /etc/hostname");
    assert_eq!(code, 0);
    assert_eq!(output_text(&v), "read error: -32601\n");
}

#[test]
fn unknown_update_kinds_and_non_text_blocks() {
    let env = Env::new("");
    let (v, code, _) = run(
        &env,
        ":update future_kind\n:thought hmm\nbefore\n:image\nafter",
    );
    assert_eq!(code, 0);
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 3, "{v}");
    assert_eq!(output[0]["text"], "before\n");
    assert_eq!(output[1]["type"], "image");
    assert_eq!(output[2]["text"], "after");
}

#[test]
fn output_is_capped_and_flagged() {
    let env = Env::new("max_output = \"10B\"");
    let (v, code, _) = run(&env, ":chunks 5 5");
    assert_eq!(code, 0);
    assert_eq!(output_text(&v).len(), 10);
    assert_eq!(v["outputTruncated"], true);
}

#[test]
fn prompt_from_stdin() {
    let env = Env::new("");
    let mut child = env
        .acpd()
        .args(["run", "--provider", "fast", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from stdin\n");
}

#[test]
fn streamed_text_and_stderr_stay_apart() {
    let env = Env::raw(&format!(
        "[providers.noisy]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--stderr\", \"CHILD-STDERR-SECRET\"]\n"
    ));
    let (v, _, _) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "noisy",
        "hello\n:stop refusal",
    ]));
    assert!(
        !v.to_string().contains("CHILD-STDERR-SECRET"),
        "stderr leaked into the result: {v}"
    );
}

#[test]
fn providers_lists_capabilities() {
    let env = Env::new("");
    let out = env.acpd().args(["providers", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo", "fast"]);
    assert_eq!(v["providers"][0]["default"], true);
    assert_eq!(v["providers"][0]["capabilities"]["depthLimit"], true);
    assert_eq!(v["providers"][0]["capabilities"]["outputSchema"], true);
    assert_eq!(v["providers"][0]["capabilities"]["toolFilter"], false);
}

/// A pipe whose read end is already closed: every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    Stdio::from(write)
}

/// stdout closed under `acpd run` (and `providers`): exit 74 (EX_IOERR) with one line on
/// stderr, never a panic (101); a streaming run is stopped, not run to its end for nobody.
#[test]
fn a_closed_stdout_is_exit_74_not_a_panic() {
    let env = Env::new("");
    let cases: &[&[&str]] = &[
        &["run", "--json", "--provider", "fast", "hello"],
        &["run", "--provider", "fast", "hello"],
        &["run", "--json", "--provider", "nonexistent", "hello"],
        &["providers"],
        &["providers", "--json"],
    ];
    for args in cases {
        let out = env
            .acpd()
            .args(*args)
            .stdout(closed_pipe())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 74, "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(
            stderr
                .lines()
                .filter(|l| l.contains("cannot write to stdout"))
                .count(),
            1,
            "{args:?}: {stderr}"
        );
    }
    // A long stream stops at the first failed write: the run is cancelled, not sat through
    // (2 000 chunks 10 ms apart would take 20 s).
    let started = std::time::Instant::now();
    let out = env
        .acpd()
        .args(["run", "--provider", "fast", ":timed 2000 10 10"])
        .stdout(closed_pipe())
        .output()
        .unwrap();
    assert_eq!(code(&out), 74, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "the run went on for {:?}",
        started.elapsed()
    );
    // stderr closed too: nothing left to say it on, still no panic.
    let out = env
        .acpd()
        .args(["run", "--json", "--provider", "fast", "hello"])
        .stdout(closed_pipe())
        .stderr(closed_pipe())
        .output()
        .unwrap();
    assert_eq!(code(&out), 74);
}

/// `--json` writes only at the end, so a closed stdout is seen from the pipe itself (it reports
/// an error once its reader is gone): the run is stopped at once, not sat through.
#[test]
fn a_closed_stdout_stops_a_json_run_early() {
    let env = Env::new("");
    let started = std::time::Instant::now();
    let out = env
        .acpd()
        .args(["run", "--json", "--provider", "fast", ":sleep 30000"])
        .stdout(closed_pipe())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 74, "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "the 30 s run was sat through: {:?}",
        started.elapsed()
    );
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("cannot write to stdout"))
            .count(),
        1,
        "{stderr}"
    );
}

/// Whichever way `acpd run` ends — completed, start failed, stdout closed — its child record
/// is removed, so the state directory does not fill up with dead owners' records.
#[test]
fn every_exit_removes_the_child_record() {
    let env = Env::new("");
    let state = env.path().join("state");
    let records = || -> Vec<String> {
        std::fs::read_dir(&state)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let cases: &[(&[&str], i32)] = &[
        (&["run", "--json", "--provider", "fast", "hello"], 0),
        (
            &[
                "run",
                "--json",
                "--provider",
                "fast",
                "--cwd",
                "/nonexistent",
                "x",
            ],
            3,
        ),
        (&["run", "--json", "--provider", "fast", ":crash 3"], 1),
    ];
    for (args, expected) in cases {
        let out = env.acpd().args(*args).output().unwrap();
        assert_eq!(code(&out), *expected, "{args:?}");
        assert_eq!(records(), Vec::<String>::new(), "{args:?} left a record");
    }
    let out = env
        .acpd()
        .args(["run", "--json", "--provider", "fast", ":sleep 30000"])
        .stdout(closed_pipe())
        .output()
        .unwrap();
    assert_eq!(code(&out), 74);
    assert_eq!(
        records(),
        Vec::<String>::new(),
        "a closed stdout left a record"
    );
}
