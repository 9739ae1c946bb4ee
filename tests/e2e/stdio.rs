//! `acpd stdio` end to end, driven by the ACP Rust SDK's client over real pipes: bridge
//! sessions against the echo agent, every `_acpd/subagent/*` method and its typed errors,
//! Subagent Sessions, and a parent that disappears mid-turn.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use common::client::AcpClient;
use common::*;
use serde_json::{Value, json};

fn text_prompt(text: &str) -> Value {
    json!([{ "type": "text", "text": text }])
}

async fn ready(env: &Env, caps: Value) -> AcpClient {
    let client = AcpClient::spawn(env);
    client.initialize(caps).await;
    client
}

#[tokio::test]
async fn initialize_advertises_acpd() {
    let env = Env::new("");
    let client = AcpClient::spawn(&env);
    let init = client.initialize(json!(null)).await;
    assert_eq!(init["protocolVersion"], 1);
    let meta = &init["agentCapabilities"]["_meta"]["acpd"];
    assert!(
        meta["methods"]
            .as_array()
            .unwrap()
            .contains(&json!("_acpd/subagent/start"))
    );
    assert_eq!(meta["providers"], json!(["echo", "fast"]));
    // What the default agent (the built-in echo) advertises, mirrored.
    assert_eq!(init["agentCapabilities"]["loadSession"], false);
    assert_eq!(init["agentInfo"]["name"], "acpd-echo");
    let e = client
        .request(
            "session/load",
            json!({"sessionId": "x", "cwd": "/", "mcpServers": []}),
        )
        .await
        .unwrap_err();
    assert_eq!(i32::from(e.code), -32002, "{e:?}");
    let e = client.request("_other/thing", json!({})).await.unwrap_err();
    assert_eq!(i32::from(e.code), -32601);
    assert!(client.close().await.success());
}

#[tokio::test]
async fn bridge_prompt_streams_updates_under_the_minted_id() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let sid = client.new_session(env.path(), None).await;
    assert!(sid.starts_with("acpd-"), "{sid}");
    let r = client
        .prompt(&sid, "hello\nworld\n:update future_kind")
        .await
        .unwrap();
    assert_eq!(r["stopReason"], "end_turn");
    let mut kinds = Vec::new();
    while let Ok((method, params)) = client.notes.try_recv() {
        assert_eq!(method, "session/update");
        assert_eq!(params["sessionId"], sid.as_str());
        kinds.push(params["update"].clone());
    }
    assert_eq!(kinds[0]["content"]["text"], "hello\n");
    assert_eq!(kinds[1]["content"]["text"], "world\n");
    assert_eq!(
        kinds[2],
        json!({"sessionUpdate": "future_kind", "acpdProbe": true}),
        "unknown kinds arrive intact"
    );
    let r = client.prompt(&sid, ":stop finished_early").await.unwrap();
    assert_eq!(
        r["stopReason"], "finished_early",
        "the stop reason is answered as the child gave it"
    );
    assert!(client.close().await.success());
}

#[tokio::test]
async fn bridge_picks_the_provider_from_meta() {
    let env = Env::new("");
    let client = ready(&env, json!({})).await;
    let e = client
        .request(
            "session/new",
            json!({"cwd": env.path(), "mcpServers": [], "_meta": {"acpd": {"provider": "ghost"}}}),
        )
        .await
        .unwrap_err();
    assert_eq!(i32::from(e.code), -33001);
    let e = client
        .request("session/new", json!({"cwd": "relative", "mcpServers": []}))
        .await
        .unwrap_err();
    assert_eq!(i32::from(e.code), -32602);
    let sid = client
        .new_session(env.path(), Some(json!({"acpd": {"provider": "fast"}})))
        .await;
    assert_eq!(
        client.prompt(&sid, "x").await.unwrap()["stopReason"],
        "end_turn"
    );
    client.close().await;
}

#[tokio::test]
async fn bridge_cancel_ends_the_turn_cancelled() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let sid = client.new_session(env.path(), None).await;
    let reply = client.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": text_prompt("started\n:hang")}),
    );
    let (_, first) = client.next_note().await;
    assert_eq!(first["update"]["content"]["text"], "started\n");
    client.notify("session/cancel", json!({"sessionId": sid}));
    let r = tokio::time::timeout(client::TIMEOUT, reply)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r["stopReason"], "cancelled");
    client.close().await;
}

