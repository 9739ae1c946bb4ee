#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
//! Sessions belong to whoever opened them, end to end: another user of a shared `acpd serve`
//! (`allow_group`) sees none of them, a refused request writes nothing to the session map, a
//! connection from inside a child's tree renames nothing, one session is live in one acpd at
//! a time (a lease with the holder's pid), and what a hostile agent lists is bounded. The
//! second user is a temporary account made with `useradd` (removed after): those tests skip,
//! saying so, when not run as root. The session map is read directly (`sessions.sqlite3` in
//! the test's state dir) where what a refused request would have written is the question.

use crate::common;

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::raw::{Raw, Serve};
use common::*;
use serde_json::{Value, json};

/// How long a test waits for a state it expects acpd to reach.
const SETTLE: Duration = Duration::from_secs(20);

/// An id no session has: what "unknown" looks like.
const UNKNOWN: &str = "acpd-00000000-0000-4000-8000-000000000000";

/// A config: `top` keys, then provider `p` (the echo agent keeping its sessions in
/// `<env>/echo-sessions`, so a session outlives its child) and `extra` provider tables.
fn env_with(top: &str, extra: &str) -> Env {
    let env = Env::raw("");
    let dir = env.path().join("echo-sessions");
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "default_provider = \"p\"\n{top}\n[providers.p]\n\
         command = [\"{BIN}\", \"agent\", \"echo\", \"--sessions\", \"{}\"]\n\
         cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n{extra}\n",
        dir.display()
    );
    std::fs::write(&env.config, toml).unwrap();
    env
}

fn work(env: &Env) -> PathBuf {
    let dir = env.path().join("work");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A prompt of one text block that must end its turn.
fn prompt(raw: &mut Raw, sid: &str, text: &str) {
    let id = raw.send_prompt(sid, text);
    let answer = raw.answer(&json!(id));
    assert_eq!(
        answer.value["result"]["stopReason"],
        "end_turn",
        "{}",
        answer.text()
    );
}

/// Every page of `session/list`, each answer line's length checked against `max_line`.
fn list_all(raw: &mut Raw, max_line: usize) -> Vec<Value> {
    let mut all = Vec::new();
    let mut params = json!({});
    for _ in 0..1000 {
        let id = raw.send("session/list", params.clone());
        let line = raw.answer(&json!(id));
        assert!(
            line.raw.len() <= max_line,
            "a session/list answer of {} bytes, over max_line {max_line}",
            line.raw.len()
        );
        let result = &line.value["result"];
        assert!(result.is_object(), "{}", line.text());
        all.extend(result["sessions"].as_array().unwrap().iter().cloned());
        match result["nextCursor"].as_str() {
            Some(c) => params = json!({ "cursor": c }),
            None => return all,
        }
    }
    panic!("session/list never ended");
}

fn ids(entries: &[Value]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e["sessionId"].as_str().unwrap().to_string())
        .collect()
}

