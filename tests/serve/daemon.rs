//! `acpd serve` end to end with the real binary: socket activation, `acpd connect`, peer
//! credentials, sd_notify, SIGHUP reload, SIGTERM with a TERM-deaf child, crash recovery of
//! strays, capacity, status and doctor. This binary makes itself a subreaper (PID 1 here reaps
//! nothing), so orphans it adopts are reaped by pid before survivors are counted.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::client::AcpClient;
use common::daemon::Daemon;
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// SIGTERM, then SIGKILL after 20 s.
fn stop(child: &mut Child) {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    if !eventually(Duration::from_secs(20), || {
        child.try_wait().is_ok_and(|s| s.is_some())
    }) {
        let _ = child.kill();
    }
    let _ = child.wait();
}

fn subreaper() {
    nix::sys::prctl::set_child_subreaper(true).unwrap();
}

/// Gone, reaping it first if it was orphaned to this (subreaper) test process.
fn gone(pid: i32) -> bool {
    eventually(Duration::from_secs(10), || {
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        !exists(pid)
    })
}

fn fast_env(extra: &str) -> Env {
    Env::new(extra)
}

async fn start_run(client: &AcpClient, text: &str) -> Value {
    client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": [{"type": "text", "text": text}], "cwd": "/tmp"}),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn two_clients_at_once_through_connect() {
    let d = Daemon::start(fast_env(""));
    let mut a = d.client();
    let mut b = d.client();
    a.initialize(json!({})).await;
    b.initialize(json!({})).await;
    let sa = a.new_session(Path::new("/tmp"), None).await;
    let sb = b.new_session(Path::new("/tmp"), None).await;
    let ra = a.send(
        "session/prompt",
        json!({"sessionId": sa, "prompt": [{"type": "text", "text": "from a\n:sleep 300"}]}),
    );
    let rb = b.send(
        "session/prompt",
        json!({"sessionId": sb, "prompt": [{"type": "text", "text": "from b\n:sleep 300"}]}),
    );
    assert_eq!(
        d.status()["connections"],
        3,
        "two clients and this status query"
    );
    assert_eq!(ra.await.unwrap().unwrap()["stopReason"], "end_turn");
    assert_eq!(rb.await.unwrap().unwrap()["stopReason"], "end_turn");
    assert_eq!(a.drain_text(&sa), "from a\n");
    assert_eq!(b.drain_text(&sb), "from b\n");
    // One client leaving does not touch the other.
    a.close().await;
    assert_eq!(
        b.prompt(&sb, "still").await.unwrap()["stopReason"],
        "end_turn"
    );
    b.close().await;
    d.terminate();
}