#[tokio::test]
async fn bridge_forwards_permission_requests_and_relays_the_answer() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let sid = client.new_session(env.path(), None).await;
    let reply = client.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": text_prompt(":permission")}),
    );
    let ask = client.next_request().await;
    assert_eq!(ask.method, "session/request_permission");
    assert_eq!(ask.params["sessionId"], sid.as_str());
    ask.reply(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}));
    let r = tokio::time::timeout(client::TIMEOUT, reply)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r["stopReason"], "end_turn");
    assert_eq!(client.drain_text(&sid), "permission: selected allow\n");
    client.close().await;
}

#[tokio::test]
async fn cancel_answers_a_pending_permission_request_cancelled() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let sid = client.new_session(env.path(), None).await;
    let reply = client.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": text_prompt(":permission\n:hang")}),
    );
    let _ask = client.next_request().await;
    client.notify("session/cancel", json!({"sessionId": sid}));
    let r = tokio::time::timeout(client::TIMEOUT, reply)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r["stopReason"], "cancelled");
    assert_eq!(client.drain_text(&sid), "permission: cancelled\n");
    client.close().await;
}

#[tokio::test]
async fn fs_reads_are_forwarded_only_when_advertised() {
    let env = Env::new("");
    let mut client = ready(&env, json!({"fs": {"readTextFile": true}})).await;
    let sid = client.new_session(env.path(), None).await;
    let reply = client.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": text_prompt(":read /some/file")}),
    );
    let read = client.next_request().await;
    assert_eq!(read.method, "fs/read_text_file");
    assert_eq!(read.params, json!({"sessionId": sid, "path": "/some/file"}));
    read.reply(json!({"content": "FILE CONTENT"}));
    tokio::time::timeout(client::TIMEOUT, reply)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(client.drain_text(&sid), "read: FILE CONTENT\n");
    client.close().await;

    let mut client = ready(&env, json!({})).await;
    let sid = client.new_session(env.path(), None).await;
    client.prompt(&sid, ":read /some/file").await.unwrap();
    assert_eq!(client.drain_text(&sid), "read error: -32601\n");
    client.close().await;
}

/// Issue 30: a prompt whose agent exits mid-turn ends as ACP ends a turn, `cancelled` (an
/// editor reads −32603 as acpd failing), and `_meta.acpd.sessionEnded` names the exit; the
/// session is gone.
#[tokio::test]
async fn child_crash_mid_turn_ends_the_prompt_cancelled_naming_the_exit() {
    let env = Env::new("");
    let client = ready(&env, json!({})).await;
    let sid = client
        .new_session(env.path(), Some(json!({"acpd": {"provider": "fast"}})))
        .await;
    let answer = client.prompt(&sid, "partial\n:crash 3").await.unwrap();
    assert_eq!(answer["stopReason"], "cancelled", "{answer}");
    let ended = &answer["_meta"]["acpd"]["sessionEnded"];
    let message = ended["message"].as_str().unwrap_or("");
    assert!(
        message.contains("\"fast\"") && message.contains("exit code 3"),
        "{answer}"
    );
    assert_eq!(ended["data"]["category"], "process-exit", "{answer}");
    assert_eq!(ended["data"]["exitCode"], 3, "{answer}");
    let e = client.prompt(&sid, "again").await.unwrap_err();
    assert_eq!(i32::from(e.code), -32002, "session not found afterwards");
    let sid2 = client.new_session(env.path(), None).await;
    assert_eq!(
        client.prompt(&sid2, "still here").await.unwrap()["stopReason"],
        "end_turn"
    );
    assert!(client.close().await.success());
}