/// (title, updatedAt) of `sid` in the session map, as the next listing would give them.
fn row_of(env: &Env, sid: &str) -> Option<(Option<String>, String)> {
    let conn = rusqlite::Connection::open_with_flags(
        env.path().join("state/sessions.sqlite3"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.query_row(
        "SELECT title, updated_at FROM sessions WHERE acpd_id = ?1",
        [sid],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .ok()
}

fn map_rows(env: &Env) -> i64 {
    let conn = rusqlite::Connection::open_with_flags(
        env.path().join("state/sessions.sqlite3"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))
        .unwrap()
}

/// A temporary local user with a group of its own name (useradd --user-group), removed on
/// drop (a failed test too). None, said on stderr, when this is not root.
struct TempUser {
    name: String,
    uid: u32,
    gid: u32,
}

static USERS: AtomicUsize = AtomicUsize::new(0);

impl TempUser {
    fn create() -> Option<TempUser> {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root to create a second local user (useradd)");
            return None;
        }
        let name = format!(
            "acpdso{}x{}",
            std::process::id(),
            USERS.fetch_add(1, Ordering::Relaxed)
        );
        // useradd waits for nobody: another process editing /etc/passwd makes it fail (10);
        // retried under a deadline.
        let made = eventually(SETTLE, || {
            Command::new("useradd")
                .args(["--system", "--user-group", "--no-create-home"])
                .args(["--shell", "/usr/sbin/nologin", &name])
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(made, "useradd {name} failed");
        let user = nix::unistd::User::from_name(&name).unwrap().unwrap();
        Some(TempUser {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        })
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let gone = eventually(SETTLE, || {
            Command::new("userdel")
                .arg(&self.name)
                .status()
                .is_ok_and(|s| s.success())
        });
        if !gone {
            eprintln!("could not remove the test user {}", self.name);
        }
    }
}

/// `acpd serve` whose `allow_group` is `user`'s group, its socket reachable by them.
fn shared_daemon(env: &Env) -> Serve {
    let serve = Serve::start(env);
    for p in [env.path(), &env.path().join("run")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&serve.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    serve
}

/// An editor of `user`: `acpd connect` run as them (no supplementary groups).
fn as_user(user: &TempUser, serve: &Serve, env: &Env) -> Raw {
    let mut cmd = base();
    cmd.args(["connect", "--socket"])
        .arg(&serve.socket)
        .current_dir("/")
        .uid(user.uid)
        .gid(user.gid);
    let mut raw = Raw::process(cmd, &env.path().join(format!("{}.log", user.name)));
    let init = raw.initialize(json!({}));
    assert!(init.is_object(), "{}", raw.log());
    raw
}

/// Bridge sessions live in `serve` now: (attached, detached).
fn live(serve: &Serve) -> (u64, u64) {
    let mut raw = serve.connect();
    raw.initialize(json!({}));
    let s = raw.ok("_acpd/status", json!({}));
    (
        s["sessions"]["attached"].as_u64().unwrap(),
        s["sessions"]["detached"].as_u64().unwrap(),
    )
}

/// Every session method a user might try on `sid`, and the answer.
fn attempts(raw: &mut Raw, sid: &str, cwd: &Path) -> Vec<(String, Value)> {
    let existing = json!({"sessionId": sid, "cwd": cwd, "mcpServers": []});
    [
        ("session/load", existing.clone()),
        ("session/resume", existing.clone()),
        ("session/fork", existing),
        (
            "session/set_title",
            json!({"sessionId": sid, "title": "pwned"}),
        ),
        (
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}),
        ),
        ("session/close", json!({"sessionId": sid})),
        ("session/delete", json!({"sessionId": sid})),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_string(), raw.call(m, p)))
    .collect()
}

/// `sid` is to `raw` exactly what an id nobody has is: each method answers the same -32002
/// (the id aside) — a delete what the agent answers for an id it does not have (the echo's,
/// like the real agents', is idempotent: `{}`) — and no listing shows it.
fn unknown_to(raw: &mut Raw, sid: &str, cwd: &Path) {
    let theirs = attempts(raw, sid, cwd);
    let nobodys = attempts(raw, UNKNOWN, cwd);
    for ((method, a), (_, b)) in theirs.iter().zip(&nobodys) {
        if method == "session/delete" {
            assert_eq!(a["result"], json!({}), "{method}: {a}");
        } else {
            assert_eq!(a["error"]["code"], -32002, "{method}: {a}");
        }
        let strip = |v: &Value| {
            let mut v = v.clone();
            v.as_object_mut().map(|o| o.remove("id"));
            v
        };
        let a = strip(a).to_string().replace(sid, "ID");
        let b = strip(b).to_string().replace(UNKNOWN, "ID");
        assert_eq!(
            a, b,
            "{method} tells another user's session from an unknown one"
        );
    }
    let listed = raw.ok("session/list", json!({}));
    assert_eq!(
        listed["sessions"],
        json!([]),
        "another user's sessions listed"
    );
    let listed = raw.ok("session/list", json!({ "cwd": cwd }));
    assert_eq!(
        listed["sessions"],
        json!([]),
        "another user's sessions listed"
    );
}

/// Bullet 1: with `allow_group`, a member of the group neither lists, loads, resumes, forks,
/// renames, prompts, closes nor deletes the owner's session, detached or expired; the owner
/// still loads it, history intact.
#[test]
fn another_users_session_is_unknown_to_them_detached_and_expired() {
    let Some(user) = TempUser::create() else {
        return;
    };
    let env = env_with(
        &format!("allow_group = \"{}\"\ndetach_timeout = \"3s\"", user.name),
        "",
    );
    let cwd = work(&env);
    let serve = shared_daemon(&env);
    let mut owner = serve.connect();
    owner.initialize(json!({}));
    let sid = owner.new_session(&cwd, "p");
    prompt(&mut owner, &sid, "the owner's secret plan");
    drop(owner);
    assert!(
        eventually(SETTLE, || live(&serve) == (0, 1)),
        "the session never detached"
    );
    let mut member = as_user(&user, &serve, &env);
    unknown_to(&mut member, &sid, &cwd);
    assert_eq!(live(&serve), (0, 1), "the member ended the owner's session");
    assert!(
        eventually(SETTLE, || live(&serve) == (0, 0)),
        "the session never expired"
    );
    unknown_to(&mut member, &sid, &cwd);
    // Still the owner's, whole.
    let mut owner = serve.connect();
    owner.initialize(json!({}));
    let listed = owner.ok("session/list", json!({}));
    assert_eq!(
        ids(listed["sessions"].as_array().unwrap()),
        std::slice::from_ref(&sid)
    );
    owner.ok(
        "session/load",
        json!({"sessionId": sid, "cwd": cwd, "mcpServers": []}),
    );
    let replayed: String = owner.seen_text().concat();
    assert!(replayed.contains("the owner's secret plan"), "{replayed}");
}

/// Bullet 2: a prompt or a title acpd refuses writes nothing: not for a session this
/// connection does not hold (-32002), not for an image the agent cannot take, not for a title
/// an agent without titles refuses.
#[test]
fn a_refused_request_changes_nothing_in_the_map() {
    let env = env_with("", "");
    let cwd = work(&env);
    let mut a = Raw::stdio(&env);
    a.initialize(json!({}));
    let sid = a.new_session(&cwd, "p");
    prompt(&mut a, &sid, "first title");
    // The listing files the agent's title.
    let listed = a.ok("session/list", json!({}));
    assert_eq!(listed["sessions"][0]["title"], "first title", "{listed}");
    let before = row_of(&env, &sid).unwrap();
    let image = json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"});
    let refused = a.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [image]}),
    );
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let refused = a.call(
        "session/set_title",
        json!({"sessionId": sid, "title": "renamed"}),
    );
    assert_eq!(refused["error"]["code"], -32601, "{refused}");
    drop(a);

    let mut b = Raw::stdio(&env);
    b.initialize(json!({}));
    for (method, params) in [
        (
            "session/set_title",
            json!({"sessionId": sid, "title": "hijacked"}),
        ),
        (
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}),
        ),
    ] {
        let answer = b.call(method, params);
        assert_eq!(answer["error"]["code"], -32002, "{method}: {answer}");
    }
    // What a refused request would have written was queued before its answer: one more
    // round trip through the map (a close of an unknown id reads it) and it has landed.
    let answer = b.call("session/close", json!({"sessionId": UNKNOWN}));
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert_eq!(row_of(&env, &sid).unwrap(), before);
}