#[test]
fn connect_without_a_daemon_says_how_to_start_one() {
    let env = Env::new("");
    let out = env
        .acpd()
        .args(["connect", "--socket", "/nonexistent/acpd.sock"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("acpd serve"), "{err}");
}

#[tokio::test]
async fn connect_or_stdio_serves_in_process() {
    let env = Env::new("");
    let client = AcpClient::spawn_with(
        &env,
        &[
            "connect",
            "--socket",
            "/nonexistent/acpd.sock",
            "--or-stdio",
        ],
    );
    client.initialize(json!({})).await;
    let sid = client.new_session(env.path(), None).await;
    assert_eq!(
        client.prompt(&sid, "hi").await.unwrap()["stopReason"],
        "end_turn"
    );
    assert!(client.close().await.success());
}

#[test]
fn socket_is_private_and_a_second_daemon_refuses() {
    let d = Daemon::start(fast_env(""));
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d.socket), 0o600);
    assert_eq!(mode(d.socket.parent().unwrap()), 0o700);
    let out = d
        .env
        .acpd()
        .args(["serve", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serving"));
    let records = records_in(&d.state).len();
    assert_eq!(
        records, 1,
        "the refused daemon left a record beside the live one's"
    );
    d.terminate();
}

/// `acpd serve --socket PATH` on something that is not a stale socket of its own: refused
/// with a clear error, and the thing is left as it was.
#[test]
fn serve_never_removes_what_is_not_a_stale_socket() {
    let env = fast_env("");
    let file = env.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    let link = env.path().join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    for (path, what) in [(&file, "is a regular file"), (&link, "is a symbolic link")] {
        let mut child = env
            .acpd()
            .args(["serve", "--socket"])
            .arg(path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let exited = eventually(Duration::from_secs(20), || {
            child.try_wait().is_ok_and(|s| s.is_some())
        });
        if !exited {
            stop(&mut child);
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(exited, "acpd served on {}: {stderr}", path.display());
        assert_eq!(code(&out), 1, "{stderr}");
        assert!(
            stderr.contains(what) && stderr.contains("not a socket"),
            "{stderr}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    }
}

#[test]
fn foreign_uid_is_refused() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!(
            "SKIPPED: needs root to act as another uid; the rule is unit-tested in runtime::socket"
        );
        return;
    }
    let d = Daemon::start(fast_env(""));
    // Open the path up so only the peer-credential check stands between uid 65534 and acpd.
    use std::os::unix::fs::PermissionsExt;
    for p in [d.env.path(), d.socket.parent().unwrap()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--socket"]).arg(&d.socket);
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    let out = cmd.output().unwrap();
    assert_ne!(
        code(&out),
        0,
        "uid 65534 got an answer: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        eventually(Duration::from_secs(5), || d
            .log()
            .contains("refused a connection")),
        "{}",
        d.log()
    );
    assert!(
        d.status()["version"].is_string(),
        "acpd's own user still gets in"
    );
    d.terminate();
}

#[test]
fn socket_activation_through_systemd_socket_activate() {
    if Command::new("systemd-socket-activate")
        .arg("--help")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: systemd-socket-activate is not installed (Debian package systemd)");
        return;
    }
    let env = fast_env("");
    let socket = env.path().join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .args(["--", BIN, "--config"])
        .arg(&env.config)
        .args(["serve"])
        .env("XDG_CONFIG_HOME", "/nonexistent-acpd-test-config")
        .env("STATE_DIRECTORY", env.path().join("state"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || socket.exists()));
    let out = env
        .acpd()
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["pid"],
        activator.id(),
        "systemd-socket-activate execs acpd in place"
    );
    kill(Pid::from_raw(activator.id() as i32), Signal::SIGTERM).unwrap();
    assert!(activator.wait().unwrap().success());
}

fn notifications(sock: &UnixDatagram, until: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = msg.contains(until);
            seen.push(msg);
            if done {
                return seen;
            }
        }
    }
    panic!("no {until} in {seen:?}");
}