#[tokio::test]
async fn delegation_start_wait_send_list_dispose() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let providers = client.request("_acpd/providers", json!({})).await.unwrap();
    let names: Vec<&str> = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo", "fast"]);
    assert_eq!(providers["providers"][0]["inheritsParentContext"], false);

    let started = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": text_prompt("one"), "label": "L"}),
        )
        .await
        .unwrap();
    let run = started["runId"].as_str().unwrap().to_string();
    let result = client
        .request("_acpd/subagent/wait", json!({"runId": run}))
        .await
        .unwrap();
    assert_eq!(result["stopReason"], "completed");
    assert_eq!(result["output"][0]["text"], "one");
    let sent = client
        .request(
            "_acpd/subagent/send",
            json!({"runId": run, "prompt": text_prompt("two")}),
        )
        .await
        .unwrap();
    assert_eq!(sent["turn"], 2);
    let result = client
        .request("_acpd/subagent/wait", json!({"runId": run}))
        .await
        .unwrap();
    assert_eq!(
        (
            result["turn"].as_u64(),
            result["output"][0]["text"].as_str()
        ),
        (Some(2), Some("two"))
    );
    let list = client
        .request("_acpd/subagent/list", json!({}))
        .await
        .unwrap();
    assert_eq!(list["runs"][0]["runId"], run.as_str());
    assert_eq!(list["runs"][0]["label"], "L");
    assert_eq!(list["runs"][0]["state"], "settled");
    assert_eq!(list["runs"][0]["depth"], 1);
    client
        .request("_acpd/subagent/dispose", json!({"runId": run}))
        .await
        .unwrap();
    client
        .request("_acpd/subagent/dispose", json!({"runId": run}))
        .await
        .expect("a repeated dispose succeeds");

    let mut events = Vec::new();
    while let Ok((method, params)) = client.notes.try_recv() {
        events.push(format!("{} {}", method, params["turn"]));
        if method == "_acpd/subagent/ended" {
            assert_eq!(params["result"]["runId"], run.as_str());
        }
    }
    assert_eq!(
        events,
        [
            "_acpd/subagent/started 1",
            "_acpd/subagent/ended 1",
            "_acpd/subagent/started 2",
            "_acpd/subagent/ended 2"
        ]
    );
    client.close().await;
}

async fn expect_typed(client: &AcpClient, method: &str, params: Value, name: &str, code: i32) {
    let e = client.request(method, params).await.expect_err(name);
    assert_eq!(i32::from(e.code), code, "{name}: {}", e.message);
    assert_eq!(e.data.as_ref().unwrap()["code"], name, "{}", e.message);
}

#[tokio::test]
async fn delegation_typed_errors() {
    let env = Env::raw(&format!(
        "[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\nmax_concurrent = 1\ncancel_grace = \"200ms\"\n\
         [providers.missing]\ncommand = [\"/nonexistent/agent\"]\n"
    ));
    let client = ready(&env, json!({})).await;
    let start = "_acpd/subagent/start";
    expect_typed(
        &client,
        start,
        json!({"provider": "ghost", "prompt": []}),
        "NO_PROVIDER",
        -33001,
    )
    .await;
    expect_typed(
        &client,
        start,
        json!({"provider": "fast", "prompt": [], "toolFilter": {"allow": ["x"]}}),
        "UNSUPPORTED_CAPABILITY",
        -33002,
    )
    .await;
    expect_typed(
        &client,
        start,
        json!({"provider": "fast", "prompt": [], "cwd": "relative/dir"}),
        "INVALID_CWD",
        -33004,
    )
    .await;
    expect_typed(
        &client,
        start,
        json!({"provider": "fast", "prompt": [], "maxDepth": 0}),
        "DEPTH_EXCEEDED",
        -33005,
    )
    .await;
    expect_typed(
        &client,
        start,
        json!({"provider": "missing", "prompt": []}),
        "START_FAILED",
        -33007,
    )
    .await;
    expect_typed(
        &client,
        start,
        json!({"prompt": "not an array"}),
        "INVALID_REQUEST",
        -33012,
    )
    .await;
    expect_typed(
        &client,
        start,
        json!({"prompt": [], "parentSessionId": "nope"}),
        "INVALID_REQUEST",
        -33012,
    )
    .await;
    expect_typed(
        &client,
        "_acpd/subagent/wait",
        json!({"runId": "nope"}),
        "UNKNOWN_RUN",
        -33008,
    )
    .await;
    expect_typed(
        &client,
        "_acpd/subagent/cancel",
        json!({"runId": "nope"}),
        "UNKNOWN_RUN",
        -33008,
    )
    .await;
    expect_typed(
        &client,
        "_acpd/subagent/dispose",
        json!({"runId": "nope"}),
        "UNKNOWN_RUN",
        -33008,
    )
    .await;

    let run = client
        .request(
            start,
            json!({"provider": "fast", "prompt": text_prompt(":hang")}),
        )
        .await
        .unwrap();
    let run = run["runId"].as_str().unwrap().to_string();
    expect_typed(
        &client,
        start,
        json!({"provider": "fast", "prompt": []}),
        "CAPACITY",
        -33006,
    )
    .await;
    expect_typed(
        &client,
        "_acpd/subagent/send",
        json!({"runId": run, "prompt": []}),
        "RUN_BUSY",
        -33009,
    )
    .await;
    client
        .request("_acpd/subagent/cancel", json!({"runId": run}))
        .await
        .unwrap();
    let result = client
        .request("_acpd/subagent/wait", json!({"runId": run}))
        .await
        .unwrap();
    assert_eq!(result["stopReason"], "aborted");
    client
        .request("_acpd/subagent/dispose", json!({"runId": run}))
        .await
        .unwrap();
    expect_typed(
        &client,
        "_acpd/subagent/send",
        json!({"runId": run, "prompt": []}),
        "RUN_ENDED",
        -33010,
    )
    .await;

    // Another connection cannot touch this one's runs.
    let other = ready(&env, json!({})).await;
    expect_typed(
        &other,
        "_acpd/subagent/wait",
        json!({"runId": run}),
        "UNKNOWN_RUN",
        -33008,
    )
    .await;
    other.close().await;
    client.close().await;
}

