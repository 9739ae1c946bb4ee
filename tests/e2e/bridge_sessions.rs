#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The transparent bridge end to end, as an editor sees it: real `acpd stdio` processes whose
//! providers are `acpd agent echo` with its ACP v1 flags (`--sessions`, `--auth`,
//! `--prompt-caps`, `--subagents`). What `initialize` mirrors (and the durable probe cache
//! answering a second process), sessions outliving the process that made them (list, load,
//! resume), fork / close / delete, prompt content fitted to the agent, authentication replayed
//! on later children, a child's subagent sessions under minted ids, and `_` extensions both
//! ways. Every wait is for a message, bounded by the raw client's timeout.

use crate::common;

use std::path::{Path, PathBuf};

use common::raw::*;
use common::*;
use serde_json::{Value, json};

/// A provider: its name and the `acpd agent echo` flags it runs with.
struct Provider {
    name: &'static str,
    command: Vec<String>,
}

fn echo(name: &'static str, flags: &[&str]) -> Provider {
    let mut command = vec![BIN.to_string(), "agent".into(), "echo".into()];
    command.extend(flags.iter().map(|f| f.to_string()));
    Provider { name, command }
}

/// A config of `providers`, the first the default; fast graces so teardown stays quick.
fn write_config(env: &Env, providers: &[Provider]) {
    let mut toml = format!("default_provider = \"{}\"\n", providers[0].name);
    for p in providers {
        let argv: Vec<String> = p
            .command
            .iter()
            .map(|a| serde_json::to_string(a).unwrap())
            .collect();
        toml.push_str(&format!(
            "\n[providers.{}]\ncommand = [{}]\ncancel_grace = \"300ms\"\n\
             eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            p.name,
            argv.join(", ")
        ));
    }
    std::fs::write(&env.config, toml).unwrap();
}

/// An environment whose providers are made knowing its directory (for `--sessions DIR`).
fn env_with(providers: impl FnOnce(&Path) -> Vec<Provider>) -> Env {
    let env = Env::raw("");
    let list = providers(env.path());
    write_config(&env, &list);
    env
}

/// One provider, `main`: the echo agent keeping its sessions under `echo-sessions/` (so they
/// can be loaded).
fn one_echo_keeping_sessions() -> Env {
    env_with(|dir| {
        let sessions = dir.join("echo-sessions");
        vec![echo("main", &["--sessions", &dir_arg(&sessions)])]
    })
}