#[tokio::test]
async fn sighup_reloads_valid_files_rejects_invalid_ones_and_notifies() {
    let env = fast_env("");
    let notify_path = env.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let d = Daemon::start_with(env, |c| {
        c.env("NOTIFY_SOCKET", &notify_path)
            .env("WATCHDOG_USEC", "200000");
    });
    let seen = notifications(&notify, "READY=1");
    assert!(seen.iter().any(|m| m.contains("READY=1")));
    notifications(&notify, "WATCHDOG=1");
    let providers = |d: &Daemon| -> Vec<String> {
        let v = d.status();
        v["providers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(providers(&d), ["echo", "fast"]);

    let original = std::fs::read_to_string(&d.env.config).unwrap();
    std::fs::write(
        &d.env.config,
        format!("{original}\n[providers.added]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n"),
    )
    .unwrap();
    kill(d.pid(), Signal::SIGHUP).unwrap();
    let seen = notifications(&notify, "READY=1");
    assert!(
        seen.iter()
            .any(|m| m.contains("RELOADING=1") && m.contains("MONOTONIC_USEC=")),
        "{seen:?}"
    );
    assert!(eventually(Duration::from_secs(5), || providers(&d)
        == ["added", "echo", "fast"]));

    std::fs::write(&d.env.config, "this is = = not toml").unwrap();
    kill(d.pid(), Signal::SIGHUP).unwrap();
    notifications(&notify, "READY=1");
    assert!(eventually(Duration::from_secs(5), || d
        .log()
        .contains("config reload rejected")));
    assert_eq!(
        providers(&d),
        ["added", "echo", "fast"],
        "the old config stays"
    );
    assert!(
        d.log().contains(&d.env.config.display().to_string()),
        "the log names the file"
    );

    let mut d = d;
    kill(d.pid(), Signal::SIGTERM).unwrap();
    notifications(&notify, "STOPPING=1");
    assert!(d.wait().success());
}

#[tokio::test]
async fn sigterm_mid_run_tears_everything_down_within_the_bound() {
    subreaper();
    let d = Daemon::start(fast_env(""));
    let mut client = d.client();
    client.initialize(json!({})).await;
    let sid = client
        .new_session(
            Path::new("/tmp"),
            Some(json!({"acpd": {"provider": "fast"}})),
        )
        .await;
    let _turn = client.send("session/prompt", json!({"sessionId": sid, "prompt": [{"type": "text", "text": ":pid\n:grandchild\n:ignore-eof\n:ignore-term\n:hang-deaf"}]}));
    let (_, n1) = client.next_note().await;
    let (_, n2) = client.next_note().await;
    let leader = pid_after(n1["update"]["content"]["text"].as_str().unwrap(), "pid ");
    let grandchild = pid_after(
        n2["update"]["content"]["text"].as_str().unwrap(),
        "grandchild ",
    );
    let run = start_run(&client, ":pid\n:ignore-term\n:hang-deaf").await;
    assert!(run["runId"].is_string());
    let status = d.status();
    assert_eq!(status["limits"]["liveChildren"], 2, "{status}");
    // fast: cancel_grace + eof_grace + term_grace = 0.9 s; the bound adds a 2 s margin.
    let (_, took) = d.terminate();
    assert!(
        took < Duration::from_secs(3) + Duration::from_secs(2),
        "shutdown took {took:?}"
    );
    for pid in [leader, grandchild] {
        assert!(gone(pid), "{pid} survived the daemon's SIGTERM");
    }
    client.close().await;
}

#[tokio::test]
async fn strays_of_a_sigkilled_daemon_are_swept_at_the_next_start() {
    subreaper();
    let env = fast_env("");
    let d = Daemon::start(env);
    let mut client = d.client();
    client.initialize(json!({})).await;
    let sid = client
        .new_session(
            Path::new("/tmp"),
            Some(json!({"acpd": {"provider": "fast"}})),
        )
        .await;
    let _turn = client.send(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": ":grandchild\n:hang-deaf"}]}),
    );
    let (_, note) = client.next_note().await;
    let grandchild = pid_after(
        note["update"]["content"]["text"].as_str().unwrap(),
        "grandchild ",
    );
    let records = records_in(&d.state).len();
    assert_eq!(records, 1, "one record for the live daemon");

    let mut d = d;
    kill(d.pid(), Signal::SIGKILL).unwrap();
    d.wait();
    client.close().await;
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        exists(grandchild),
        "the grandchild outlives a SIGKILLed acpd (PDEATHSIG reaches only the child)"
    );

    let _ = std::fs::remove_file(&d.socket);
    let state = d.state.clone();
    let env = std::mem::replace(&mut d.env, Env::new(""));
    drop(d);
    let d = Daemon::start(env);
    assert_eq!(d.state, state);
    assert!(
        gone(grandchild),
        "the restarted daemon swept the stray {grandchild}"
    );
    assert!(d.log().contains("swept process groups"), "{}", d.log());
    d.terminate();
}

#[tokio::test]
async fn capacity_at_the_limit_and_status_while_runs_are_live() {
    let d = Daemon::start(fast_env("max_children = 1"));
    let client = d.client();
    client.initialize(json!({})).await;
    let first = start_run(&client, ":hang").await;
    let e = client
        .request(
            "_acpd/subagent/start",
            json!({"provider": "fast", "prompt": [], "cwd": "/tmp"}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.data.as_ref().unwrap()["code"],
        "CAPACITY",
        "{}",
        e.message
    );
    let status = d.status();
    assert_eq!(
        (
            status["runs"].as_u64(),
            status["limits"]["liveChildren"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let runs: Value = serde_json::from_slice(&d.cli(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs["runs"][0]["runId"], first["runId"]);
    assert!(runs["runs"][0]["pid"].as_i64().is_some());
    client
        .request("_acpd/subagent/dispose", json!({"runId": first["runId"]}))
        .await
        .unwrap();
    start_run(&client, "again").await;
    client.close().await;
    d.terminate();
}

/// The second start waits in the queue (seen in `_acpd/status`, not assumed after a sleep)
/// and is served by the slot the dispose frees.
#[tokio::test]
async fn queue_timeout_waits_for_a_free_slot() {
    let d = Daemon::start(fast_env("max_children = 1\nqueue_timeout = \"10s\""));
    let client = d.client();
    client.initialize(json!({})).await;
    let first = start_run(&client, ":hang").await;
    let mut queued = client.send(
        "_acpd/subagent/start",
        json!({"provider": "fast", "prompt": [{"type": "text", "text": "queued"}], "cwd": "/tmp"}),
    );
    // Polled without blocking this runtime: the client that sends the start runs on it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.status()["limits"]["queued"] != 1 {
        assert!(
            Instant::now() < deadline,
            "the second start never queued: {}",
            d.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        queued.try_recv().is_err(),
        "a queued start answered before a slot was free"
    );
    client
        .request("_acpd/subagent/dispose", json!({"runId": first["runId"]}))
        .await
        .unwrap();
    let second = queued.await.unwrap().unwrap();
    let r = client
        .request("_acpd/subagent/wait", json!({"runId": second["runId"]}))
        .await
        .unwrap();
    assert_eq!(r["output"][0]["text"], "queued");
    client.close().await;
    d.terminate();
}

#[test]
fn doctor_reports_each_provider() {
    let env = Env::raw(&format!(
        "[providers.good]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n[providers.missing]\ncommand = [\"/nonexistent/agent\"]\n"
    ));
    let out = env.acpd().args(["doctor", "good"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{text}");
    assert!(
        text.contains("good: OK") && text.contains("ACP protocol 1") && text.contains("acpd-echo"),
        "{text}"
    );
    let out = env.acpd().args(["doctor"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 1, "{text}");
    assert!(
        text.contains("missing: FAIL") && text.contains("/nonexistent/agent"),
        "{text}"
    );
    assert!(text.contains("echo: OK"), "{text}");
}

#[tokio::test]
async fn a_second_sigterm_kills_the_children_at_once() {
    subreaper();
    let slow = format!(
        "[providers.slow]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\ncancel_grace = \"20s\"\neof_grace = \"20s\"\nterm_grace = \"20s\"\n"
    );
    let d = Daemon::start(Env::raw(&slow));
    let client = d.client();
    client.initialize(json!({})).await;
    let run = client
        .request("_acpd/subagent/start", json!({"provider": "slow", "prompt": [{"type": "text", "text": ":pid\n:ignore-eof\n:ignore-term\n:hang-deaf"}], "cwd": "/tmp"}))
        .await
        .unwrap();
    assert!(run["runId"].is_string());
    let runs: Value = serde_json::from_slice(&d.cli(&["runs", "--json"]).stdout).unwrap();
    let child = runs["runs"][0]["pid"].as_i64().unwrap() as i32;
    let started = Instant::now();
    let mut d = d;
    kill(d.pid(), Signal::SIGTERM).unwrap();
    // The first SIGTERM is taken (not merged with the second) before the second is sent.
    assert!(
        eventually(Duration::from_secs(10), || d
            .log()
            .contains("shutting down")),
        "{}",
        d.log()
    );
    kill(d.pid(), Signal::SIGTERM).unwrap();
    d.wait();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the graces (60 s) were not skipped: {:?}",
        started.elapsed()
    );
    assert!(gone(child), "child {child} survived the second SIGTERM");
    client.close().await;
}

/// utime + stime of a process, from /proc/PID/stat (fields 14 and 15, clock ticks).
fn cpu_time(pid: Pid) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // After the comm field: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// One `initialize` over a raw connection; returns its answer (or `None` on EOF).
fn initialize_over(stream: &UnixStream) -> Option<Value> {
    use std::io::Write;
    let mut w = stream;
    writeln!(
        w,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{}}}}}}"#
    )
    .ok()?;
    first_line(stream).and_then(|l| serde_json::from_str(&l).ok())
}

fn first_line(stream: &UnixStream) -> Option<String> {
    use std::io::BufRead;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut line = String::new();
    match std::io::BufReader::new(stream).read_line(&mut line) {
        Ok(n) if n > 0 => Some(line),
        _ => None,
    }
}

/// At EMFILE the listener stays readable and every accept fails at once: acpd must back off
/// instead of spinning a core, and serve again once descriptors are free.
#[test]
fn accept_at_emfile_backs_off_and_recovers() {
    use std::os::unix::process::CommandExt;
    const NOFILE: u64 = 32;
    let d = Daemon::start_with(fast_env(""), |c| {
        // SAFETY: setrlimit is async-signal-safe; nothing is allocated between fork and exec.
        unsafe {
            c.pre_exec(|| {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    NOFILE,
                    NOFILE,
                )
                .map_err(std::io::Error::from)
            });
        }
    });
    // More connections than descriptors: the rest wait in the backlog, unacceptable.
    let held: Vec<UnixStream> = (0..NOFILE + 8)
        .map(|_| UnixStream::connect(&d.socket).unwrap())
        .collect();
    assert!(
        eventually(Duration::from_secs(10), || d
            .log()
            .contains("accept failed")),
        "acpd never hit EMFILE: {}",
        d.log()
    );
    let before = cpu_time(d.pid());
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_time(d.pid()) - before;
    eprintln!("CPU time at EMFILE over 2 s: {spent:?}");
    assert!(
        spent < Duration::from_millis(500),
        "acpd spun at EMFILE: {spent:?} of CPU in 2 s"
    );
    let failures = d.log().matches("accept failed").count();
    assert!(failures < 40, "{failures} accept failures logged in ~2 s");
    drop(held);
    assert!(
        eventually(Duration::from_secs(15), || {
            let out = d.cli(&["status", "--json"]);
            out.status.success()
        }),
        "acpd does not serve again after EMFILE: {}",
        d.log()
    );
    d.terminate();
}

/// The connection over max_connections gets the one LIMIT line and is closed; a freed slot
/// is served again.
#[test]
fn connection_over_max_connections_gets_one_limit_line() {
    let d = Daemon::start(fast_env("max_connections = 2"));
    // Answered, so both are accepted and counted before the third arrives. (Retried: the
    // start-up probe's connection holds a slot until the daemon sees it closed.)
    let served = || {
        let mut conn = None;
        let ok = eventually(Duration::from_secs(10), || {
            let c = UnixStream::connect(&d.socket).unwrap();
            let answered = initialize_over(&c).is_some_and(|v| v["result"].is_object());
            conn = answered.then_some(c);
            answered
        });
        assert!(ok, "no slot served: {}", d.log());
        conn.unwrap()
    };
    let a = served();
    let b = served();
    let extra = UnixStream::connect(&d.socket).unwrap();
    let line = first_line(&extra).expect("one line before the close");
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        v,
        json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": -33013,
            "message": v["error"]["message"],
            "data": {"code": "LIMIT", "limit": "max_connections", "value": 2},
        }}),
        "{line}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_connections")
    );
    assert_eq!(first_line(&extra), None, "closed after the one line");
    // A client that sends first still reads the line (its write may already find the
    // connection closed: EPIPE, the line is still there to read).
    let eager = UnixStream::connect(&d.socket).unwrap();
    {
        use std::io::Write;
        let _ = (&eager).write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"_acpd/status\"}\n");
    }
    let answer: Value = serde_json::from_str(&first_line(&eager).expect("the LIMIT line")).unwrap();
    assert_eq!(answer["error"]["data"]["limit"], "max_connections");
    // Still serving the two; one leaves and its slot is served again.
    assert!(initialize_over(&a).unwrap()["result"].is_object());
    drop(b);
    let _c = served();
    assert!(d.log().contains("max_connections"), "{}", d.log());
    drop(a);
    d.terminate();
}