/// Bullet 3: a process inside a child's tree that dials the socket may not rename a session
/// (refused saying why), and the title stays.
#[test]
fn a_child_tree_connection_may_not_set_a_title() {
    let env = Env::raw("");
    let socket = env.path().join("run/acpd.sock");
    let out = env.path().join("hostile.json");
    let script = env.path().join("hostile.py");
    let victim_file = env.path().join("victim");
    std::fs::write(
        &script,
        format!(
            r#"import json, os, socket, time
victim = open({victim_file:?}).read().strip()
s = socket.socket(socket.AF_UNIX)
s.connect({socket:?})
f = s.makefile("rwb")
def call(i, method, params):
    f.write((json.dumps({{"jsonrpc": "2.0", "id": i, "method": method, "params": params}}) + "\n").encode())
    f.flush()
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == i:
            return msg
answers = [call(1, "initialize", {{"protocolVersion": 1}})]
answers.append(call(2, "session/set_title", {{"sessionId": victim, "title": "pwned"}}))
answers.append(call(3, "session/prompt", {{"sessionId": victim, "prompt": [{{"type": "text", "text": "x"}}]}}))
answers.append(call(4, "session/close", {{"sessionId": "acpd-nope"}}))
open({out:?} + ".tmp", "w").write(json.dumps(answers))
os.rename({out:?} + ".tmp", {out:?})
time.sleep(600)
"#
        ),
    )
    .unwrap();
    let dir = env.path().join("echo-sessions");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        &env.config,
        format!(
            "detach_timeout = \"0s\"\ndefault_provider = \"p\"\n\
             [providers.p]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--sessions\", \"{dir}\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
             [providers.h]\n\
             command = [\"sh\", \"-c\", \"python3 {script} & exec {BIN} agent echo\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            dir = dir.display(),
            script = script.display(),
        ),
    )
    .unwrap();
    let serve = Serve::start(&env);
    let mut raw = serve.connect();
    raw.initialize(json!({}));
    let cwd = work(&env);
    let victim = raw.new_session(&cwd, "p");
    prompt(&mut raw, &victim, "the victim's title");
    raw.ok("session/list", json!({}));
    let before = row_of(&env, &victim).unwrap();
    assert_eq!(before.0.as_deref(), Some("the victim's title"));
    std::fs::write(&victim_file, &victim).unwrap();
    let _hostile = raw.new_session(&cwd, "h");
    assert!(
        eventually(SETTLE, || out.exists()),
        "the hostile script never finished"
    );
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(answers[0].get("result").is_some(), "{}", answers[0]);
    let refused = answers[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        refused.contains("inside the process tree of a child"),
        "set_title from a child's tree: {}",
        answers[1]
    );
    assert_eq!(answers[2]["error"]["code"], -32002, "{}", answers[2]);
    // The close after them went through the map: what they would have written has landed.
    assert!(answers[3].get("error").is_some(), "{}", answers[3]);
    assert_eq!(row_of(&env, &victim).unwrap(), before);
    // The victim still answers its editor.
    prompt(&mut raw, &victim, "still mine");
}

