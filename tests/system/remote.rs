//! Children on other hosts, against a real OpenSSH server: each test starts `/usr/sbin/sshd`
//! on 127.0.0.1 (a free port) with a throwaway host key, client key and config in a tempdir,
//! and a `host = "ssh://…"` provider whose far side is this build's `acpd supervise` running
//! `acpd agent echo`. Shown: a run completes with the provider's env and cwd on the far side
//! (and the secret in no argv); SIGKILL of the local acpd, and SIGKILL of the far sshd session
//! process, each leave no process of the far tree (the agent, its grandchild, a `setsid`
//! escapee, supervise itself); a closed port, a refused key and a missing remote acpd are clear
//! START_FAILED diagnostics; a `launcher` provider works the same way.
//!
//! This binary makes itself a subreaper (PID 1 here reaps nothing): far processes orphaned by
//! a killed sshd come to it, and it reaps exactly those it checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

const SSHD: &str = "/usr/sbin/sshd";
const SECRET: &str = "sk-remote-test-secret-4242";

/// A running sshd on 127.0.0.1 with everything it needs in `dir`; killed on drop.
struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen");
    assert!(out.status.success(), "ssh-keygen: {out:?}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .expect("a user name for this uid")
        .name
}

impl Sshd {
    /// None (with the reason printed) when there is no sshd to run.
    fn start() -> Option<Sshd> {
        if !Path::new(SSHD).exists() {
            eprintln!("SKIP: {SSHD} is missing (.ci/run installs openssh-server)");
            return None;
        }
        for tool in ["ssh", "ssh-keygen"] {
            if Command::new(tool).arg("-?").output().is_err() {
                eprintln!("SKIP: `{tool}` is missing (.ci/run installs openssh-client)");
                return None;
            }
        }
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        // sshd refuses to start as root without its privilege separation directory.
        let _ = std::fs::create_dir_all("/run/sshd");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        keygen(&d.join("host_key"));
        keygen(&d.join("client_key"));
        keygen(&d.join("stranger_key"));
        std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
        let port = free_port();
        std::fs::write(
            d.join("sshd_config"),
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/host_key\n\
                 PidFile {dir}/sshd.pid\nAuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nLogLevel VERBOSE\n",
                dir = d.display()
            ),
        )
        .unwrap();
        for (name, key) in [
            ("ssh_config", "client_key"),
            ("stranger_config", "stranger_key"),
        ] {
            std::fs::write(
                d.join(name),
                format!(
                    "Host *\n  IdentityFile {dir}/{key}\n  IdentitiesOnly yes\n  \
                     StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
                    dir = d.display()
                ),
            )
            .unwrap();
        }
        let log = std::fs::File::create(d.join("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        let sshd = Sshd { dir, port, child };
        let up = eventually(Duration::from_secs(10), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "sshd did not listen: {}", sshd.log());
        Some(sshd)
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("sshd.log")).unwrap_or_default()
    }

    /// A config with one provider `far` reaching this sshd, plus `extra` keys for it.
    fn env(&self, extra: &str) -> Env {
        self.env_on(self.port, "ssh_config", BIN, extra)
    }

    fn env_on(&self, port: u16, ssh_config: &str, remote_acpd: &str, extra: &str) -> Env {
        Env::raw(&format!(
            "[providers.far]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             host = \"ssh://{user}@127.0.0.1:{port}\"\n\
             ssh_options = [\"-F\", \"{dir}/{ssh_config}\"]\nremote_acpd = \"{remote_acpd}\"\n\
             cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n\
             handshake_timeout = \"20s\"\n{extra}\n",
            user = user(),
            dir = self.path().display(),
        ))
    }
}

