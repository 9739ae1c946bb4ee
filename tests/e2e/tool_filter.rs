//! A run's tool filter (`toolFilter`, `acpd run --allow-tool/--deny-tool`) against the echo
//! agent posing as claude-agent-acp (`tool_filter = "claude-meta"`): the filter reaches the
//! agent in `session/new`'s `_meta`, and since the echo agent ignores it, acpd's backstop is
//! what holds: a permission request for a filtered tool is refused and the run goes on; a
//! filtered tool reported running ends the run `tool-filter`.

use crate::common::{BIN, Env, output_text, run_json};
use serde_json::{Value, json};

fn env() -> Env {
    Env::new(&format!(
        "[providers.claudish]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         tool_filter = \"claude-meta\"\npermission = \"allow\"\n\
         cancel_grace = \"2s\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ))
}

fn run(env: &Env, args: &[&str], prompt: &str) -> (Value, i32, String) {
    let mut cmd = env.acpd();
    cmd.args(["run", "--json", "--provider", "claudish"])
        .args(args)
        .arg(prompt);
    run_json(&mut cmd)
}

fn ask(tool: &str, id: &str) -> String {
    let params = json!({
        "toolCall": {"toolCallId": id, "title": "touch MARKER", "kind": "execute", "name": tool},
        "options": [
            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
        ],
    });
    format!(":request session/request_permission {params}\n")
}

#[test]
fn the_filter_reaches_the_agent_as_claude_sdk_options() {
    let env = env();
    let (v, code, stderr) = run(
        &env,
        &[
            "--allow-tool",
            "Read",
            "--allow-tool",
            "Bash",
            "--deny-tool",
            "Bash",
        ],
        ":session-meta",
    );
    assert_eq!(code, 0, "{v}\n{stderr}");
    let text = output_text(&v);
    let meta: Value = serde_json::from_str(
        text.trim()
            .strip_prefix("session-meta ")
            .unwrap_or_else(|| panic!("{text}")),
    )
    .unwrap();
    assert_eq!(
        meta,
        json!({"claudeCode": {"options": {"tools": ["Read", "Bash"], "disallowedTools": ["Bash"]}}})
    );
    // The SDK's allowedTools means "run without asking": acpd never loosens permissions.
    assert!(meta.pointer("/claudeCode/options/allowedTools").is_none());
}

#[test]
fn a_permission_request_for_a_filtered_tool_is_refused_and_the_run_goes_on() {
    let env = env();
    let prompt = format!("{}{}after\n", ask("Bash", "t1"), ask("Read", "t2"));
    let (v, code, stderr) = run(&env, &["--deny-tool", "Bash"], &prompt);
    assert_eq!(code, 0, "{v}\n{stderr}");
    assert_eq!(v["stopReason"], "completed", "{v}");
    let text = output_text(&v);
    let replies: Vec<&str> = text.lines().collect();
    // Bash refused by the filter; Read allowed by the provider's `permission = "allow"`.
    assert!(replies[0].contains(r#""optionId":"no""#), "{text}");
    assert!(replies[1].contains(r#""optionId":"yes""#), "{text}");
    assert_eq!(replies[2], "after", "{text}");
    let said = v["diagnostic"].as_str().unwrap_or_default();
    assert!(
        said.contains("permission request for a filtered tool was refused"),
        "{v}"
    );
    // Without the filter the same request is allowed.
    let (v, _, _) = run(&env, &[], &prompt);
    assert!(
        output_text(&v)
            .lines()
            .next()
            .unwrap()
            .contains(r#""optionId":"yes""#),
        "{v}"
    );
}

#[test]
fn a_filtered_tool_that_runs_anyway_ends_the_run_tool_filter() {
    let env = env();
    // Reported and refused by the agent (pending, then failed) is no breach; running is.
    let prompt = ":tool-call Read completed\n:tool-call Bash pending\n:tool-call Bash failed\n\
                  before\n:tool-call Bash in_progress\n:hang\nnever\n";
    let (v, code, stderr) = run(&env, &["--deny-tool", "Bash"], prompt);
    assert_eq!(code, 1, "{v}\n{stderr}");
    assert_eq!(v["stopReason"], "error", "{v}");
    assert_eq!(v["failure"]["category"], "tool-filter", "{v}");
    let text = output_text(&v);
    assert!(text.contains("before") && !text.contains("never"), "{text}");
    assert!(
        v["diagnostic"]
            .as_str()
            .unwrap_or_default()
            .contains("category: tool-filter"),
        "{v}"
    );
    // An allow list that leaves Bash out holds the same way.
    let (v, _, _) = run(
        &env,
        &["--allow-tool", "Read"],
        ":tool-call Bash completed\nafter\n",
    );
    assert_eq!(v["failure"]["category"], "tool-filter", "{v}");
    // Without a filter the tool is nobody's business.
    let (v, code, _) = run(&env, &[], ":tool-call Bash completed\nafter\n");
    assert_eq!((code, &v["stopReason"]), (0, &json!("completed")), "{v}");
}

#[test]
fn only_a_provider_with_a_mechanism_takes_a_filter_and_a_bad_filter_is_refused() {
    let env = env();
    let out = env.acpd().args(["providers", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let caps = |name: &str| {
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["capabilities"]["toolFilter"]
            .clone()
    };
    assert_eq!(caps("claudish"), true);
    assert_eq!(caps("fast"), false);
    let (v, code, _) = run_json(env.acpd().args([
        "run",
        "--json",
        "--provider",
        "fast",
        "--deny-tool",
        "Bash",
        "hello",
    ]));
    assert_eq!(
        (code, v["error"]["name"].as_str()),
        (3, Some("UNSUPPORTED_CAPABILITY")),
        "{v}"
    );
    for args in [["--deny-tool", "Bash(rm:*)"], ["--deny-tool", ""]] {
        let (v, code, _) = run(&env, &args, "hello");
        assert_ne!(code, 0, "{v}");
        assert_eq!(v["error"]["name"], "INVALID_REQUEST", "{args:?}: {v}");
    }
}

/// A run's child that delegates (`:delegate`, through the `acpd` MCP server offered to it and
/// acpd stdio's nest socket) starts a run that inherits the filter: the grandchild's agent is
/// given the same `disallowedTools`, though the delegating child asked for no filter at all.
#[test]
fn a_nested_run_inherits_its_ancestor_s_filter() {
    let env = Env::new(&format!(
        "default_provider = \"claudish\"\nmax_depth = 3\n\
         [providers.claudish]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         tool_filter = \"claude-meta\"\npermission = \"allow\"\noffer_delegation = true\n\
         cancel_grace = \"2s\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ));
    let mut raw = crate::common::raw::Raw::stdio(&env);
    raw.initialize(json!({}));
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "claudish", "cwd": env.path(), "toolFilter": {"deny": ["Bash"]},
               "prompt": [{"type": "text", "text": ":delegate :session-meta"}]}),
    )["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let r = raw.wait_run(&run);
    let text = output_text(&r);
    assert!(text.starts_with("delegated: session-meta "), "{r}");
    let meta: Value = serde_json::from_str(
        text.trim()
            .strip_prefix("delegated: session-meta ")
            .unwrap(),
    )
    .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(
        meta,
        json!({"claudeCode": {"options": {"disallowedTools": ["Bash"]}}}),
        "{text}"
    );
}