/// Bullet 4: a session detached in `acpd serve` is not loaded by an `acpd stdio` sharing the
/// state dir (the error names the daemon's pid and what to do); once the daemon is killed, its
/// lease is taken over and the session loads, history intact.
#[test]
fn a_session_live_in_one_acpd_is_not_loaded_in_another() {
    let env = env_with("detach_timeout = \"10m\"", "");
    let cwd = work(&env);
    let mut serve = Serve::start(&env);
    let mut editor = serve.connect();
    editor.initialize(json!({}));
    let sid = editor.new_session(&cwd, "p");
    prompt(&mut editor, &sid, "said to the daemon");
    drop(editor);
    assert!(
        eventually(SETTLE, || live(&serve) == (0, 1)),
        "the session never detached"
    );
    let load = json!({"sessionId": sid, "cwd": cwd, "mcpServers": []});
    let mut stdio = Raw::stdio(&env);
    stdio.initialize(json!({}));
    for method in [
        "session/load",
        "session/resume",
        "session/fork",
        "session/delete",
    ] {
        let answer = stdio.call(method, load.clone());
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        let pid = format!("pid {}", serve.pid());
        assert!(
            message.contains("live in another acpd") && message.contains(&pid),
            "{method}: {answer}"
        );
        assert!(message.contains("close it there"), "{answer}");
        assert_eq!(
            answer["error"]["data"]["holderPid"],
            serve.pid(),
            "{answer}"
        );
    }
    // The daemon dies without a word: its lease is a dead process's.
    serve.child.kill().unwrap();
    serve.child.wait().unwrap();
    stdio.ok("session/load", load.clone());
    let replayed: String = stdio.seen_text().concat();
    assert!(replayed.contains("said to the daemon"), "{replayed}");
    prompt(&mut stdio, &sid, "said to stdio");
}

/// A python agent that lists 12 fresh sessions per page without end (`nextCursor` always),
/// each with a title of 1 500 two-byte characters (a page fits the 48 KiB `max_line`; 50 such
/// rows in one answer would not).
const FLOOD_AGENT: &str = r#"import json, sys, uuid
def out(msg):
    sys.stdout.buffer.write(json.dumps(msg, ensure_ascii=False).encode() + b"\n")
    sys.stdout.buffer.flush()