/// The echo's session files: `<id>.json` only, never the temporary file a write in progress
/// renames into place (it may vanish between listing and reading).
fn echo_session_files(env: &Env) -> Vec<PathBuf> {
    std::fs::read_dir(env.path().join("echo-sessions"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect()
}

fn dir_arg(dir: &Path) -> String {
    dir.to_str().unwrap().to_string()
}

/// A directory under the environment, created.
fn subdir(env: &Env, name: &str) -> PathBuf {
    let dir = env.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `acpd stdio`, initialized with `caps`; returns the client and the `initialize` result.
fn connect(env: &Env, caps: Value) -> (Raw, Value) {
    let mut raw = Raw::stdio(env);
    let init = raw.initialize(caps);
    assert!(init.is_object(), "initialize failed; log: {}", raw.log());
    (raw, init)
}

/// Sends a request; returns the lines acpd wrote before its answer, and the answer.
fn call_seen(raw: &mut Raw, method: &str, params: Value) -> (Vec<Line>, Value) {
    let start = raw.seen.len();
    let answer = raw.call(method, params);
    (raw.seen[start..].to_vec(), answer)
}

/// The error of a request that must fail.
fn error_of(raw: &mut Raw, method: &str, params: Value) -> Value {
    let answer = raw.call(method, params);
    assert!(
        answer.get("result").is_none(),
        "{method} must fail: {answer}"
    );
    answer["error"].clone()
}

fn code_of(raw: &mut Raw, method: &str, params: Value) -> i64 {
    error_of(raw, method, params)["code"].as_i64().unwrap()
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// Prompts with `blocks`; returns the lines before the answer and the stop reason.
fn prompt_blocks(raw: &mut Raw, session: &str, blocks: Value) -> (Vec<Line>, String) {
    let (before, answer) = call_seen(
        raw,
        "session/prompt",
        json!({"sessionId": session, "prompt": blocks}),
    );
    let stop = answer["result"]["stopReason"]
        .as_str()
        .unwrap_or_else(|| panic!("prompt failed: {answer}"))
        .to_string();
    (before, stop)
}

/// Prompts with one text block; returns the agent text streamed under `session`.
fn say(raw: &mut Raw, session: &str, t: &str) -> String {
    let (before, stop) = prompt_blocks(raw, session, json!([text(t)]));
    assert_eq!(stop, "end_turn");
    agent_text(&before, session)
}

fn agent_text(lines: &[Line], session: &str) -> String {
    updates(lines, session)
        .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

/// The `session/update`s among `lines` under `session`.
fn updates<'a>(lines: &'a [Line], session: &'a str) -> impl Iterator<Item = &'a Value> {
    lines
        .iter()
        .filter(|l| l.method() == "session/update")
        .filter(move |l| l.value["params"]["sessionId"] == session)
        .map(|l| &l.value["params"]["update"])
}

/// (kind, text) of every `session/update` among `lines`, asserting each is under `session`.
fn replay(lines: &[Line], session: &str) -> Vec<(String, String)> {
    lines
        .iter()
        .filter(|l| l.method() == "session/update")
        .map(|l| {
            assert_eq!(l.value["params"]["sessionId"], session, "{}", l.text());
            let u = &l.value["params"]["update"];
            (
                u["sessionUpdate"].as_str().unwrap().to_string(),
                u["content"]["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn new_in(raw: &mut Raw, cwd: &Path, provider: &str) -> String {
    raw.new_session(cwd, provider)
}

/// The `session/list` entries (all pages of acpd's listing).
fn list_all(raw: &mut Raw, params: Value) -> Vec<Value> {
    let mut all = Vec::new();
    let mut params = params;
    loop {
        let page = raw.ok("session/list", params.clone());
        all.extend(page["sessions"].as_array().unwrap().iter().cloned());
        match page.get("nextCursor") {
            Some(next) => params["cursor"] = next.clone(),
            None => return all,
        }
    }
}

fn ids_of(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["sessionId"].as_str().unwrap().to_string())
        .collect()
}

fn titles_of(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["title"].as_str().unwrap_or("<none>").to_string())
        .collect()
}

/// Ends `acpd stdio` the way an editor does (EOF) and waits for its output to close.
fn finish(mut raw: Raw) {
    raw.close_write();
    assert!(
        raw.drain_to_eof(std::time::Duration::from_secs(10)),
        "acpd stdio did not end after EOF"
    );
    let mut process = raw.process.take().unwrap();
    let status = process.wait().unwrap();
    assert!(status.success(), "acpd stdio exited {status}");
}

fn load_params(session: &str, cwd: &Path) -> Value {
    json!({"sessionId": session, "cwd": cwd, "mcpServers": []})
}

/// Runs the echo directly (no acpd) and returns its `initialize` result.
fn echo_initialize(flags: &[&str]) -> Value {
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new(BIN)
        .args(["agent", "echo"])
        .args(flags)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": 1, "clientCapabilities": {}}})
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    drop(stdin);
    let _ = child.wait();
    let answer: Value = serde_json::from_str(&line).unwrap();
    answer["result"].clone()
}

fn starts(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn initialize_mirrors_the_default_agent_and_a_second_process_answers_from_the_cache() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::raw("");
    let sessions = subdir(&env, "echo-sessions");
    let flags: Vec<String> = [
        "--sessions",
        &dir_arg(&sessions),
        "--prompt-caps",
        "image,embedded",
        "--subagents",
        "--auth",
        "key",
    ]
    .map(str::to_string)
    .to_vec();
    // The agent is a script that notes every start, so a probe would show.
    let log = env.path().join("starts.log");
    let script = env.path().join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho start >> '{}'\nexec '{}' agent echo \"$@\"\n",
            log.display(),
            BIN
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = vec![script.to_str().unwrap().to_string()];
    command.extend(flags.iter().cloned());
    write_config(
        &env,
        &[
            Provider {
                name: "main",
                command,
            },
            echo("other", &[]),
        ],
    );
    let direct = echo_initialize(&flags.iter().map(String::as_str).collect::<Vec<_>>());

    let (first, init) = connect(&env, json!({}));
    assert_eq!(init["protocolVersion"], 1);
    let caps = &init["agentCapabilities"];
    assert_eq!(caps["loadSession"], true);
    assert_eq!(
        caps["promptCapabilities"],
        json!({"image": true, "audio": false, "embeddedContext": true})
    );
    for name in ["list", "resume", "close", "delete", "fork", "subagents"] {
        assert_eq!(caps["sessionCapabilities"][name], json!({}), "{name}");
    }
    assert_eq!(init["authMethods"], json!([{"id": "key", "name": "key"}]));
    assert_eq!(init["agentInfo"]["name"], "acpd-echo");
    let acpd = &caps["_meta"]["acpd"];
    assert_eq!(acpd["providers"], json!(["echo", "main", "other"]));
    assert!(
        acpd["methods"]
            .as_array()
            .unwrap()
            .contains(&json!("_acpd/subagent/start")),
        "{acpd}"
    );
    // Everything else is the agent's own answer, as it gave it.
    let mut mirrored = init.clone();
    let meta = mirrored["agentCapabilities"]["_meta"]
        .as_object_mut()
        .unwrap();
    meta.remove("acpd");
    if meta.is_empty() {
        mirrored["agentCapabilities"]
            .as_object_mut()
            .unwrap()
            .remove("_meta");
    }
    assert_eq!(mirrored, direct);
    finish(first);
    assert!(starts(&log) >= 1, "the first process asked the agent");

    // A second process answers the same without starting the agent: the durable cache.
    let before = starts(&log);
    let (mut second, again) = connect(&env, json!({}));
    assert_eq!(again, init);
    // Two children now (authenticate's and the session's) and no probe among them.
    assert_eq!(
        second.ok("authenticate", json!({"methodId": "key"})),
        json!({})
    );
    let sid = new_in(&mut second, env.path(), "main");
    assert_eq!(say(&mut second, &sid, "hi"), "hi");
    assert_eq!(starts(&log), before + 2, "a probe started the agent again");
    finish(second);

    // Another command is another agent: the cache does not answer for it.
    let mut command = vec![script.to_str().unwrap().to_string()];
    command.extend(["--prompt-caps".to_string(), "audio".to_string()]);
    write_config(
        &env,
        &[
            Provider {
                name: "main",
                command,
            },
            echo("other", &[]),
        ],
    );
    let before = starts(&log);
    let (third, changed) = connect(&env, json!({}));
    assert_eq!(
        changed["agentCapabilities"]["promptCapabilities"],
        json!({"image": false, "audio": true, "embeddedContext": false})
    );
    assert_eq!(changed["authMethods"], json!([]));
    assert_eq!(starts(&log), before + 1, "one probe of the new command");
    finish(third);
}

#[test]
fn sessions_outlive_the_process_list_load_and_resume_them() {
    let env = env_with(|dir| {
        let sessions = dir.join("echo-sessions");
        vec![echo(
            "main",
            &["--sessions", &dir_arg(&sessions), "--list-page", "2"],
        )]
    });
    let (a, b) = (subdir(&env, "a"), subdir(&env, "b"));

    // One session through acpd, then its process ends.
    let (mut first, _) = connect(&env, json!({}));
    let s1 = new_in(&mut first, &a, "main");
    assert!(s1.starts_with("acpd-"), "{s1}");
    assert_eq!(say(&mut first, &s1, "s1 first\nmore"), "s1 first\nmore");
    finish(first);

    // Three more the agent made for someone else (another acpd with its own session map): this
    // acpd learns of them only from the agent's listing, two to a page.
    let elsewhere = Env::raw("");
    std::fs::copy(&env.config, &elsewhere.config).unwrap();
    let (mut other, _) = connect(&elsewhere, json!({}));
    for (cwd, title) in [(&a, "d1"), (&b, "d2"), (&a, "d3")] {
        let sid = new_in(&mut other, cwd, "main");
        say(&mut other, &sid, title);
    }
    finish(other);

    let (mut second, _) = connect(&env, json!({}));
    let all = list_all(&mut second, json!({}));
    let mut titles = titles_of(&all);
    titles.sort();
    assert_eq!(titles, ["d1", "d2", "d3", "s1 first"], "{all:?}");
    let by_title = |entries: &[Value], title: &str| -> Value {
        entries
            .iter()
            .find(|e| e["title"] == title)
            .unwrap_or_else(|| panic!("no {title:?} in {entries:?}"))
            .clone()
    };
    let id_of = |entries: &[Value], title: &str| -> String {
        by_title(entries, title)["sessionId"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(id_of(&all, "s1 first"), s1, "the session keeps its acpd id");
    let ids = ids_of(&all);
    for entry in &all {
        assert!(
            entry["sessionId"].as_str().unwrap().starts_with("acpd-"),
            "{entry}"
        );
        assert_eq!(entry["_meta"]["acpd"]["provider"], "main", "{entry}");
        assert!(
            entry["updatedAt"].as_str().unwrap().ends_with('Z'),
            "{entry}"
        );
    }
    // Newest first (to the second: the session map keeps seconds).
    let times: Vec<&str> = all
        .iter()
        .map(|e| e["updatedAt"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 4, "{ids:?}");
    assert_eq!(by_title(&all, "d2")["cwd"], b.to_str().unwrap());
    assert_eq!(by_title(&all, "s1 first")["cwd"], a.to_str().unwrap());
    // One page of acpd's (50): no cursor; the cwd filter; a cursor acpd did not make.
    let page = second.ok("session/list", json!({}));
    assert!(page.get("nextCursor").is_none(), "{page}");
    let in_a = list_all(&mut second, json!({"cwd": a}));
    let mut titles = titles_of(&in_a);
    titles.sort();
    assert_eq!(titles, ["d1", "d3", "s1 first"]);
    let in_b = list_all(&mut second, json!({"cwd": b}));
    assert_eq!(ids_of(&in_b), [id_of(&all, "d2")]);
    assert_eq!(
        code_of(&mut second, "session/list", json!({"cursor": "not-ours"})),
        -32602
    );
    // Listing again mints nothing new.
    let mut again = ids_of(&list_all(&mut second, json!({})));
    again.sort();
    assert_eq!(again, unique);

    // Load replays the history under the acpd id, before the answer; then the session works.
    let (before, answer) = call_seen(&mut second, "session/load", load_params(&s1, &a));
    assert!(answer.get("error").is_none(), "{answer}");
    assert!(
        !answer.to_string().contains("echo-"),
        "the answer names the agent's id: {answer}"
    );
    assert_eq!(
        replay(&before, &s1),
        pairs(&[
            ("user_message_chunk", "s1 first\nmore"),
            ("agent_message_chunk", "s1 first\nmore"),
        ])
    );
    assert_eq!(say(&mut second, &s1, "again"), "again");

    // Resume (of a session adopted from the listing) answers without a replay.
    let d1 = id_of(&all, "d1");
    let (before, answer) = call_seen(&mut second, "session/resume", load_params(&d1, &a));
    assert!(answer.get("error").is_none(), "{answer}");
    assert_eq!(replay(&before, &d1), Vec::<(String, String)>::new());
    assert!(
        before.iter().all(|l| l.method() != "session/update"),
        "{:?}",
        second.seen_text()
    );
    assert_eq!(say(&mut second, &d1, "resumed"), "resumed");
    finish(second);

    // A third process loads the resumed session: its history grew by the last turn.
    let (mut third, _) = connect(&env, json!({}));
    let (before, _) = call_seen(&mut third, "session/load", load_params(&d1, &a));
    assert_eq!(
        replay(&before, &d1),
        pairs(&[
            ("user_message_chunk", "d1"),
            ("agent_message_chunk", "d1"),
            ("user_message_chunk", "resumed"),
            ("agent_message_chunk", "resumed"),
        ])
    );
    finish(third);
}

/// codex-acp ends its listing with `"nextCursor": null` where others leave the key out; the
/// editor sees from acpd what the agent says, on acpd's last page (issue 19). Without the
/// null the key stays out (sessions_outlive_the_process_list_load_and_resume_them).
#[test]
fn an_agents_null_next_cursor_reaches_the_editor() {
    let env = env_with(|dir| {
        let sessions = dir.join("echo-sessions");
        let flags = ["--sessions", &dir_arg(&sessions), "--list-page", "2"];
        vec![echo("main", &[&flags[..], &["--null-cursor"]].concat())]
    });
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    // Three sessions: the agent's listing takes two pages, the last one ending in null.
    let ids: Vec<String> = (0..3).map(|_| new_in(&mut raw, &cwd, "main")).collect();
    let page = raw.ok("session/list", json!({"cwd": cwd}));
    assert_eq!(page.get("nextCursor"), Some(&Value::Null), "{page}");
    let mut listed = ids_of(page["sessions"].as_array().unwrap());
    listed.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(listed, want, "{page}");
    finish(raw);
}

#[test]
fn fork_close_delete_and_unknown_ids() {
    let env = one_echo_keeping_sessions();
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, &cwd, "main");
    assert_eq!(say(&mut raw, &s, "one"), "one");

    // Fork: a new acpd id, usable at once, with the history carried.
    let forked = raw.ok("session/fork", load_params(&s, &cwd));
    let f = forked["sessionId"].as_str().unwrap().to_string();
    assert!(f.starts_with("acpd-") && f != s, "{forked}");
    assert!(!forked.to_string().contains("echo-"), "{forked}");
    let (before, stop) = prompt_blocks(&mut raw, &f, json!([text("two")]));
    assert_eq!(stop, "end_turn");
    assert_eq!(agent_text(&before, &f), "two");
    assert_eq!(
        agent_text(&before, &s),
        "",
        "the fork's turn is not the original's"
    );
    // The original goes on by itself.
    assert_eq!(say(&mut raw, &s, "three"), "three");

    // Close, then load the fork again: its history is the original's first turn and its own.
    assert_eq!(raw.ok("session/close", json!({"sessionId": f})), json!({}));
    let (before, answer) = call_seen(&mut raw, "session/load", load_params(&f, &cwd));
    assert!(answer.get("error").is_none(), "load after close: {answer}");
    assert_eq!(
        replay(&before, &f),
        pairs(&[
            ("user_message_chunk", "one"),
            ("agent_message_chunk", "one"),
            ("user_message_chunk", "two"),
            ("agent_message_chunk", "two"),
        ])
    );
    assert_eq!(say(&mut raw, &f, "four"), "four");
    let listed = ids_of(&list_all(&mut raw, json!({})));
    assert!(listed.contains(&s) && listed.contains(&f), "{listed:?}");
    assert_eq!(listed.len(), 2, "{listed:?}");

    // Delete (of a session open here): it ends, and it is gone from the list and for load.
    assert_eq!(raw.ok("session/delete", json!({"sessionId": s})), json!({}));
    assert_eq!(
        ids_of(&list_all(&mut raw, json!({}))),
        std::slice::from_ref(&f)
    );
    assert_eq!(
        code_of(
            &mut raw,
            "session/prompt",
            json!({"sessionId": s, "prompt": [text("x")]})
        ),
        -32002
    );
    assert_eq!(
        code_of(&mut raw, "session/load", load_params(&s, &cwd)),
        -32002
    );
    // The fork is untouched.
    assert_eq!(say(&mut raw, &f, "five"), "five");

    // Ids acpd never gave: -32002, but a delete answers as the agent does for an id it does
    // not have (the echo's, like claude-agent-acp's and codex-acp's, is idempotent).
    let ghost = "acpd-00000000-0000-4000-8000-000000000000";
    for method in [
        "session/load",
        "session/resume",
        "session/fork",
        "session/close",
    ] {
        let e = error_of(&mut raw, method, load_params(ghost, &cwd));
        assert_eq!(e["code"], -32002, "{method}: {e}");
    }
    assert_eq!(
        raw.ok("session/delete", json!({"sessionId": ghost})),
        json!({})
    );
    assert_eq!(
        code_of(
            &mut raw,
            "session/prompt",
            json!({"sessionId": ghost, "prompt": [text("x")]})
        ),
        -32002
    );
    finish(raw);

    // Deleted for the agent too: a new process's listing (asked of the agent) lacks it.
    let (mut next, _) = connect(&env, json!({}));
    assert_eq!(ids_of(&list_all(&mut next, json!({}))), [f]);
    finish(next);
}

#[test]
fn prompt_content_is_fitted_to_each_agent() {
    let env = env_with(|_| {
        vec![
            echo("main", &["--prompt-caps", "image,embedded"]),
            echo("plain", &[]),
        ]
    });
    let (mut raw, init) = connect(&env, json!({}));
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"],
        json!({"image": true, "audio": false, "embeddedContext": true})
    );
    let rich = new_in(&mut raw, env.path(), "main");
    let plain = new_in(&mut raw, env.path(), "plain");
    let resource = json!({"type": "resource", "resource":
        {"uri": "file:///notes/b.md", "mimeType": "text/markdown", "text": "# b"}});
    let image = json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="});
    let audio = json!({"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="});

    // An agent without embeddedContext gets a link to the resource.
    let (before, stop) =
        prompt_blocks(&mut raw, &plain, json!([text(":blocks"), resource.clone()]));
    assert_eq!(stop, "end_turn");
    assert_eq!(
        agent_text(&before, &plain),
        "block resource_link file:///notes/b.md\n"
    );
    // An image it did not advertise is refused, naming the capability; the session goes on.
    let e = error_of(
        &mut raw,
        "session/prompt",
        json!({"sessionId": plain, "prompt": [text(":blocks"), image.clone()]}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("promptCapabilities.image"), "{e}");
    assert_eq!(say(&mut raw, &plain, "still here"), "still here");

    // The agent that takes them gets them as they are.
    let (before, stop) = prompt_blocks(&mut raw, &rich, json!([text(":blocks"), resource, image]));
    assert_eq!(stop, "end_turn");
    assert_eq!(
        agent_text(&before, &rich),
        "block resource file:///notes/b.md\nblock image image/png\n"
    );
    let e = error_of(
        &mut raw,
        "session/prompt",
        json!({"sessionId": rich, "prompt": [text(":blocks"), audio]}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("promptCapabilities.audio"),
        "{e}"
    );
    finish(raw);
}

#[test]
fn authentication_passes_through_and_is_replayed_on_later_children() {
    let env = env_with(|dir| {
        let sessions = dir.join("echo-sessions");
        vec![echo(
            "main",
            &["--auth", "key", "--sessions", &dir_arg(&sessions)],
        )]
    });
    let (mut raw, init) = connect(&env, json!({}));
    assert_eq!(init["authMethods"], json!([{"id": "key", "name": "key"}]));

    // Before authenticate: the agent's own refusal, code and data (a login UI reads them),
    // its message followed by what would satisfy it.
    let e = error_of(
        &mut raw,
        "session/new",
        json!({"cwd": env.path(), "mcpServers": []}),
    );
    assert_eq!(e["code"], -32000, "{e}");
    assert_eq!(e["data"], json!({"authMethods": ["key"]}));
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with("Authentication required (acpd: "),
        "{e}"
    );
    assert!(message.contains("env_file in the provider's config"), "{e}");
    let e = error_of(&mut raw, "authenticate", json!({"methodId": "nope"}));
    assert_eq!(
        e,
        json!({"code": -32602, "message": "Invalid params: unknown auth method \"nope\""})
    );
    // A failed authenticate is not remembered.
    assert_eq!(
        code_of(
            &mut raw,
            "session/new",
            json!({"cwd": env.path(), "mcpServers": []})
        ),
        -32000
    );

    assert_eq!(
        raw.ok("authenticate", json!({"methodId": "key"})),
        json!({})
    );
    // Every later child (each session's own) was authenticated the same way.
    let s1 = new_in(&mut raw, env.path(), "main");
    let s2 = new_in(&mut raw, env.path(), "main");
    assert_ne!(s1, s2);
    assert_eq!(say(&mut raw, &s1, ":auth"), "auth key\n");
    assert_eq!(say(&mut raw, &s2, ":auth"), "auth key\n");
    finish(raw);

    // Another connection has not authenticated: the agent refuses its new and its load.
    let (mut other, _) = connect(&env, json!({}));
    assert_eq!(
        code_of(
            &mut other,
            "session/new",
            json!({"cwd": env.path(), "mcpServers": []})
        ),
        -32000
    );
    let e = error_of(&mut other, "session/load", load_params(&s1, env.path()));
    assert_eq!(e["code"], -32000, "{e}");
    assert_eq!(e["data"], json!({"authMethods": ["key"]}), "{e}");
    // Once it has, the children that list and load are authenticated too.
    assert_eq!(
        other.ok("authenticate", json!({"methodId": "key"})),
        json!({})
    );
    let mut listed = ids_of(&list_all(&mut other, json!({})));
    listed.sort();
    let mut made = vec![s1.clone(), s2];
    made.sort();
    assert_eq!(listed, made);
    let (before, answer) = call_seen(&mut other, "session/load", load_params(&s1, env.path()));
    assert!(answer.get("error").is_none(), "{answer}");
    assert_eq!(
        replay(&before, &s1),
        pairs(&[
            ("user_message_chunk", ":auth"),
            ("agent_message_chunk", "auth key\n"),
        ])
    );
    assert_eq!(say(&mut other, &s1, ":auth"), "auth key\n");
    finish(other);
}

#[test]
fn subagent_sessions_reach_an_editor_that_opted_in_under_minted_ids() {
    let env = env_with(|_| vec![echo("main", &["--subagents"])]);
    let (mut raw, init) = connect(&env, json!({"subagents": {}}));
    assert_eq!(
        init["agentCapabilities"]["sessionCapabilities"]["subagents"],
        json!({})
    );
    let s = new_in(&mut raw, env.path(), "main");
    let sub1 = format!("{s}.1");

    let (before, stop) = prompt_blocks(&mut raw, &s, json!([text(":subagent hi")]));
    assert_eq!(stop, "end_turn");
    assert_eq!(before.len(), 3, "{:?}", raw.seen_text());
    let announce = &before[0].value["params"];
    assert_eq!(announce["sessionId"], s);
    assert_eq!(
        announce["update"],
        json!({"sessionUpdate": "subagent_update", "sessionId": sub1,
               "title": "echo sub", "capabilities": {"cancel": {}}})
    );
    assert_eq!(before[1].value["params"]["sessionId"], sub1);
    assert_eq!(agent_text(&before[1..2], &sub1), "hi\n");
    let done = agent_text(&before[2..], &s);
    assert!(
        done.starts_with("subagent ") && done.ends_with(" done\n"),
        "{done:?}"
    );

    // A hanging subagent: cancelling its minted id reaches the child as the cancel of its own.
    let sub2 = format!("{s}.2");
    let id = raw.send(
        "session/prompt",
        json!({"sessionId": s, "prompt": [text(":subagent-hang waiting")]}),
    );
    let start = raw.seen.len();
    raw.until_chunk(&sub2, "waiting");
    let announced = raw.seen[start..].iter().any(|l| {
        l.value["params"]["sessionId"] == s
            && l.value["params"]["update"]["sessionUpdate"] == "subagent_update"
            && l.value["params"]["update"]["sessionId"] == sub2
    });
    assert!(announced, "{:?}", raw.seen_text());
    raw.line(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sub2}})
            .to_string(),
    );
    let answer = raw.answer(&json!(id));
    assert_eq!(
        answer.value["result"]["stopReason"],
        "end_turn",
        "{}",
        answer.text()
    );
    assert_eq!(agent_text(&raw.seen[start..], &s), "subagent cancelled\n");
    finish(raw);

    // An editor that did not opt in sees nothing under any other id.
    let (mut shy, _) = connect(&env, json!({}));
    let s = new_in(&mut shy, env.path(), "main");
    let (before, stop) = prompt_blocks(
        &mut shy,
        &s,
        json!([text(":subagent hi\n:foreign-session echo-other\nafter")]),
    );
    assert_eq!(stop, "end_turn");
    for line in &before {
        assert_eq!(line.value["params"]["sessionId"], s, "{}", line.text());
        assert!(
            line.value["params"]["update"].get("sessionId").is_none(),
            "{}",
            line.text()
        );
    }
    assert_eq!(
        agent_text(&before, &s),
        "subagent: client did not opt in\nafter"
    );
    finish(shy);
}

#[test]
fn extensions_pass_both_ways_with_the_session_id_remapped() {
    let env = env_with(|_| vec![echo("main", &[])]);
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, env.path(), "main");

    // A request on a session reaches its agent, under the agent's own session id.
    let answer = raw.ok("_echo/ping", json!({"sessionId": s, "n": 1}));
    assert_eq!(answer["echo"], "_echo/ping", "{answer}");
    assert_eq!(answer["params"]["n"], 1, "{answer}");
    let child_id = answer["params"]["sessionId"].as_str().unwrap();
    assert!(child_id.starts_with("echo-"), "{answer}");
    // One naming no session is asked of a new child, as the agent would be directly.
    let answer = raw.ok("_echo/ping", json!({"n": 1}));
    assert_eq!(answer, json!({"echo": "_echo/ping", "params": {"n": 1}}));
    // One the agent does not know is its -32601, passed back unchanged.
    assert_eq!(
        code_of(&mut raw, "_x/ping", json!({"sessionId": s})),
        -32601
    );

    // A notification on a session reaches its agent.
    raw.line(
        &json!({"jsonrpc": "2.0", "method": "_x/note", "params": {"sessionId": s, "k": true}})
            .to_string(),
    );
    assert_eq!(say(&mut raw, &s, ":ext"), "ext _x/note\n");

    // The agent's request reaches the editor naming the acpd session; the reply goes back.
    for (reply, expected) in [
        (json!({"result": {"pong": 1}}), "ext-reply {\"pong\":1}\n"),
        (
            json!({"error": {"code": -32601, "message": "no"}}),
            "ext-error -32601\n",
        ),
    ] {
        let id = raw.send_prompt(&s, ":ext-request _y/q");
        let start = raw.seen.len();
        let request = loop {
            let line = raw.next();
            if line.is_request() {
                break line;
            }
            raw.seen.push(line);
        };
        assert_eq!(request.method(), "_y/q", "{}", request.text());
        assert_eq!(request.value["params"], json!({"sessionId": s}));
        let mut answer = reply;
        answer["jsonrpc"] = json!("2.0");
        answer["id"] = request.value["id"].clone();
        raw.line(&answer.to_string());
        let done = raw.answer(&json!(id));
        assert_eq!(done.value["result"]["stopReason"], "end_turn");
        assert_eq!(agent_text(&raw.seen[start..], &s), expected);
    }
    finish(raw);
}

/// `_acpd/status`'s count of live children, polled until it is `want` (or the wait ends).
fn live_children_become(raw: &mut Raw, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let status = raw.ok("_acpd/status", json!({}));
        let live = status["limits"]["liveChildren"].as_u64().unwrap();
        if live == want || std::time::Instant::now() >= deadline {
            return live;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The answers to `ids`, each within a few seconds (a request never answered fails fast).
fn answers(raw: &mut Raw, ids: &[u64]) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut got: Vec<Option<Value>> = vec![None; ids.len()];
    while got.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some(line) = raw.next_within(left) else {
            let missing: Vec<u64> = ids
                .iter()
                .zip(&got)
                .filter(|(_, g)| g.is_none())
                .map(|(id, _)| *id)
                .collect();
            panic!(
                "requests {missing:?} never answered; seen {:?}",
                raw.seen_text()
            );
        };
        match ids
            .iter()
            .position(|id| line.is_response() && line.value["id"] == *id)
        {
            Some(i) => got[i] = Some(line.value),
            None => raw.seen.push(line),
        }
    }
    got.into_iter().map(Option::unwrap).collect()
}

#[test]
fn two_loads_of_one_session_at_once_open_it_once() {
    let env = one_echo_keeping_sessions();
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, &cwd, "main");
    assert_eq!(say(&mut raw, &s, "one"), "one");
    assert_eq!(raw.ok("session/close", json!({"sessionId": s})), json!({}));
    assert_eq!(
        live_children_become(&mut raw, 0),
        0,
        "the closed session's child"
    );

    // An editor that loads twice without waiting (a double click) gets one session.
    let start = raw.seen.len();
    let first = raw.send("session/load", load_params(&s, &cwd));
    let second = raw.send("session/load", load_params(&s, &cwd));
    let got = answers(&mut raw, &[first, second]);
    let ok = got.iter().filter(|a| a.get("result").is_some()).count();
    assert_eq!(ok, 1, "exactly one load opens it: {got:?}");
    let refused = got.iter().find(|a| a.get("error").is_some()).unwrap();
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert_eq!(
        replay(&raw.seen[start..], &s),
        pairs(&[
            ("user_message_chunk", "one"),
            ("agent_message_chunk", "one")
        ]),
        "the history is replayed once"
    );
    assert_eq!(say(&mut raw, &s, "two"), "two");
    // Closing it leaves no child behind.
    assert_eq!(raw.ok("session/close", json!({"sessionId": s})), json!({}));
    assert_eq!(
        live_children_become(&mut raw, 0),
        0,
        "a child outlives its closed session"
    );
    finish(raw);
}

/// Issue 19: a load or resume of a session open on this very connection is the agent's to
/// answer, as directly: the load replays the history under the acpd id before its answer, the
/// resume re-binds, and the session stays open and works.
#[test]
fn reopening_a_session_open_here_replays_and_rebinds() {
    let env = one_echo_keeping_sessions();
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, &cwd, "main");
    assert_eq!(say(&mut raw, &s, "one"), "one");
    let (before, answer) = call_seen(&mut raw, "session/load", load_params(&s, &cwd));
    assert_eq!(answer["result"], json!({}), "session/load: {answer}");
    assert_eq!(
        replay(&before, &s),
        pairs(&[
            ("user_message_chunk", "one"),
            ("agent_message_chunk", "one")
        ]),
        "the history is replayed under the acpd id, before the answer"
    );
    let (before, answer) = call_seen(&mut raw, "session/resume", load_params(&s, &cwd));
    assert_eq!(answer["result"], json!({}), "session/resume: {answer}");
    assert!(replay(&before, &s).is_empty(), "a resume replays nothing");
    // Still open here, on the same child, and works.
    assert_eq!(say(&mut raw, &s, "still"), "still");
    assert_eq!(
        live_children_become(&mut raw, 1),
        1,
        "one child for the session"
    );
    // A bad cwd is refused by acpd, and the session stays.
    let e = error_of(
        &mut raw,
        "session/load",
        json!({"sessionId": s, "cwd": "relative", "mcpServers": []}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(say(&mut raw, &s, "after"), "after");
    finish(raw);
}

/// A load or resume sent the moment `session/close` is answered opens the session again, as
/// the agent itself would: the close takes the id off the connection before its answer goes
/// out, and the reopen waits for the closing child to be gone. The agent here ignores EOF, so
/// its teardown takes the whole `eof_grace` and a reopen always arrives during it (before,
/// the id was still filed there and the call went to the closing child).
#[test]
fn a_session_reopened_right_after_its_close_answer_opens_again() {
    let env = env_with(|dir| {
        let sessions = dir.join("echo-sessions");
        vec![echo(
            "main",
            &["--sessions", &dir_arg(&sessions), "--ignore-eof"],
        )]
    });
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, &cwd, "main");
    assert_eq!(say(&mut raw, &s, "one"), "one");
    for reopen in ["session/load", "session/resume"] {
        let closed = raw.call("session/close", json!({"sessionId": s}));
        assert_eq!(closed["result"], json!({}), "session/close: {closed}");
        let (before, answer) = call_seen(&mut raw, reopen, load_params(&s, &cwd));
        assert_eq!(
            answer["result"],
            json!({}),
            "{reopen} right after close: {answer}"
        );
        if reopen == "session/load" {
            assert_eq!(
                replay(&before, &s),
                pairs(&[
                    ("user_message_chunk", "one"),
                    ("agent_message_chunk", "one")
                ]),
                "the load replays the history under the acpd id"
            );
        }
        assert_eq!(
            say(&mut raw, &s, reopen),
            reopen,
            "the reopened session works"
        );
    }
    assert_eq!(
        live_children_become(&mut raw, 1),
        1,
        "the closed sessions' children are gone; one child for the reopened session"
    );
    finish(raw);
}

/// Issue 22: a prompt still running when the editor closes its session ends `cancelled`, as
/// ACP has a prompt ended by a cancel end — never an internal error — even when the agent
/// answers the close and never the prompt (`:hang-deaf`).
#[test]
fn a_prompt_running_when_its_session_closes_ends_cancelled() {
    let env = one_echo_keeping_sessions();
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, &cwd, "main");
    for script in [":hang-deaf", ":hang"] {
        let prompt = raw.send_prompt(&s, &format!("started\n{script}"));
        // The turn runs: its first line reached the editor.
        while !raw.seen.iter().any(|l| {
            l.method() == "session/update"
                && l.value["params"]["update"]["content"]["text"] == "started\n"
        }) {
            let line = raw.next();
            raw.seen.push(line);
        }
        let closed = raw.call("session/close", json!({"sessionId": s}));
        assert_eq!(closed["result"], json!({}), "session/close: {closed}");
        let answered = raw
            .seen
            .iter()
            .find(|l| l.is_response() && l.value["id"] == json!(prompt))
            .map(|l| l.value.clone())
            .unwrap_or_else(|| raw.answer(&json!(prompt)).value);
        assert_eq!(
            answered["result"],
            json!({"stopReason": "cancelled"}),
            "{script}: {answered}"
        );
        raw.seen.clear();
        raw.ok("session/load", load_params(&s, &cwd));
    }
    finish(raw);
}

/// Issue 19: `session/delete` of an id acpd never gave is answered as the agent answers a
/// delete of a session it does not have (`{}`: deleting is idempotent), and the id is never
/// passed on — here the agent's own id of a session (which an editor could learn or guess)
/// deletes nothing. A provider whose agent has no delete answers -32601, as it would.
#[test]
fn deleting_an_unknown_id_answers_as_the_agent_and_passes_nothing_on() {
    let env = env_with(|dir| {
        let sessions = dir.join("echo-sessions");
        vec![
            echo("main", &["--sessions", &dir_arg(&sessions)]),
            echo("plain", &[]),
        ]
    });
    let cwd = env.path().to_path_buf();
    let (mut raw, _) = connect(&env, json!({}));
    let s = new_in(&mut raw, &cwd, "main");
    assert_eq!(say(&mut raw, &s, "kept"), "kept");
    let files = echo_session_files(&env);
    assert_eq!(files.len(), 1, "{files:?}");
    let own = files[0].file_stem().unwrap().to_str().unwrap().to_string();
    assert_ne!(own, s, "the agent's id is not the one the editor knows");

    let (mut other, _) = connect(&env, json!({}));
    for ghost in [own.as_str(), "acpd-00000000-0000-4000-8000-000000000000"] {
        assert_eq!(
            other.ok("session/delete", json!({"sessionId": ghost})),
            json!({}),
            "{ghost}"
        );
    }
    let e = error_of(
        &mut other,
        "session/delete",
        json!({"sessionId": own, "_meta": {"acpd": {"provider": "plain"}}}),
    );
    assert_eq!(e["code"], -32601, "{e}");
    assert!(files[0].exists(), "the agent's session was deleted");
    finish(other);

    // The session is untouched: it works, and loads with its history elsewhere.
    assert_eq!(say(&mut raw, &s, "after"), "after");
    // Loaded right after its close (no wait for the child to go), as an editor does.
    assert_eq!(raw.ok("session/close", json!({"sessionId": s})), json!({}));
    let (before, answer) = call_seen(&mut raw, "session/load", load_params(&s, &cwd));
    assert_eq!(answer["result"], json!({}), "{answer}");
    assert_eq!(
        replay(&before, &s),
        pairs(&[
            ("user_message_chunk", "kept"),
            ("agent_message_chunk", "kept"),
            ("user_message_chunk", "after"),
            ("agent_message_chunk", "after"),
        ])
    );
    finish(raw);
}

/// Issue 19: `acpd stdio` with `warm = 1` makes its spare's session ahead for the editor's
/// likeliest first `session/new` (the cwd it started acpd in, no MCP servers), so even the
/// first session is handed a session the agent made before the editor asked — acpd's own MCP
/// server (`offer_delegation`) among the params as in the editor's session.
#[test]
fn acpd_stdio_makes_the_first_session_ahead_in_its_cwd() {
    let env = one_echo_keeping_sessions();
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str("warm = 1\noffer_delegation = true\n");
    std::fs::write(&env.config, config).unwrap();
    let cwd = env.path().canonicalize().unwrap();
    let (mut raw, _) = connect(&env, json!({}));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while raw.ok("_acpd/status", json!({}))["spares"]["main"].as_u64() != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "no spare; log: {}",
            raw.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let files = |env: &Env| -> Vec<(String, Value)> {
        echo_session_files(env)
            .into_iter()
            .map(|p| {
                let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                (p.file_stem().unwrap().to_str().unwrap().to_string(), v)
            })
            .collect()
    };
    let ahead = files(&env);
    assert_eq!(ahead.len(), 1, "{ahead:?}");
    assert_eq!(ahead[0].1["cwd"], json!(cwd), "{ahead:?}");
    let s = new_in(&mut raw, &cwd, "main");
    assert_eq!(say(&mut raw, &s, "first"), "first");
    let used: Vec<String> = files(&env)
        .into_iter()
        .filter(|(_, v)| v["history"].to_string().contains("first"))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(used, [ahead[0].0.clone()], "not the session made ahead");
    finish(raw);
}
