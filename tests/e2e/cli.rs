//! What the command line shows: the status line and the permission prompt of `acpd run` on a
//! real pseudo-terminal, nothing extra in pipes, tables with headers and aligned columns,
//! colour only where allowed, one duration syntax on every flag, an idempotent install,
//! parallel doctor checks, and examples in every `--help`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use portable_pty::{CommandBuilder, PtySize, native_pty_system};

/// How long a step on the terminal may take before the test fails (never a timing assertion:
/// each wait ends as soon as its text appears).
const STEP: Duration = Duration::from_secs(30);

/// `acpd ARGS` on a pseudo-terminal (stdin, stdout and stderr, and the controlling terminal):
/// what it writes is collected; keys are typed with [`Tty::type_line`].
struct Tty {
    seen: Arc<Mutex<Vec<u8>>>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    _master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Tty {
    fn spawn(env: &Env, args: &[&str]) -> Tty {
        let pair = native_pty_system()
            .openpty(PtySize {
                rows: 40,
                cols: 120,
                pixel_width: 0,
                pixel_height: 0,
            })
            .unwrap();
        let mut cmd = CommandBuilder::new(BIN);
        cmd.arg("--config");
        cmd.arg(&env.config);
        cmd.args(args);
        cmd.cwd(env.path());
        for var in ["ACPD_CONFIG", "ACPD_DEPTH", "ACPD_MAX_DEPTH", "NO_COLOR"] {
            cmd.env_remove(var);
        }
        cmd.env("STATE_DIRECTORY", env.path().join("state"));
        cmd.env("ACPD_LOG", "warn");
        cmd.env("TERM", "xterm");
        let child = pair.slave.spawn_command(cmd).unwrap();
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().unwrap();
        let writer = pair.master.take_writer().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Tty {
            seen,
            writer,
            child,
            _master: pair.master,
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }

    /// Waits until the terminal shows `what`; the whole screen so far on failure.
    fn wait_for(&self, what: &str) {
        let ok = eventually(STEP, || self.text().contains(what));
        assert!(
            ok,
            "the terminal never showed {what:?}; it shows:\n{:?}",
            self.text()
        );
    }

    fn type_line(&mut self, line: &str) {
        self.writer
            .write_all(format!("{line}\r").as_bytes())
            .unwrap();
        self.writer.flush().unwrap();
    }

    /// The exit code, once the process has ended (within [`STEP`]).
    fn exit_code(&mut self) -> u32 {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.exit_code();
            }
            assert!(
                Instant::now() < deadline,
                "acpd did not exit: {:?}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn run_on_a_terminal_shows_a_status_line_then_the_reply() {
    let env = Env::new("");
    let mut tty = Tty::spawn(
        &env,
        &["run", "--provider", "fast", ":sleep 2000\nthe reply"],
    );
    tty.wait_for("starting fast");
    tty.wait_for("fast initialized · waiting for its reply");
    tty.wait_for("the reply");
    assert_eq!(tty.exit_code(), 0, "{:?}", tty.text());
    let screen = tty.text();
    // The status line is erased in place before the reply is written over it.
    let reply_at = screen.find("the reply").unwrap();
    assert!(
        screen[..reply_at].ends_with("\r\x1b[2K"),
        "the status line was not cleared before the reply: {screen:?}"
    );
    assert!(!screen[reply_at..].contains("waiting"), "{screen:?}");
}

/// What acpd says on stderr while the status line is up (here: Ctrl-C) is written on a
/// cleared line, never appended to the status line.
#[test]
fn a_message_under_the_status_line_clears_it_first() {
    let env = Env::new("");
    let mut tty = Tty::spawn(&env, &["run", "--provider", "fast", ":sleep 20000"]);
    tty.wait_for("waiting for its reply");
    tty.writer.write_all(b"\x03").unwrap();
    tty.writer.flush().unwrap();
    tty.wait_for("acpd: interrupted");
    assert_eq!(tty.exit_code(), 130, "{:?}", tty.text());
    let screen = tty.text();
    let said = screen.find("acpd: interrupted").unwrap();
    assert!(
        screen[..said].ends_with("\r\x1b[2K"),
        "the message was written into the status line: {screen:?}"
    );
}

#[test]
fn quiet_and_json_runs_on_a_terminal_show_no_status_line() {
    let env = Env::new("");
    for flag in ["--quiet", "--json"] {
        let mut tty = Tty::spawn(&env, &["run", flag, "--provider", "fast", "hello"]);
        tty.wait_for("hello");
        assert_eq!(tty.exit_code(), 0);
        let screen = tty.text();
        assert!(!screen.contains("starting"), "{flag}: {screen:?}");
        assert!(!screen.contains('\x1b'), "{flag}: {screen:?}");
    }
}

#[test]
fn without_a_terminal_run_writes_nothing_but_the_reply() {
    let env = Env::new("");
    let out = env
        .acpd()
        .args(["run", "--provider", "fast", "hello"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn a_typo_at_the_permission_prompt_asks_again() {
    let env = Env::new("");
    let mut tty = Tty::spawn(&env, &["run", "--provider", "fast", ":permission"]);
    tty.wait_for("choose 1-2 (Enter rejects)");
    tty.type_line("yes");
    tty.wait_for("\"yes\" is not one of 1-2");
    tty.type_line("1");
    tty.wait_for("permission: selected allow");
    assert_eq!(tty.exit_code(), 0, "{:?}", tty.text());
}

#[test]
fn an_empty_answer_at_the_prompt_rejects() {
    let env = Env::new("");
    let mut tty = Tty::spawn(&env, &["run", "--provider", "fast", ":permission"]);
    tty.wait_for("choose 1-2");
    tty.type_line("");
    tty.wait_for("permission: selected reject");
    assert_eq!(tty.exit_code(), 0, "{:?}", tty.text());
}

/// With no terminal to ask, a permission request the policy rejected is named in the result
/// of a run that still completed.
#[test]
fn a_rejection_nobody_saw_is_named_in_a_completed_runs_diagnostic() {
    let env = Env::raw(&format!(
        "[providers.reject]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\npermission = \"reject\"\n\
         [providers.forward]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n"
    ));
    for (provider, why) in [
        ("reject", "request rejected by policy (permission = reject)"),
        ("forward", "forwarded request rejected (nobody to ask)"),
    ] {
        let (v, code, _) =
            run_json(
                env.acpd()
                    .args(["run", "--json", "--provider", provider, ":permission"]),
            );
        assert_eq!(
            (code, v["stopReason"].as_str()),
            (0, Some("completed")),
            "{v}"
        );
        let d = v["diagnostic"].as_str().unwrap_or_default();
        assert!(d.contains(why), "{provider}: {v}");
        // And in the text form, on stderr.
        let out = env
            .acpd()
            .args(["run", "--provider", provider, ":permission"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(why), "{provider}: {stderr}");
    }
}

/// Every duration flag takes a bare number of seconds and humantime alike; a bad one is a
/// usage error that says how to write one.
#[test]
fn every_duration_flag_takes_bare_seconds_and_humantime() {
    let env = Env::new("");
    let missing = env.path().join("no-daemon.sock");
    let missing = missing.to_str().unwrap();
    for d in ["5", "5s", "1m30s"] {
        let out = env
            .acpd()
            .args(["run", "--provider", "fast", "--timeout", d, "hi"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "run --timeout {d}: {out:?}");
        for cmd in ["status", "runs", "reload"] {
            let out = env
                .acpd()
                .args([cmd, "--socket", missing, "--timeout", d])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            // Parsed: the command got as far as finding no daemon.
            assert_eq!(code(&out), 1, "{cmd} --timeout {d}: {stderr}");
            assert!(
                stderr.contains("no acpd daemon"),
                "{cmd} --timeout {d}: {stderr}"
            );
        }
        let out = base()
            .args([
                "supervise",
                "--eof-grace",
                d,
                "--term-grace",
                d,
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "supervise graces {d}: {out:?}");
    }
    for cmd in [&["run", "hi"][..], &["status"], &["reload"]] {
        let out = env
            .acpd()
            .args(cmd)
            .args(["--timeout", "5 parsecs"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 2, "{stderr}");
        assert!(
            stderr.contains("\"5 parsecs\" is not a duration")
                && stderr.contains("write e.g. 5 (seconds), 5s, 1m30s or 500ms"),
            "{cmd:?}: {stderr}"
        );
    }
}

/// The start of each column of `header`, by the first letter of each header word.
fn column_starts(header: &str, names: &[&str]) -> Vec<usize> {
    names
        .iter()
        .map(|n| {
            header
                .find(n)
                .unwrap_or_else(|| panic!("no {n} in {header:?}"))
        })
        .collect()
}

/// Asserts that in every row, each cell in `cells` begins exactly at its column's start.
fn assert_aligned(text: &str, names: &[&str], rows: &[&[&str]]) {
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .find(|l| l.starts_with(names[0]))
        .unwrap_or_else(|| panic!("no header line in {text}"));
    let starts = column_starts(header, names);
    for row in rows {
        let line = lines
            .iter()
            .find(|l| l.starts_with(row[0]))
            .unwrap_or_else(|| panic!("no row {:?} in\n{text}", row[0]));
        for (cell, at) in row.iter().zip(&starts) {
            assert_eq!(
                line.get(*at..).map(|rest| rest.starts_with(cell)),
                Some(true),
                "{cell:?} is not under its header in\n{text}"
            );
        }
    }
}

#[test]
fn providers_presets_and_registry_list_are_aligned_tables() {
    let long = "a description far longer than any terminal column should be allowed to take, \
                going on and on";
    let env = Env::raw(&format!(
        "[providers.a]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\ndescription = \"{long}\"\n\
         [providers.a-much-longer-provider-name]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
         description = \"short\"\n"
    ));
    let out = env.acpd().arg("providers").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{text}");
    let names = ["NAME", "DEFAULT", "CAPABILITIES", "DESCRIPTION"];
    assert_aligned(
        &text,
        &names,
        &[
            &["a-much-longer-provider-name", "", "outputSchema", "short"],
            &["echo", "yes", "outputSchema", "Built-in"],
        ],
    );
    // The long description wraps inside its column instead of running on.
    let widest = text.lines().map(str::len).max().unwrap();
    assert!(widest < long.len() + 40, "{text}");
    assert!(!text.contains('\t'), "{text}");

    let out = env
        .acpd()
        .args(["providers", "--presets"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{text}");
    assert_aligned(
        &text,
        &["PRESET", "DESCRIPTION", "PACKAGE", "STATE"],
        &[&[
            "claude",
            "Claude",
            "@agentclientprotocol/claude-agent-acp@",
            "not installed",
        ]],
    );

    let doc = env.path().join("registry.json");
    std::fs::write(
        &doc,
        serde_json::json!({"version": "1.0.0", "agents": [
            {"id": "tiny", "name": "Tiny", "version": "1.2.3", "description": "small\u{1b}[2J",
             "distribution": {"npx": {"package": "tiny@1.2.3"}}},
            {"id": "a-rather-long-agent-id", "name": "Long", "version": "10.0.0",
             "description": "d", "distribution": {"npx": {"package": "long@10.0.0"}}}
        ]})
        .to_string(),
    )
    .unwrap();
    let env = Env::raw(&format!("registry_url = \"file://{}\"\n", doc.display()));
    let out = env.acpd().args(["registry", "list"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        0,
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_aligned(
        &text,
        &["ID", "VERSION", "RUNS AS", "NAME", "DESCRIPTION"],
        &[
            &["tiny", "1.2.3", "", "Tiny", r"small\u{1b}[2J"],
            &["a-rather-long-agent-id", "10.0.0", "", "Long", "d"],
        ],
    );
}

#[test]
fn colour_only_where_allowed() {
    let env = Env::new("");
    let header = |extra: &[(&str, &str)]| {
        let mut cmd = env.acpd();
        cmd.arg("providers").env_remove("NO_COLOR");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap()
            .to_owned()
    };
    // A pipe: none.
    assert!(!header(&[]).contains('\x1b'));
    // Forced: the header is bold.
    assert!(header(&[("CLICOLOR_FORCE", "1")]).contains("\x1b[1m"));
    // NO_COLOR wins over everything.
    assert!(!header(&[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]).contains('\x1b'));
}

/// A second `acpd install` of an installed version says so and runs nothing: with npm out of
/// reach (an empty PATH), it still succeeds.
#[test]
fn install_of_an_installed_version_says_already_installed() {
    let env = Env::new("");
    let presets = env
        .acpd()
        .args(["providers", "--presets", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&presets.stdout).unwrap();
    let claude = v["presets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "claude")
        .unwrap();
    let version = claude["source"]["version"].as_str().unwrap();
    let bin = claude["source"]["bin"].as_str().unwrap();
    let data = env.path().join("data");
    let bin_dir = data.join(format!("acpd/agents/claude-{version}/node_modules/.bin"));
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::write(bin_dir.join(bin), "#!/bin/sh\n").unwrap();
    let empty = env.path().join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let install = |extra: &[&str]| {
        env.acpd()
            .arg("install")
            .arg("claude")
            .args(extra)
            .env("XDG_DATA_HOME", &data)
            .env("PATH", &empty)
            .output()
            .unwrap()
    };
    let out = install(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        0,
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("already installed @agentclientprotocol/claude-agent-acp@"),
        "{stdout}"
    );
    assert!(bin_dir.join(bin).exists());
    // --force installs again: here that means running npm, which is not on PATH.
    let out = install(&["--force"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 1, "{stderr}");
    assert!(stderr.contains("cannot run npm"), "{stderr}");
}

/// Two providers whose agents each start only once the other has started: checked one after
/// the other, the first would wait for the second forever (and fail at its deadline);
/// checked at once, both are OK.
#[test]
fn doctor_checks_providers_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let provider = |me: &str, other: &str| {
        let wait = "import os,sys,time\nopen(sys.argv[1],'w').close()\nend=time.time()+20\n\
                    while not os.path.exists(sys.argv[2]) and time.time()<end: time.sleep(0.02)\n\
                    os.execv(sys.argv[3], sys.argv[3:])";
        let me_path = dir.path().join(me);
        let other_path = dir.path().join(other);
        format!(
            "[providers.{me}]\ncommand = [\"python3\", \"-c\", {wait:?}, {:?}, {:?}, \"{BIN}\", \
             \"agent\", \"echo\"]\nhandshake_timeout = \"10s\"\n",
            me_path.to_str().unwrap(),
            other_path.to_str().unwrap()
        )
    };
    let env = Env::raw(&format!(
        "{}{}",
        provider("left", "right"),
        provider("right", "left")
    ));
    let out = env.acpd().arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        code(&out),
        0,
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("left: OK") && text.contains("right: OK"),
        "{text}"
    );
    // Not a terminal: no status line.
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn every_help_has_examples_and_only_the_options_that_apply() {
    let commands: &[&[&str]] = &[
        &[],
        &["run"],
        &["stdio"],
        &["serve"],
        &["connect"],
        &["mcp"],
        &["status"],
        &["runs"],
        &["reload"],
        &["doctor"],
        &["providers"],
        &["install"],
        &["registry"],
        &["registry", "list"],
        &["supervise"],
        &["agent"],
        &["agent", "echo"],
        &["trace"],
        &["trace", "show"],
        &["token"],
        &["token", "create"],
        &["token", "list"],
        &["token", "revoke"],
    ];
    for cmd in commands {
        let out = base().args(*cmd).arg("-h").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(code(&out), 0, "{cmd:?}: {help}");
        assert!(help.contains("Examples:\n  acpd"), "{cmd:?}: {help}");
        let reads_config = matches!(
            cmd.first().copied(),
            Some("run" | "stdio" | "serve" | "connect" | "mcp" | "doctor" | "providers")
        ) || *cmd == ["registry", "list"];
        let top = cmd.is_empty();
        assert_eq!(
            help.contains("--config"),
            reads_config || top,
            "{cmd:?}: {help}"
        );
        let starts_agents = matches!(
            cmd.first().copied(),
            Some("run" | "stdio" | "serve" | "connect" | "mcp")
        );
        assert_eq!(
            help.contains("--trace <DIR>"),
            starts_agents || top,
            "{cmd:?}: {help}"
        );
    }
}

/// `--config` works after the command that reads it, as well as before any command.
#[test]
fn config_after_the_command() {
    let env = Env::new("");
    let out = base()
        .args(["run", "--provider", "fast", "--config"])
        .arg(&env.config)
        .arg("hi")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    let _: &Path = env.path();
}