/// `/proc/PID/stat`'s parent pid.
fn ppid(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Waits until none of `pids` exists, reaping those that were orphaned to this process. On
/// failure the survivors are SIGKILLed (and reaped when ours), so a failing test leaks nothing.
fn all_gone(pids: &[i32]) -> bool {
    let reaped = |pid: i32| {
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        !exists(pid)
    };
    let gone = eventually(Duration::from_secs(15), || pids.iter().all(|&p| reaped(p)));
    if !gone {
        let left = alive(pids);
        for &(pid, _) in &left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        eventually(Duration::from_secs(5), || pids.iter().all(|&p| reaped(p)));
        eprintln!("survivors (now killed): {left:?}");
    }
    gone
}

fn alive(pids: &[i32]) -> Vec<(i32, String)> {
    pids.iter()
        .filter(|&&p| exists(p))
        .map(|&p| (p, comm(p)))
        .collect()
}

/// The far tree of a hanging run: supervise, the agent, its grandchild (same group) and a
/// `setsid` escapee, read from the run's streamed output. Returns the local acpd too.
struct FarTree {
    acpd: Child,
    supervise: i32,
    pids: Vec<i32>,
}

fn start_hanging_run(env: &Env) -> FarTree {
    let mut acpd = env
        .acpd()
        .env("REMOTE_TEST_SECRET", SECRET)
        .args([
            "run",
            "--provider",
            "far",
            ":pid\n:grandchild\n:escapee 600000\n:hang",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(acpd.stdout.take().unwrap()).lines();
    let mut text = String::new();
    for _ in 0..3 {
        text.push_str(&lines.next().unwrap().unwrap());
        text.push('\n');
    }
    // Keep reading (and discarding) so the run never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let agent = pid_after(&text, "pid ");
    let grandchild = pid_after(&text, "grandchild ");
    let escapee = pid_after(&text, "escapee ");
    let supervise = ppid(agent);
    let cmdline = std::fs::read(format!("/proc/{supervise}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("supervise"),
        "the agent's parent is not acpd supervise"
    );
    FarTree {
        acpd,
        supervise,
        pids: vec![supervise, agent, grandchild, escapee],
    }
}

/// No process on this machine has the secret in its argv.
fn secret_in_no_argv() {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(SECRET),
                "the secret is in the argv of {:?}",
                entry.path()
            );
        }
    }
}

/// What `sh` makes of `line`: its arguments, one per NUL-terminated record.
fn sh_words(line: &str) -> Vec<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("printf '%s\\0' {line}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "sh failed on {line:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut words: Vec<String> = text.split('\0').map(str::to_string).collect();
    words.pop();
    words
}

fn quoted(words: &[String]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| acpd::testing::quote(w)).collect();
    quoted.join(" ")
}

/// sshd hands the far command to a shell: every word must come out of it whole.
#[test]
fn hostile_words_survive_the_remote_shell_whole() {
    let words: Vec<String> = [
        "$(touch /tmp/acpd-pwned)",
        "`id`",
        "a;b",
        "x\ny",
        "'",
        "''",
        "\\",
        "*",
        "~",
        "-e",
        "$HOME",
        "!",
        "a\tb",
        "#c",
        "",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(sh_words(&quoted(&words)), words);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn any_words_round_trip_through_sh(words in proptest::collection::vec("[^\u{0}]{0,12}", 1..5)) {
        proptest::prop_assert_eq!(sh_words(&quoted(&words)), words);
    }
}

#[test]
fn a_run_through_ssh_completes_with_env_and_cwd_on_the_far_side() {
    let Some(sshd) = Sshd::start() else { return };
    let env = sshd.env("env = { MODE = \"far-mode\" }\nenv_passthrough = [\"REMOTE_TEST_SECRET\"]");
    let work = env.path().join("far work dir");
    std::fs::create_dir(&work).unwrap();
    let (result, code, stderr) = run_json(
        env.acpd()
            .env("REMOTE_TEST_SECRET", SECRET)
            .env("NOT_PASSED", "leak")
            .arg("run")
            .arg("--json")
            .args(["--provider", "far", "--cwd"])
            .arg(&work)
            .arg(":cwd\n:env MODE REMOTE_TEST_SECRET NOT_PASSED ACPD_DEPTH\nhello over ssh\n"),
    );
    assert_eq!(code, 0, "{result}\nstderr: {stderr}\nsshd: {}", sshd.log());
    assert_eq!(result["stopReason"], "completed");
    let text = output_text(&result);
    assert!(
        text.contains(&format!("cwd {}\n", work.display())),
        "{text}"
    );
    assert!(text.contains("MODE=far-mode\n"), "{text}");
    assert!(
        text.contains(&format!("REMOTE_TEST_SECRET={SECRET}\n")),
        "{text}"
    );
    assert!(text.contains("NOT_PASSED unset\n"), "{text}");
    assert!(text.contains("ACPD_DEPTH=1\n"), "{text}");
    assert!(text.ends_with("hello over ssh\n"), "{text}");
}

#[test]
fn sigkill_of_the_local_acpd_leaves_no_far_process() {
    let Some(sshd) = Sshd::start() else { return };
    let env = sshd.env("env_passthrough = [\"REMOTE_TEST_SECRET\"]");
    let mut tree = start_hanging_run(&env);
    secret_in_no_argv();
    assert!(alive(&tree.pids).len() == tree.pids.len());
    kill(Pid::from_raw(tree.acpd.id() as i32), Signal::SIGKILL).unwrap();
    tree.acpd.wait().unwrap();
    assert!(
        all_gone(&tree.pids),
        "far processes outlived the SIGKILLed acpd: {:?}",
        alive(&tree.pids)
    );
}

#[test]
fn killing_the_far_sshd_session_leaves_no_far_process() {
    let Some(sshd) = Sshd::start() else { return };
    let env = sshd.env("");
    let mut tree = start_hanging_run(&env);
    // The per-connection sshd process nearest to supervise (the session that runs its
    // command); a shell may sit in between.
    let mut session = ppid(tree.supervise);
    while comm(session) != "sshd" {
        session = ppid(session);
        assert!(session > 1, "no sshd above acpd supervise");
    }
    assert_ne!(session as u32, sshd.child.id(), "that is the listener");
    kill(Pid::from_raw(session), Signal::SIGKILL).unwrap();
    let mut gone = tree.pids.clone();
    gone.push(session);
    assert!(
        all_gone(&gone),
        "far processes outlived their sshd session: {:?}",
        alive(&gone)
    );
    // The local side sees its ssh end, and the run ends (a failure, not a hang).
    let status = eventually(Duration::from_secs(15), || {
        tree.acpd.try_wait().unwrap().is_some()
    });
    assert!(status, "the local run did not end when its connection died");
}

/// `acpd run --json` for a provider that cannot start: the START_FAILED message, after the exit
/// code: 7 for an auth failure (here ssh refusing the login), 3 for every other start failure.
fn start_failed(env: &Env, exit: i32) -> String {
    let (result, code, stderr) =
        run_json(
            env.acpd()
                .args(["run", "--json", "--provider", "far", "hi"]),
        );
    assert_eq!(code, exit, "{result}\nstderr: {stderr}");
    assert!(
        !stderr.contains("env_file"),
        "an ssh failure is not the agent's credentials: {stderr}"
    );
    assert_eq!(result["error"]["name"], "START_FAILED", "{result}");
    eprintln!("START_FAILED: {result}");
    result["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn an_unreachable_host_is_a_clear_start_failure() {
    let Some(sshd) = Sshd::start() else { return };
    let closed = free_port();
    let env = sshd.env_on(closed, "ssh_config", BIN, "");
    let message = start_failed(&env, 3);
    assert!(
        message.contains(&format!("host: {}@127.0.0.1:{closed}", user()))
            && message.contains("category: unreachable")
            && message.contains("refused the connection"),
        "{message}"
    );
}

#[test]
fn a_refused_key_and_a_missing_remote_acpd_say_so() {
    let Some(sshd) = Sshd::start() else { return };
    let refused = start_failed(&sshd.env_on(sshd.port, "stranger_config", BIN, ""), 7);
    assert!(
        refused.contains("category: auth") && refused.contains("auth refused"),
        "{refused}"
    );
    let missing = start_failed(
        &sshd.env_on(sshd.port, "ssh_config", "/nonexistent/acpd", ""),
        3,
    );
    assert!(
        missing.contains("category: no-remote-acpd") && missing.contains("exit code: 127"),
        "{missing}"
    );
    assert!(missing.contains(&format!("host: {}@127.0.0.1:{}", user(), sshd.port)));
}

#[test]
fn a_launcher_provider_runs_its_command_under_supervise() {
    // `env` as the launcher: the generalisation without a cluster (`kubectl exec -i POD --`
    // takes the same place).
    let env = Env::raw(&format!(
        "[providers.far]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         launcher = [\"env\", \"LAUNCHED=1\"]\nremote_acpd = \"{BIN}\"\n\
         env = {{ MODE = \"pod\" }}\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ));
    let work = env.path().join("w");
    std::fs::create_dir(&work).unwrap();
    let (result, code, stderr) = run_json(
        env.acpd()
            .arg("run")
            .arg("--json")
            .args(["--provider", "far", "--cwd"])
            .arg(&work)
            .arg(":cwd\n:env MODE LAUNCHED\n:pid\ndone\n"),
    );
    assert_eq!(code, 0, "{result}\nstderr: {stderr}");
    let text = output_text(&result);
    assert!(
        text.contains(&format!("cwd {}\n", work.display())),
        "{text}"
    );
    // The launcher's own environment stops at supervise: only the allowlist and the
    // provider's env reach the command.
    assert!(text.contains("MODE=pod\nLAUNCHED unset\n"), "{text}");
    let missing = {
        let env = Env::raw(&format!(
            "[providers.far]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             launcher = [\"env\"]\nremote_acpd = \"/nonexistent/acpd\"\n"
        ));
        start_failed(&env, 3)
    };
    assert!(
        missing.contains("launcher: env") && missing.contains("category: no-remote-acpd"),
        "{missing}"
    );
}

#[test]
fn a_sigkilled_acpd_leaves_nothing_of_a_launcher_providers_tree() {
    // `env` execs supervise, whose parent is then acpd itself: acpd's death is supervise's
    // SIGTERM (its PDEATHSIG), and the ladder takes the escapee too.
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let env = Env::raw(&format!(
        "[providers.far]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         launcher = [\"env\"]\nremote_acpd = \"{BIN}\"\n\
         eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ));
    let mut tree = start_hanging_run(&env);
    kill(Pid::from_raw(tree.acpd.id() as i32), Signal::SIGKILL).unwrap();
    tree.acpd.wait().unwrap();
    assert!(
        all_gone(&tree.pids),
        "processes outlived the SIGKILLed acpd: {:?}",
        alive(&tree.pids)
    );
}