#[tokio::test]
async fn subagent_sessions_are_announced_then_streamed_then_idle() {
    let env = Env::new("");
    let mut client = ready(&env, json!({"subagents": {}})).await;
    let parent = client.new_session(env.path(), None).await;
    let started = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": text_prompt("hi\n:permission"), "label": "helper", "parentSessionId": parent}),
        )
        .await
        .unwrap();
    let child = started["sessionId"].as_str().unwrap().to_string();
    let ask = client.next_request().await;
    assert_eq!(
        ask.params["sessionId"],
        child.as_str(),
        "permission asked under the child's id"
    );
    ask.reply(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}));
    client
        .request("_acpd/subagent/wait", json!({"runId": started["runId"]}))
        .await
        .unwrap();

    let mut seen = Vec::new();
    while let Ok((method, params)) = client.notes.try_recv() {
        let entry = match (method.as_str(), params["update"]["sessionUpdate"].as_str()) {
            ("session/update", Some("subagent_update")) => {
                assert_eq!(params["sessionId"], parent.as_str());
                assert_eq!(params["update"]["sessionId"], child.as_str());
                let state = &params["update"]["state"];
                if state["state"] == "running" && params["update"].get("title").is_some() {
                    assert_eq!(params["update"]["title"], "helper");
                    assert_eq!(params["update"]["capabilities"], json!({"cancel": {}}));
                    "announce running".to_string()
                } else {
                    format!(
                        "{} {}",
                        state["state"].as_str().unwrap(),
                        state["stopReason"].as_str().unwrap_or("")
                    )
                    .trim()
                    .to_string()
                }
            }
            ("session/update", _) => {
                assert_eq!(params["sessionId"], child.as_str());
                format!(
                    "chunk {}",
                    params["update"]["content"]["text"].as_str().unwrap().trim()
                )
            }
            (m, _) => m.to_string(),
        };
        seen.push(entry);
    }
    assert_eq!(
        seen,
        [
            "announce running",
            "_acpd/subagent/started",
            "chunk hi",
            "requires_action",
            "running",
            "chunk permission: selected allow",
            "idle end_turn",
            "_acpd/subagent/ended",
        ]
    );
    client.close().await;
}

#[tokio::test]
async fn cancelling_a_subagent_session_or_its_parent() {
    let env = Env::new("");
    let client = ready(&env, json!({"subagents": {}})).await;
    let parent = client.new_session(env.path(), None).await;
    let start = |text: &str| json!({"provider": "fast", "prompt": text_prompt(text), "parentSessionId": parent});
    let a = client
        .request("_acpd/subagent/start", start(":hang"))
        .await
        .unwrap();
    let b = client
        .request("_acpd/subagent/start", start(":hang"))
        .await
        .unwrap();
    client.notify("session/cancel", json!({"sessionId": a["sessionId"]}));
    let ra = client
        .request("_acpd/subagent/wait", json!({"runId": a["runId"]}))
        .await
        .unwrap();
    assert_eq!(ra["stopReason"], "aborted");
    let list = client
        .request("_acpd/subagent/list", json!({}))
        .await
        .unwrap();
    let state_of = |id: &Value| {
        list["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runId"] == *id)
            .unwrap()["state"]
            .clone()
    };
    assert_eq!(
        state_of(&b["runId"]),
        "running",
        "cancelling one child leaves its sibling running"
    );
    client.notify("session/cancel", json!({"sessionId": parent}));
    let rb = client
        .request("_acpd/subagent/wait", json!({"runId": b["runId"]}))
        .await
        .unwrap();
    assert_eq!(
        rb["stopReason"], "aborted",
        "cancelling the parent session cascades"
    );
    client.close().await;
}