/// `acpd connect` with its stdin and stdout piped to this test, one `initialize` answered
/// through it (so the connection is up end to end).
fn connected(d: &Daemon) -> Child {
    use std::io::{BufRead, Write};
    let mut connect = d
        .env
        .acpd()
        .args(["connect", "--socket"])
        .arg(&d.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = connect.stdin.as_mut().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{}}}}}}"#
    )
    .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(connect.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert!(v["result"].is_object(), "{line}");
    connect
}

fn exit_within(child: &mut Child, limit: Duration) -> std::process::Output {
    assert!(
        eventually(limit, || child.try_wait().unwrap().is_some()),
        "acpd connect still running after {limit:?}"
    );
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: stderr.into_bytes(),
    }
}

/// The daemon SIGKILLed under a live `acpd connect`: connect exits 1 with one line saying so
/// (it used to exit 0, as if the editor had finished). An editor that closes stdin still
/// makes connect exit 0.
#[test]
fn connect_exits_non_zero_when_the_daemon_goes_away() {
    let mut d = Daemon::start(fast_env(""));
    let mut finished = connected(&d);
    drop(finished.stdin.take());
    let out = exit_within(&mut finished, Duration::from_secs(10));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));

    let mut connect = connected(&d);
    kill(d.pid(), Signal::SIGKILL).unwrap();
    d.wait();
    let out = exit_within(&mut connect, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("went away"), "{err}");
}