while True:
    line = sys.stdin.readline()
    if not line:
        break
    msg = json.loads(line)
    if "id" not in msg or "method" not in msg:
        continue
    i, m = msg["id"], msg["method"]
    if m == "initialize":
        out({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1,
             "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"list": {}}},
             "authMethods": []}})
    elif m == "session/new":
        out({"jsonrpc": "2.0", "id": i, "result": {"sessionId": "flood-own"}})
    elif m == "session/list":
        sessions = [{"sessionId": str(uuid.uuid4()), "cwd": "/tmp",
                     "title": "\u00e9" * 1500, "updatedAt": "2026-01-01T00:00:00Z"}
                    for _ in range(12)]
        out({"jsonrpc": "2.0", "id": i, "result": {"sessions": sessions, "nextCursor": "more"}})
    else:
        out({"jsonrpc": "2.0", "id": i, "error": {"code": -32601, "message": "no " + m}})
"#;

/// Bullet 5: an agent listing fresh ids without end adds at most `max_listed_sessions` rows,
/// the ones it stops listing are forgotten, titles come back capped at 1 KiB, and every
/// `session/list` answer line fits `max_line` (pages follow under a cursor).
#[test]
fn what_an_agent_lists_is_bounded() {
    const MAX_LINE: usize = 48 * 1024;
    let env = Env::raw("");
    let script = env.path().join("flood.py");
    std::fs::write(&script, FLOOD_AGENT).unwrap();
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"flood\"\nmax_line = {MAX_LINE}\nmax_listed_sessions = 60\n\
             [providers.flood]\ncommand = [\"python3\", \"{}\"]\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
            script.display()
        ),
    )
    .unwrap();
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let first = list_all(&mut raw, MAX_LINE);
    assert!(
        !first.is_empty() && first.len() <= 60,
        "{} sessions; log: {}",
        first.len(),
        raw.log()
    );
    for s in &first {
        let title = s["title"].as_str().unwrap();
        assert!(
            title.len() <= 1024 && title.len() >= 1022,
            "{}",
            title.len()
        );
        assert!(title.chars().all(|c| c == 'é'));
    }
    let second = list_all(&mut raw, MAX_LINE);
    assert!(second.len() <= 60, "{} sessions", second.len());
    let (first, second) = (ids(&first), ids(&second));
    assert!(
        first.iter().all(|id| !second.contains(id)),
        "ids the agent stopped listing are still listed"
    );
    assert!(map_rows(&env) <= 60, "{} rows kept", map_rows(&env));
}

/// An agent that takes titles but refuses some: a title with "refuse" in it is answered
/// -32602, any other accepted.
const PICKY_TITLES: &str = r#"import json, sys
def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    i, meth = m["id"], m["method"]
    if meth == "initialize":
        out({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1, "authMethods": [],
             "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"title": {}}}}})
    elif meth == "session/new":
        out({"jsonrpc": "2.0", "id": i, "result": {"sessionId": "picky"}})
    elif meth == "session/set_title" and "refuse" in m["params"].get("title", ""):
        out({"jsonrpc": "2.0", "id": i, "error": {"code": -32602, "message": "not that title"}})
    else:
        out({"jsonrpc": "2.0", "id": i, "result": {}})
"#;

/// Issue 18 (beyond the list): a title the agent itself refuses (it takes titles, not this
/// one) was written to the session map anyway, as soon as acpd passed it on. It is written
/// only once the agent answered with a result.
#[test]
fn a_title_the_agent_refuses_is_not_written() {
    let env = Env::raw("");
    let script = env.path().join("picky.py");
    std::fs::write(&script, PICKY_TITLES).unwrap();
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"picky\"\n[providers.picky]\ncommand = [\"python3\", \"{}\"]\n",
            script.display()
        ),
    )
    .unwrap();
    let cwd = work(&env);
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let sid = raw.new_session(&cwd, "picky");
    raw.ok(
        "session/set_title",
        json!({"sessionId": sid, "title": "accepted"}),
    );
    // Written before the answer went out.
    assert_eq!(row_of(&env, &sid).unwrap().0.as_deref(), Some("accepted"));
    let refused = raw.call(
        "session/set_title",
        json!({"sessionId": sid, "title": "refuse me"}),
    );
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    // Anything the refused title would have written was queued before its answer: one more
    // round trip through the map and it would have landed.
    let answer = raw.call("session/close", json!({"sessionId": UNKNOWN}));
    assert_eq!(answer["error"]["code"], -32002, "{answer}");
    assert_eq!(row_of(&env, &sid).unwrap().0.as_deref(), Some("accepted"));
}

