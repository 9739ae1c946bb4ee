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