/// 64 runs started at once in one daemon: its record lists all 64 groups (one writer, atomic
/// replace: none lost to a race), and after a SIGKILL the next daemon sweeps every one of
/// them (each run's grandchild outlives PDEATHSIG and must be killed by the sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_starts_are_all_recorded_and_swept() {
    const RUNS: usize = 64;
    subreaper();
    // One connection holds all 64 runs and their 64 starts at once.
    // The records and their sweep are what is tested here: process groups, not cgroups.
    let d = Daemon::start(fast_env(
        "max_sessions_per_connection = 64\nmax_pending_requests = 128\ncontainment = \"process-group\"",
    ));
    let client = d.client();
    client.initialize(json!({})).await;
    let pending: Vec<_> = (0..RUNS)
        .map(|_| {
            client.send(
                "_acpd/subagent/start",
                json!({"provider": "fast", "prompt": [{"type": "text", "text": ":grandchild"}], "cwd": "/tmp"}),
            )
        })
        .collect();
    let mut grandchildren = Vec::new();
    for started in pending {
        let run = tokio::time::timeout(Duration::from_secs(60), started)
            .await
            .expect("start in time")
            .unwrap()
            .unwrap();
        let r = client
            .request("_acpd/subagent/wait", json!({"runId": run["runId"]}))
            .await
            .unwrap();
        grandchildren.push(pid_after(&output_text(&r), "grandchild "));
    }
    let runs: Value = serde_json::from_slice(&d.cli(&["runs", "--json"]).stdout).unwrap();
    let mut leaders: Vec<i64> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].as_i64().unwrap())
        .collect();
    leaders.sort_unstable();
    assert_eq!(leaders.len(), RUNS, "{runs}");
    let records = records_in(&d.state);
    assert_eq!(
        records.len(),
        1,
        "one record, no temp file left: {records:?}"
    );
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&records[0]).unwrap()).unwrap();
    let mut recorded: Vec<i64> = record["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["pgid"].as_i64().unwrap())
        .collect();
    recorded.sort_unstable();
    assert_eq!(recorded, leaders, "every live group is in the record");

    let mut d = d;
    // The sentinel would end the trees itself (tests/system/containment.rs); killed first, it leaves
    // them to the successor's sweep.
    kill(sentinel_of(d.pid()), Signal::SIGKILL).unwrap();
    kill(d.pid(), Signal::SIGKILL).unwrap();
    d.wait();
    drop(client);
    for &pid in &grandchildren {
        assert!(exists(pid), "grandchild {pid} outlives a SIGKILLed acpd");
    }
    let _ = std::fs::remove_file(&d.socket);
    let env = std::mem::replace(&mut d.env, Env::new(""));
    drop(d);
    let d = Daemon::start(env);
    for &pid in &grandchildren {
        assert!(gone(pid), "the sweep missed grandchild {pid}");
    }
    // The leaders died by PDEATHSIG; killed also counts those not yet reaped (zombies).
    let log = d.log();
    let killed: usize = log
        .lines()
        .find(|l| l.contains("swept process groups"))
        .and_then(|l| l.split("killed=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no sweep logged: {log}"));
    assert!(killed >= RUNS, "swept {killed} processes: {log}");
    d.terminate();
}