/// An agent whose listing already holds the session its next `session/new` hands out
/// (`own-1`), as an agent listing its sessions from disk does while acpd is still filing the
/// new one; its first listing lists `own-1` first, later ones last, after ten sessions with an
/// `updatedAt` far in the future. Listing calls are counted in the file named by argv[1].
const RACY_LISTER: &str = r#"import json, os, sys
count = sys.argv[1]
def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    i, meth = m["id"], m["method"]
    if meth == "initialize":
        out({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1, "authMethods": [],
             "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"list": {}}}}})
    elif meth == "session/new":
        out({"jsonrpc": "2.0", "id": i, "result": {"sessionId": "own-1"}})
    elif meth == "session/list":
        n = int(open(count).read()) if os.path.exists(count) else 0
        open(count, "w").write(str(n + 1))
        own = {"sessionId": "own-1", "cwd": "/tmp", "updatedAt": "2026-01-01T00:00:00Z"}
        future = [{"sessionId": "f%d" % k, "cwd": "/tmp", "updatedAt": "2999-01-01T00:00:00Z"}
                  for k in range(10)]
        sessions = [own] + future if n == 0 else future + [own]
        out({"jsonrpc": "2.0", "id": i, "result": {"sessions": sessions, "nextCursor": None}})
    else:
        out({"jsonrpc": "2.0", "id": i, "result": {}})
"#;

/// Hostile review of issue 18, two holes: (1) a `session/list` refresh that filed the child's
/// session before the `session/new` that made it had its row in took its one acpd id, and the
/// opener's own id was never kept (not listed, not loadable); (2) the bound on what an agent
/// lists (`max_listed_sessions`) and the listing cut at it forgot rows of any owner, so an
/// agent listing sessions with a future `updatedAt` pushed out the rows users opened. The
/// opener's id wins and stays listed whatever the agent lists past the bound.
#[test]
fn an_opened_session_keeps_its_id_against_the_agents_listing() {
    let env = Env::raw("");
    let script = env.path().join("racy.py");
    std::fs::write(&script, RACY_LISTER).unwrap();
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"racy\"\nmax_listed_sessions = 5\n\
             [providers.racy]\ncommand = [\"python3\", \"{}\", \"{}\"]\n",
            script.display(),
            env.path().join("list-count").display()
        ),
    )
    .unwrap();
    let cwd = work(&env);
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    // The agent's listing files own-1 first, under an id of acpd's own.
    let before = ids(&list_all(&mut raw, 1 << 20));
    assert_eq!(before.len(), 5, "{before:?}");
    let sid = raw.new_session(&cwd, "racy");
    assert!(!before.contains(&sid));
    for round in 0..2 {
        let listed = list_all(&mut raw, 1 << 20);
        let mine: Vec<&Value> = listed.iter().filter(|s| s["sessionId"] == sid).collect();
        assert_eq!(
            mine.len(),
            1,
            "round {round}: the opened session {sid} is not listed: {listed:?}; log: {}",
            raw.log()
        );
        assert!(
            listed.len() <= 6,
            "{} listed past the bound of 5 (+ the opened one)",
            listed.len()
        );
    }
    assert_eq!(row_of(&env, &sid).map(|r| r.0), Some(None));
}