#[tokio::test]
async fn without_the_capability_no_subagent_updates_are_sent() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let parent = client.new_session(env.path(), None).await;
    let r = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": text_prompt("hi"), "parentSessionId": parent}),
        )
        .await
        .unwrap();
    client
        .request("_acpd/subagent/wait", json!({"runId": r["runId"]}))
        .await
        .unwrap();
    while let Ok((method, _)) = client.notes.try_recv() {
        assert!(method.starts_with("_acpd/subagent/"), "unexpected {method}");
    }
    client.close().await;
}

#[tokio::test]
async fn parent_eof_mid_turn_leaves_no_process() {
    let env = Env::new("");
    // Subagent Sessions, so the run's own output (its `:pid`) streams to this parent.
    let mut client = ready(&env, json!({"subagents": {}})).await;
    let sid = client
        .new_session(env.path(), Some(json!({"acpd": {"provider": "fast"}})))
        .await;
    let _turn = client.send("session/prompt", json!({"sessionId": sid, "prompt": text_prompt(":pid\n:grandchild\n:ignore-eof\n:ignore-term\n:hang-deaf")}));
    let (_, n1) = client.next_note().await;
    let (_, n2) = client.next_note().await;
    let bridge_pid = pid_after(n1["update"]["content"]["text"].as_str().unwrap(), "pid ");
    let grandchild = pid_after(
        n2["update"]["content"]["text"].as_str().unwrap(),
        "grandchild ",
    );
    let run = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": text_prompt(":pid\n:hang"), "parentSessionId": sid}),
        )
        .await
        .unwrap();
    let run_session = run["sessionId"].as_str().unwrap().to_string();
    let run_pid = loop {
        let (method, params) = client.next_note().await;
        let text = params["update"]["content"]["text"].as_str().unwrap_or("");
        if method == "session/update" && params["sessionId"] == run_session.as_str() {
            break pid_after(text, "pid ");
        }
    };
    let list = client
        .request("_acpd/subagent/list", json!({}))
        .await
        .unwrap();
    assert_eq!(list["runs"][0]["runId"], run["runId"]);
    for pid in [bridge_pid, grandchild, run_pid] {
        assert!(running(pid), "process {pid} is not running mid-turn");
    }
    let status = client.close().await;
    assert!(
        status.success(),
        "acpd exits 0 after the parent's EOF: {status:?}"
    );
    for pid in [bridge_pid, grandchild, run_pid] {
        assert!(
            !exists(pid),
            "process {pid} outlived the parent's connection"
        );
    }
}

/// Exists and is not a zombie.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn output_schema_is_enforced_by_acpd() {
    let env = Env::new("");
    let client = ready(&env, json!({})).await;
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let run = |text: &str| json!({"provider": "fast", "prompt": text_prompt(text), "outputSchema": schema});
    let a = client
        .request("_acpd/subagent/start", run("{\"n\": 3}"))
        .await
        .unwrap();
    let r = client
        .request("_acpd/subagent/wait", json!({"runId": a["runId"]}))
        .await
        .unwrap();
    assert_eq!(r["stopReason"], "completed", "{r}");
    assert_eq!(r["structured"], json!({"n": 3}));
    let b = client
        .request("_acpd/subagent/start", run("{\"n\": \"three\"}"))
        .await
        .unwrap();
    let r = client
        .request("_acpd/subagent/wait", json!({"runId": b["runId"]}))
        .await
        .unwrap();
    assert_eq!(
        (r["stopReason"].as_str(), r["failure"]["category"].as_str()),
        (Some("error"), Some("output-schema"))
    );
    assert!(r.get("structured").is_none());
    assert!(r["diagnostic"].as_str().unwrap().contains("outputSchema"));
    let remote = json!({"provider": "fast", "prompt": [], "outputSchema": {"$ref": "https://example.com/schema.json"}});
    expect_typed(
        &client,
        "_acpd/subagent/start",
        remote,
        "UNSUPPORTED_SCHEMA",
        -33003,
    )
    .await;
    client.close().await;
}

