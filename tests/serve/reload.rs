//! `acpd reload` against a real `acpd serve`: exit 0 with the new config in force, 2 with the
//! config error (file, line, key) and the old config kept, 1 with no daemon or for a caller
//! other than acpd's own user.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::daemon::Daemon;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// What this file asks of its daemon beyond the shared fixture.
trait Reload {
    fn providers(&self) -> Vec<String>;
    fn write_config(&self, toml: &str);
}

impl Reload for Daemon {
    fn providers(&self) -> Vec<String> {
        let out = self.cli(&["status", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        serde_json::from_value(v["providers"].clone()).unwrap()
    }

    fn write_config(&self, toml: &str) {
        std::fs::write(&self.env.config, toml).unwrap();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn echo_provider(name: &str) -> String {
    format!("[providers.{name}]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n")
}

#[test]
fn a_good_file_is_in_force_when_reload_returns() {
    let d = Daemon::start(Env::raw(&echo_provider("first")));
    assert_eq!(d.providers(), ["echo", "first"]);
    d.write_config(&format!(
        "default_provider = \"second\"\n{}{}",
        echo_provider("first"),
        echo_provider("second")
    ));
    let out = d.cli(&["reload"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("config.toml")
            && said.contains("echo, first, second")
            && said.contains("default second"),
        "{said}"
    );
    // No wait between the two: reload's exit means "in force".
    assert_eq!(d.providers(), ["echo", "first", "second"]);
    let out = d.cli(&["reload", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["providers"],
        serde_json::json!(["echo", "first", "second"])
    );
    assert_eq!(v["defaultProvider"], "second");
    assert!(
        v["source"].as_str().unwrap().ends_with("config.toml"),
        "{v}"
    );
}

#[test]
fn a_broken_file_exits_2_with_file_line_and_key_and_the_old_config_serves() {
    let d = Daemon::start(Env::raw(&echo_provider("first")));
    d.write_config(&format!(
        "{}max_children = \"lots\"\n",
        echo_provider("second")
    ));
    let out = d.cli(&["reload"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("config.toml:3") && err.contains("max_children") && err.contains("previous"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    assert_eq!(d.providers(), ["echo", "first"]);
    assert!(
        eventually(Duration::from_secs(5), || d
            .log()
            .contains("config reload rejected")),
        "{}",
        d.log()
    );
    // And the old config still runs things.
    let mut conn = common::raw::Raw::socket(&d.socket);
    conn.initialize(serde_json::json!({}));
    let started = conn.ok(
        "_acpd/subagent/start",
        serde_json::json!({"provider": "first", "cwd": d.env.path(),
            "prompt": [{"type": "text", "text": "still here"}]}),
    );
    let result = conn.wait_run(started["runId"].as_str().unwrap());
    assert!(output_text(&result).contains("still here"), "{result}");

    // A file that disappeared is rejected the same way.
    std::fs::remove_file(&d.env.config).unwrap();
    let out = d.cli(&["reload"]);
    assert_eq!(code(&out), 2);
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(d.providers(), ["echo", "first"]);
}

#[test]
fn no_daemon_exits_1_and_says_so() {
    let env = Env::new("");
    let out = env
        .acpd()
        .args(["reload", "--socket"])
        .arg(env.path().join("nobody.sock"))
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    assert!(
        text(&out.stderr).contains("no acpd daemon at"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn sighup_still_reloads() {
    let d = Daemon::start(Env::raw(&echo_provider("first")));
    d.write_config(&format!(
        "{}{}",
        echo_provider("first"),
        echo_provider("hup")
    ));
    kill(d.pid(), Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || d.providers().len() == 3),
        "{}",
        d.log()
    );
}

/// A member of `allow_group` may connect and run things, but not reload: exit 1, nothing read.
#[test]
fn a_group_member_may_not_reload() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: needs root to run the client as another user");
        return;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        eprintln!("skipped: no user `nobody`");
        return;
    };
    let Ok(Some(group)) = nix::unistd::Group::from_gid(nobody.gid) else {
        eprintln!("skipped: nobody's primary group has no name");
        return;
    };
    let d = Daemon::start(Env::raw(&format!(
        "allow_group = \"{}\"\n{}",
        group.name,
        echo_provider("first")
    )));
    // Let `nobody` reach the socket: the test's directories are root's and 0700.
    for p in [d.env.path(), &d.env.path().join("run")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    d.write_config(&format!(
        "{}{}",
        echo_provider("first"),
        echo_provider("second")
    ));
    let as_nobody = |args: &[&str]| {
        base()
            .args(args)
            .arg("--socket")
            .arg(&d.socket)
            .current_dir("/")
            .uid(nobody.uid.as_raw())
            .gid(nobody.gid.as_raw())
            .output()
            .unwrap()
    };
    // Admitted: status works.
    let out = as_nobody(&["status"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let out = as_nobody(&["reload"]);
    assert_eq!(code(&out), 1, "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("only acpd's own user"), "{err}");
    assert!(!err.contains("config.toml"), "{err}");
    assert_eq!(d.providers(), ["echo", "first"]);
}

/// Threads of process `pid` (/proc/PID/status).
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// The config replaced by a FIFO nobody writes, then a flood of SIGHUPs: the read is refused
/// at once ("not a regular file"), reloads coalesce, so the thread count stays small and the
/// daemon keeps serving sessions (whose store needs the blocking pool) and queries; a good
/// file put back is taken at the next SIGHUP. (Before: a read blocked per SIGHUP, 5 → 517
/// threads, and session/new hung.) Its handshake_timeout is at the ceiling: session/new on it
/// used to be never answered (a panic computing the deadline).
#[test]
fn a_fifo_config_and_a_flood_of_sighups_leave_the_daemon_serving() {
    // A durable provider (its sessions listed from the agent's own store).
    let env = Env::raw("");
    let first = format!(
        "[providers.first]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--sessions\", \"{}\"]\n\
         handshake_timeout = \"30days\"\n",
        env.path().join("echo-sessions").display()
    );
    std::fs::write(&env.config, &first).unwrap();
    let d = Daemon::start(env);
    let pid = d.pid().as_raw() as u32;
    std::fs::remove_file(&d.env.config).unwrap();
    nix::unistd::mkfifo(
        &d.env.config,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let out = d.cli(&["reload", "--timeout", "10"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("config.toml") && err.contains("not a regular file (it is a FIFO)"),
        "{err}"
    );
    for _ in 0..600 {
        kill(Pid::from_raw(pid as i32), Signal::SIGHUP).unwrap();
    }
    assert!(
        eventually(Duration::from_secs(10), || d
            .log()
            .matches("not a regular file")
            .count()
            >= 2),
        "{}",
        d.log()
    );
    let now = threads(pid);
    assert!(now <= 32, "{now} threads after the SIGHUP flood");
    let mut conn = common::raw::Raw::socket(&d.socket);
    conn.initialize(serde_json::json!({}));
    let session = conn.new_session(d.env.path(), "first");
    let id = conn.send_prompt(&session, "after the flood");
    let answer = conn.answer(&serde_json::json!(id));
    assert_eq!(
        answer.value["result"]["stopReason"],
        "end_turn",
        "{}",
        answer.text()
    );
    let listed = conn.ok("session/list", serde_json::json!({}));
    assert!(listed.to_string().contains(&session), "{listed}");
    let providers = conn.ok("_acpd/providers", serde_json::json!({}));
    assert!(providers.to_string().contains("first"), "{providers}");
    assert_eq!(d.providers(), ["echo", "first"]);
    // A good file again, and SIGHUP: taken.
    std::fs::remove_file(&d.env.config).unwrap();
    d.write_config(&format!("{first}{}", echo_provider("late")));
    kill(Pid::from_raw(pid as i32), Signal::SIGHUP).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || d.providers().len() == 3),
        "{}",
        d.log()
    );
    let now = threads(pid);
    assert!(now <= 32, "{now} threads at the end");
}

/// Many reloads at once, from the socket and SIGHUP, while a run is going: every caller gets
/// an answer, the run finishes on the provider it started with although the new file drops it.
#[test]
fn reloads_race_a_run_and_each_other() {
    let d = Daemon::start(Env::raw(&echo_provider("first")));
    let mut conn = common::raw::Raw::socket(&d.socket);
    conn.initialize(serde_json::json!({}));
    let started = conn.ok(
        "_acpd/subagent/start",
        serde_json::json!({"provider": "first", "cwd": d.env.path(),
            "prompt": [{"type": "text", "text": ":sleep 1500\nfinished on first"}]}),
    );
    d.write_config(&echo_provider("second"));
    let pid = d.pid();
    std::thread::scope(|s| {
        let callers: Vec<_> = (0..16).map(|_| s.spawn(|| d.cli(&["reload"]))).collect();
        for _ in 0..16 {
            kill(pid, Signal::SIGHUP).unwrap();
        }
        for c in callers {
            let out = c.join().unwrap();
            assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        }
    });
    assert_eq!(d.providers(), ["echo", "second"]);
    let result = conn.wait_run(started["runId"].as_str().unwrap());
    assert!(
        output_text(&result).contains("finished on first"),
        "{result}"
    );
}

/// `acpd stdio` has no reload (whoever runs it restarts it): METHOD_NOT_FOUND, not a crash.
#[test]
fn stdio_has_no_reload() {
    let env = Env::new("");
    let mut conn = common::raw::Raw::stdio(&env);
    conn.initialize(serde_json::json!({}));
    let reply = conn.call("_acpd/reload", serde_json::json!({}));
    assert_eq!(reply["error"]["code"], -32601, "{reply}");
    let reply = conn.call("_acpd/reload", serde_json::json!([1]));
    assert_eq!(reply["error"]["data"]["code"], "INVALID_REQUEST", "{reply}");
}

/// An agent runs as acpd's user and can reach its socket, but reloading is the operator's: a
/// child's descendant calling `acpd reload` is refused (exit 1) and nothing is re-read.
#[test]
fn a_child_of_acpd_may_not_reload_it() {
    let env = Env::raw("");
    let said = env.path().join("child-reload.txt");
    let socket = env.path().join("run/acpd.sock");
    let config = format!(
        "{}[providers.reloader]\ncommand = [\"/bin/sh\", \"-c\", \
         \"\\\"$ACPD_BIN\\\" reload --socket \\\"$SOCK\\\" > \\\"$SAID\\\" 2>&1; echo \\\"exit $?\\\" >> \\\"$SAID\\\"; \
         exec \\\"$ACPD_BIN\\\" agent echo\"]\n\
         env = {{ ACPD_BIN = \"{BIN}\", SOCK = \"{}\", SAID = \"{}\" }}\n",
        echo_provider("first"),
        socket.display(),
        said.display()
    );
    std::fs::write(&env.config, config.as_bytes()).unwrap();
    let d = Daemon::start(env);
    // The file now on disk has one more provider: a reload that got through would list it.
    let mut on_disk = std::fs::read_to_string(&d.env.config).unwrap();
    on_disk.push_str(&echo_provider("sneaked"));
    d.write_config(&on_disk);
    let mut conn = common::raw::Raw::socket(&d.socket);
    conn.initialize(serde_json::json!({}));
    let started = conn.ok(
        "_acpd/subagent/start",
        serde_json::json!({"provider": "reloader", "cwd": d.env.path(),
            "prompt": [{"type": "text", "text": "after the attempt"}]}),
    );
    let result = conn.wait_run(started["runId"].as_str().unwrap());
    assert!(
        output_text(&result).contains("after the attempt"),
        "{result}"
    );
    let said = std::fs::read_to_string(&said).unwrap();
    assert!(
        said.contains("may not reload") && said.contains("exit 1"),
        "{said}"
    );
    assert!(!d.providers().contains(&"sneaked".to_string()));
}