/// An agent that loads and deletes sessions; its `session/delete` writes the file argv[1] and
/// answers only once the file argv[2] exists.
const SLOW_DELETER: &str = r#"import json, os, sys, time, uuid
started, gate = sys.argv[1], sys.argv[2]
def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    i, meth = m["id"], m["method"]
    if meth == "initialize":
        out({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1, "authMethods": [],
             "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"delete": {}}}}})
    elif meth == "session/new":
        out({"jsonrpc": "2.0", "id": i, "result": {"sessionId": str(uuid.uuid4())}})
    elif meth == "session/delete":
        open(started, "w").write("x")
        while not os.path.exists(gate):
            time.sleep(0.02)
        out({"jsonrpc": "2.0", "id": i, "result": {}})
    else:
        out({"jsonrpc": "2.0", "id": i, "result": {}})
"#;

/// Hostile review of issue 18: `session/delete` of a session open on the caller's connection
/// ended that session first, and its ending released the lease the delete had just taken, so
/// another acpd sharing the map loaded the session while the agent was deleting it. The lease
/// is kept until the delete is answered: the other acpd is told which acpd holds it.
#[test]
fn a_session_being_deleted_is_not_loaded_in_another_acpd() {
    let env = Env::raw("");
    let script = env.path().join("deleter.py");
    std::fs::write(&script, SLOW_DELETER).unwrap();
    let (started, gate) = (env.path().join("started"), env.path().join("gate"));
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"d\"\n[providers.d]\n\
             command = [\"python3\", \"{}\", \"{}\", \"{}\"]\n",
            script.display(),
            started.display(),
            gate.display()
        ),
    )
    .unwrap();
    let cwd = work(&env);
    let mut a = Raw::stdio(&env);
    a.initialize(json!({}));
    let sid = a.new_session(&cwd, "d");
    let delete = a.send("session/delete", json!({ "sessionId": sid }));
    assert!(
        eventually(SETTLE, || started.exists()),
        "the agent never got the delete; log: {}",
        a.log()
    );
    let mut b = Raw::stdio_with(&env, &[], Stdio::null());
    b.initialize(json!({}));
    let load = b.call(
        "session/load",
        json!({"sessionId": sid, "cwd": cwd, "mcpServers": []}),
    );
    let message = load["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("live in another acpd") && message.contains(&format!("pid {}", a.pid())),
        "a load in another acpd during the delete: {load}"
    );
    std::fs::write(&gate, "go").unwrap();
    let answer = a.answer(&json!(delete));
    assert!(answer.value.get("result").is_some(), "{}", answer.text());
    assert_eq!(
        row_of(&env, &sid),
        None,
        "the deleted session is still in the map"
    );
}

/// An agent that takes titles, answering `session/set_title` only once the file argv[2] exists
/// (having written argv[1] when it got it).
const SLOW_TITLES: &str = r#"import json, os, sys, time
started, gate = sys.argv[1], sys.argv[2]
def out(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m or "method" not in m:
        continue
    i, meth = m["id"], m["method"]
    if meth == "initialize":
        out({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": 1, "authMethods": [],
             "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"title": {}}}}})
    elif meth == "session/new":
        out({"jsonrpc": "2.0", "id": i, "result": {"sessionId": "slow-titles"}})
    elif meth == "session/set_title":
        open(started, "w").write("x")
        while not os.path.exists(gate):
            time.sleep(0.02)
        out({"jsonrpc": "2.0", "id": i, "result": {}})
    else:
        out({"jsonrpc": "2.0", "id": i, "result": {}})
"#;

/// Hostile review of issue 18: a title the agent took after its editor went away (the session
/// detached in `acpd serve` while the agent answered `session/set_title`) was never written to
/// the session map: the answer was dropped with the call. The agent took it, so it is
/// recorded.
#[test]
fn a_title_taken_while_detached_is_recorded() {
    let env = Env::raw("");
    let script = env.path().join("titles.py");
    std::fs::write(&script, SLOW_TITLES).unwrap();
    let (started, gate) = (env.path().join("started"), env.path().join("gate"));
    std::fs::write(
        &env.config,
        format!(
            "default_provider = \"t\"\ndetach_timeout = \"10m\"\n[providers.t]\n\
             command = [\"python3\", \"{}\", \"{}\", \"{}\"]\n",
            script.display(),
            started.display(),
            gate.display()
        ),
    )
    .unwrap();
    let cwd = work(&env);
    let serve = Serve::start(&env);
    let mut editor = serve.connect();
    editor.initialize(json!({}));
    let sid = editor.new_session(&cwd, "t");
    editor.send(
        "session/set_title",
        json!({"sessionId": sid, "title": "named while away"}),
    );
    assert!(
        eventually(SETTLE, || started.exists()),
        "the agent never got the title"
    );
    drop(editor);
    assert!(
        eventually(SETTLE, || live(&serve) == (0, 1)),
        "the session never detached"
    );
    std::fs::write(&gate, "go").unwrap();
    assert!(
        eventually(SETTLE, || row_of(&env, &sid)
            .is_some_and(|r| r.0.as_deref() == Some("named while away"))),
        "the title the agent took is not in the map: {:?}",
        row_of(&env, &sid)
    );
}