#[tokio::test]
async fn persona_goes_to_agents_that_take_a_system_prompt() {
    let env = Env::new(&format!(
        "[providers.sp]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--system-prompt\"]\n"
    ));
    let client = ready(&env, json!({})).await;
    let before = client.request("_acpd/providers", json!({})).await.unwrap();
    let sp = |v: &Value| {
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "sp")
            .unwrap()["capabilities"]["persona"]
            .clone()
    };
    assert_eq!(sp(&before), false, "unknown until probed");
    let a = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "sp", "prompt": text_prompt("hi"), "persona": "be terse"}),
        )
        .await
        .unwrap();
    let r = client
        .request("_acpd/subagent/wait", json!({"runId": a["runId"]}))
        .await
        .unwrap();
    assert_eq!(r["output"][0]["text"], "system: be terse\nhi");
    let after = client.request("_acpd/providers", json!({})).await.unwrap();
    assert_eq!(sp(&after), true, "learned by the probe");
    let fast = json!({"provider": "fast", "prompt": [], "persona": "be terse"});
    expect_typed(
        &client,
        "_acpd/subagent/start",
        fast,
        "UNSUPPORTED_CAPABILITY",
        -33002,
    )
    .await;
    client.close().await;
}

#[tokio::test]
async fn an_escaped_descendant_is_killed_at_dispose_and_reaped() {
    let env = Env::new("");
    let mut client = ready(&env, json!({})).await;
    let run = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": text_prompt(":escapee 1500")}),
        )
        .await
        .unwrap();
    let r = client
        .request("_acpd/subagent/wait", json!({"runId": run["runId"]}))
        .await
        .unwrap();
    let escapee = pid_after(r["output"][0]["text"].as_str().unwrap(), "escapee ");
    assert!(exists(escapee), "escapee {escapee} is not running");
    client
        .request("_acpd/subagent/dispose", json!({"runId": run["runId"]}))
        .await
        .unwrap();
    // Out of the group, but still the run's (its cgroup, or its tree token): the teardown
    // killed it, and acpd — the subreaper that adopted it when its parent died — reaps it:
    // no zombie stays behind while acpd lives on.
    assert!(
        eventually(std::time::Duration::from_secs(10), || !exists(escapee)),
        "escapee {escapee} survived dispose or left a zombie"
    );
    // Reaped by a live acpd, not by its exit: acpd is still running and still serving.
    assert!(
        client.process.try_wait().unwrap().is_none(),
        "acpd exited instead of living on"
    );
    client
        .request("_acpd/subagent/list", json!({}))
        .await
        .expect("acpd still serves after reaping the escapee");
    client.close().await;
}

#[tokio::test]
async fn waiting_on_a_permission_answer_is_not_idleness() {
    let env = Env::raw(&format!(
        "[providers.quick]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\nidle_timeout = \"300ms\"\ncancel_grace = \"200ms\"\neof_grace = \"200ms\"\nterm_grace = \"200ms\"\n"
    ));
    let mut client = ready(&env, json!({})).await;
    let run = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "quick", "prompt": text_prompt(":permission")}),
        )
        .await
        .unwrap();
    let ask = client.next_request().await;
    // The person takes longer than idle_timeout to decide; that is not the child hanging.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    ask.reply(json!({"outcome": {"outcome": "selected", "optionId": "allow"}}));
    let r = client
        .request("_acpd/subagent/wait", json!({"runId": run["runId"]}))
        .await
        .unwrap();
    assert_eq!(r["stopReason"], "completed", "{r}");
    assert_eq!(r["output"][0]["text"], "permission: selected allow\n");
    client.close().await;
}

/// acpd grows the pipe it writes to its parent through to 1 MiB: a stream toward a parent that
/// reads in large chunks then fills it far less often.
#[test]
fn the_pipe_to_the_parent_is_grown() {
    use nix::fcntl::{FcntlArg, fcntl};
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let env = Env::new("");
    let (read, write) = std::io::pipe().unwrap();
    assert_eq!(fcntl(&read, FcntlArg::F_GETPIPE_SZ).unwrap(), 64 << 10);
    let mut child = env
        .acpd()
        .arg("stdio")
        .stdin(Stdio::piped())
        .stdout(write)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1}}}}"#
    )
    .unwrap();
    let mut stdout = BufReader::new(read);
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains(r#""id":1"#), "{line}");
    assert_eq!(
        fcntl(stdout.get_ref(), FcntlArg::F_GETPIPE_SZ).unwrap(),
        1 << 20
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
}