/// acpd's sentinel (`acpd sentinel`): the child of `acpd` that outlives it.
fn sentinel_of(acpd: Pid) -> Pid {
    let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: i32 = stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let sentinel = cmdline.split(|b| *b == 0).nth(1) == Some(b"sentinel".as_slice());
        (ppid == acpd.as_raw() && sentinel).then_some(pid)
    });
    Pid::from_raw(found.expect("acpd's sentinel"))
}

/// What the state directory holds besides the session map: child records (and temp files).
fn records_in(dir: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            !p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("sessions.sqlite3"))
        })
        .collect()
}

/// Issue 18 (beyond the list): every refused connection lingered for a while holding one of
/// acpd's descriptors, however many there were, so a flood of connections over the limits
/// (a group member, or a child over max_connections_per_child) held descriptors without
/// bound. At most a bounded number linger; the rest get their LIMIT line and are closed.
#[test]
fn a_flood_of_refused_connections_holds_a_bounded_number_of_descriptors() {
    let d = Daemon::start(fast_env("max_connections = 1"));
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .unwrap()
            .count()
    };
    // Retried: the start-up probe's connection holds the slot until the daemon sees it close.
    let mut held = None;
    assert!(eventually(Duration::from_secs(10), || {
        let c = UnixStream::connect(&d.socket).unwrap();
        let served = initialize_over(&c).is_some_and(|v| v["result"].is_object());
        held = served.then_some(c);
        served
    }));
    let before = fds();
    // Each is refused (its LIMIT line read) and kept open here, never read again.
    let refused: Vec<UnixStream> = (0..1000)
        .map(|_| {
            let c = UnixStream::connect(&d.socket).unwrap();
            let line = first_line(&c).expect("the LIMIT line");
            assert!(line.contains("max_connections"), "{line}");
            c
        })
        .collect();
    let during = fds();
    assert!(
        during <= before + 300,
        "{} descriptors held for {} refused connections ({before} before)",
        during,
        refused.len()
    );
    // Editors are still served once the slot is free.
    drop(held);
    assert!(eventually(Duration::from_secs(10), || {
        let c = UnixStream::connect(&d.socket).unwrap();
        initialize_over(&c).is_some_and(|v| v["result"].is_object())
    }));
}

