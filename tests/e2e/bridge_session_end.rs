#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 30: a prompt still open when its session ends with no answer from the agent ends as
//! ACP ends a turn, `{"stopReason": "cancelled"}` — never an error that reads as acpd failing
//! — whichever way the session ends: a daemon stop (SIGTERM to `acpd stdio` and to `acpd
//! serve`), the editor's connection ending with the session detached, the agent exiting
//! (`stdio::child_crash_mid_turn_ends_the_prompt_cancelled_naming_the_exit`). Real processes,
//! each wait for a message or an exit.
use std::time::Duration;

use crate::common;
use common::daemon::Daemon;
use common::raw::*;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// A prompt to `session` that streams `working` and then waits to be cancelled; its id.
fn hanging_prompt(raw: &mut Raw, session: &str) -> u64 {
    let id = raw.send_prompt(session, "working\n:hang");
    raw.until_chunk(session, "working");
    id
}

/// The answer to request `id`, read before acpd's output ends.
fn answered_before_eof(raw: &mut Raw, id: u64) -> Value {
    loop {
        let Some(line) = raw.next_within(Duration::from_secs(20)) else {
            panic!(
                "acpd's output ended (eof: {}) without answering the prompt; seen: {:?}\n{}",
                raw.eof,
                raw.seen_text(),
                raw.log()
            );
        };
        if line.is_response() && line.value["id"] == json!(id) {
            return line.value;
        }
        raw.seen.push(line);
    }
}

fn assert_cancelled(answer: &Value) {
    assert_eq!(
        answer["result"],
        json!({"stopReason": "cancelled"}),
        "{answer}"
    );
}

/// SIGTERM to `acpd stdio` mid-turn: the editor reads its prompt ended `cancelled`, then EOF.
#[test]
fn sigterm_to_acpd_stdio_ends_an_open_prompt_cancelled() {
    let env = Env::new("");
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let s = raw.new_session(env.path(), "fast");
    let id = hanging_prompt(&mut raw, &s);
    kill(Pid::from_raw(raw.pid() as i32), Signal::SIGTERM).unwrap();
    assert_cancelled(&answered_before_eof(&mut raw, id));
    assert!(
        raw.drain_to_eof(Duration::from_secs(10)),
        "acpd stdio did not end"
    );
}

/// SIGTERM to `acpd serve` mid-turn: the editor on the socket reads its prompt ended
/// `cancelled` before the daemon closes the connection.
#[test]
fn sigterm_to_acpd_serve_ends_an_open_prompt_cancelled() {
    let d = Daemon::start(Env::new("detach_timeout = \"10m\""));
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let s = raw.new_session(d.env.path(), "fast");
    let id = hanging_prompt(&mut raw, &s);
    kill(d.pid(), Signal::SIGTERM).unwrap();
    assert_cancelled(&answered_before_eof(&mut raw, id));
}

/// An editor that closes its side of the socket mid-turn (it has nothing more to ask, and
/// still reads) with `detach_timeout`: the session detaches, and the prompt the editor waits
/// on ends `cancelled` for it instead of never being answered.
#[test]
fn an_editor_that_leaves_a_detaching_session_mid_turn_reads_its_prompt_cancelled() {
    let d = Daemon::start(Env::new("detach_timeout = \"10m\""));
    let mut raw = Raw::socket(&d.socket);
    raw.initialize(json!({}));
    let s = raw.new_session(d.env.path(), "fast");
    let id = hanging_prompt(&mut raw, &s);
    raw.close_write();
    assert_cancelled(&answered_before_eof(&mut raw, id));
}

/// Attack: the agent is killed while the editor holds its permission request, and the editor
/// cancels the turn at that moment and answers the request after: the prompt is answered
/// once, `cancelled` naming the signal; the late cancel and the late permission answer change
/// nothing, and the connection goes on (a new session answers).
#[test]
fn an_agent_killed_with_a_permission_pending_ends_the_prompt_cancelled_once() {
    let env = Env::new("");
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let s = raw.new_session(env.path(), "fast");
    let id = raw.send_prompt(&s, ":pid\n:permission");
    let pid = pid_after(&raw.until_chunk(&s, "pid "), "pid ");
    let asked = loop {
        let line = raw.next();
        if line.is_request() && line.method() == "session/request_permission" {
            break line.value;
        }
        raw.seen.push(line);
    };
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    raw.line(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": s}})
            .to_string(),
    );
    let answer = raw.answer(&json!(id)).value;
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    let ended = &answer["result"]["_meta"]["acpd"]["sessionEnded"]["data"];
    assert_eq!(ended["signal"], "SIGKILL", "{answer}");
    raw.line(
        &json!({"jsonrpc": "2.0", "id": asked["id"],
                "result": {"outcome": {"outcome": "cancelled"}}})
        .to_string(),
    );
    let s2 = raw.new_session(env.path(), "fast");
    let again = raw.send_prompt(&s2, "still here");
    let line = raw.answer(&json!(again)).value;
    assert_eq!(line["result"]["stopReason"], "end_turn", "{line}");
    let twice = raw
        .seen
        .iter()
        .filter(|l| l.is_response() && l.value["id"] == json!(id))
        .count();
    assert_eq!(
        twice,
        0,
        "the prompt was answered again: {:?}",
        raw.seen_text()
    );
}

/// Attack: SIGTERM to `acpd stdio` while a `session/load` waits on a slow agent start (a
/// session made earlier, its agent now answering `initialize` after 30 s): the load is
/// answered (an error, not silence) before acpd's output ends, and acpd exits 0.
#[test]
fn sigterm_during_a_load_answers_the_load_before_acpd_exits() {
    let env = Env::raw("");
    let sessions = env.path().join("echo-sessions");
    let config = |default: &str, delay: &str| {
        format!(
            "default_provider = \"{default}\"\n[providers.fast]\ncommand = [{BIN:?}, \"agent\", \"echo\"]\n\
             [providers.p]\ncommand = [{BIN:?}, \"agent\", \"echo\", \"--sessions\", {sessions:?}{delay}]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
             handshake_timeout = \"60s\"\n",
            sessions = sessions.to_str().unwrap()
        )
    };
    std::fs::write(&env.config, config("p", "")).unwrap();
    let mut first = Raw::stdio(&env);
    first.initialize(json!({}));
    let s = first.new_session(env.path(), "p");
    first.close_write();
    assert!(first.drain_to_eof(Duration::from_secs(10)));

    std::fs::write(&env.config, config("fast", ", \"--init-delay\", \"30000\"")).unwrap();
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let id = raw.send(
        "session/load",
        json!({"sessionId": s, "cwd": env.path(), "mcpServers": []}),
    );
    // Until the load's agent is spawned (waiting in its start): the load is under way.
    assert!(
        eventually(Duration::from_secs(10), || echo_children(raw.pid()) > 0),
        "the load's agent never started"
    );
    kill(Pid::from_raw(raw.pid() as i32), Signal::SIGTERM).unwrap();
    let answer = answered_before_eof(&mut raw, id);
    assert!(answer.get("error").is_some(), "{answer}");
    assert!(raw.drain_to_eof(Duration::from_secs(10)));
    let status = raw.process.take().unwrap().wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
}

/// How many children of `pid` are the slow agent (`--init-delay` in their command line).
fn echo_children(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                .flat_map(|c| {
                    c.split_whitespace()
                        .map(|p| std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default())
                        .collect::<Vec<_>>()
                })
                .filter(|cmd| cmd.windows(12).any(|w| w == b"--init-delay"))
                .count()
        })
        .unwrap_or(0)
}