/// `acpd runs` and `acpd status` are tables: each value under its header, a long label wrapped
/// inside its column, never pushing the columns after it.
#[tokio::test]
async fn runs_and_status_print_aligned_tables() {
    let d = Daemon::start(fast_env(""));
    let client = d.client();
    client.initialize(json!({})).await;
    let long = "a label much longer than sixteen characters, and then some";
    let mut ids = Vec::new();
    for label in ["short", long] {
        let run = client
            .request(
                "_acpd/subagent/start",
                json!({"provider": "fast", "prompt": [{"type": "text", "text": ":hang"}],
                       "cwd": "/tmp", "label": label}),
            )
            .await
            .unwrap();
        ids.push(run["runId"].as_str().unwrap().to_string());
    }
    let out = d.cli(&["runs"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(code(&out), 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    let header = lines[0];
    let at = |name: &str| {
        header
            .find(name)
            .unwrap_or_else(|| panic!("{name}: {text}"))
    };
    assert_eq!(at("RUN"), 0, "{text}");
    for id in &ids {
        let line = lines.iter().find(|l| l.starts_with(id.as_str())).unwrap();
        assert_eq!(&line[at("PROVIDER")..at("PROVIDER") + 4], "fast", "{text}");
        assert!(line[at("STATE")..].starts_with("running"), "{text}");
        assert!(line[at("LABEL")..at("STATE")].trim().len() <= 24, "{text}");
    }
    // The long label is all there, wrapped onto the lines that follow its row.
    let label_column: String = lines
        .iter()
        .skip(1)
        .filter_map(|l| l.get(at("LABEL")..at("STATE").min(l.len())))
        .map(str::trim)
        .filter(|fragment| !fragment.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    // In either order: the table lists runs as the daemon holds them.
    assert!(
        [format!("short {long}"), format!("{long} short")].contains(&label_column),
        "{label_column:?} in\n{text}"
    );

    let out = d.cli(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(code(&out), 0, "{text}");
    let header = text.lines().find(|l| l.starts_with("PROVIDER")).unwrap();
    let live = header.find("LIVE").unwrap();
    let row = text.lines().find(|l| l.starts_with("fast ")).unwrap();
    // Numbers are right-aligned under their header.
    assert_eq!(row.as_bytes()[live + "LIVE".len() - 1], b'2', "{text}");
    assert!(text.contains("runs: 2"), "{text}");
    client.close().await;
    d.terminate();
}

/// `acpd serve` says where it serves at the default log level (no ACPD_LOG).
#[test]
fn serve_announces_its_socket_at_the_default_level() {
    let env = Env::new("");
    let socket = env.path().join("s.sock");
    let log = env.path().join("serve.log");
    let mut serve = env
        .acpd()
        .args(["serve", "--socket"])
        .arg(&socket)
        .env_remove("ACPD_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let said = eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("acpd serving on"))
    });
    stop(&mut serve);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(said, "{text}");
    assert!(text.contains(&socket.display().to_string()), "{text}");
    assert!(text.contains("acpd connect"), "{text}");
}
