//! `acpd token create|list|revoke` as a user runs them: the token once on stdout, only its
//! hash on disk, a table that never shows it, names checked, errors that say what to do, and a
//! running daemon told to read the tokens again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use common::daemon::Daemon;
use common::*;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every byte of the state directory (the DB and its WAL).
fn state_bytes(env: &Env) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(env.path().join("state")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            bytes.extend(std::fs::read(path).unwrap());
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_token_is_shown_once_and_only_its_hash_is_kept() {
    let env = Env::new("");
    let out = env
        .acpd()
        .args(["token", "create", "laptop", "--expires", "30d"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let token = stdout(&out);
    let token = token.strip_suffix('\n').expect("one line");
    assert!(token.starts_with("acpd_") && token.len() == 48, "{token:?}");
    assert!(!token.contains(char::is_whitespace), "{token:?}");
    let said = stderr(&out);
    assert!(
        said.contains("created token laptop (controller, expires ")
            && said.contains("will not be shown again"),
        "{said}"
    );
    assert!(!said.contains(token), "the token went to stderr: {said}");
    let bytes = state_bytes(&env);
    assert!(contains(&bytes, b"laptop"), "the DB was read");
    assert!(!contains(&bytes, token.as_bytes()), "the token is on disk");
    assert!(
        !contains(&bytes, &token.as_bytes()[5..]),
        "its secret is on disk"
    );

    let out = env
        .acpd()
        .args(["token", "create", "ci", "--role", "observer"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let second = stdout(&out);
    assert_ne!(second.trim(), token);

    let out = env.acpd().args(["token", "list"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let table = stdout(&out);
    assert!(
        !table.contains(token) && !table.contains(second.trim()),
        "{table}"
    );
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    let header = lines[0];
    for column in ["NAME", "ROLE", "STATE", "CREATED", "EXPIRES", "LAST USED"] {
        assert!(header.contains(column), "{table}");
    }
    // Aligned: each value starts under its header.
    let at = |line: &str, text: &str| line.find(text).unwrap();
    assert_eq!(at(lines[1], "controller"), at(header, "ROLE"), "{table}");
    assert_eq!(at(lines[2], "observer"), at(header, "ROLE"), "{table}");
    assert_eq!(at(lines[1], "live"), at(header, "STATE"), "{table}");
    assert!(
        lines[1].starts_with("laptop ") && lines[2].starts_with("ci "),
        "{table}"
    );
    assert!(lines[2].contains("never"), "{table}");

    let out = env
        .acpd()
        .args(["token", "list", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tokens"][0]["name"], "laptop");
    assert_eq!(v["tokens"][1]["role"], "observer");
    assert!(!stdout(&out).contains(token));
}

#[test]
fn names_are_checked_and_a_live_one_is_taken() {
    let env = Env::new("");
    let create = |name: &str| {
        env.acpd()
            .args(["token", "create", "--", name])
            .output()
            .unwrap()
    };
    assert_eq!(code(&create("dev-box_1.a")), 0);
    let out = create("dev-box_1.a");
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("a token named dev-box_1.a exists already")
            && stderr(&out).contains("acpd token revoke dev-box_1.a"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let long = "x".repeat(65);
    for bad in ["", "a b", "../x", "-rf", "tab\there", "é", long.as_str()] {
        let out = create(bad);
        assert_eq!(code(&out), 2, "{bad:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("is not a token name") && stderr(&out).contains("letters"),
            "{bad:?}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty());
    }
    for (flag, value, says) in [
        ("--role", "admin", "use controller or observer"),
        ("--expires", "soon", "write e.g. 30d"),
        ("--expires", "0", "above zero"),
        ("--expires", "20y", "at most 3650d"),
    ] {
        let out = env
            .acpd()
            .args(["token", "create", "x", flag, value])
            .output()
            .unwrap();
        assert_eq!(code(&out), 2, "{flag} {value}");
        assert!(
            stderr(&out).contains(says),
            "{flag} {value}: {}",
            stderr(&out)
        );
    }
    let out = env.acpd().args(["token", "list"]).output().unwrap();
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
}

#[test]
fn a_revoked_token_is_listed_revoked_and_its_name_is_free_again() {
    let env = Env::new("");
    let run = |args: &[&str]| env.acpd().arg("token").args(args).output().unwrap();
    assert_eq!(code(&run(&["create", "phone"])), 0);
    let out = run(&["revoke", "phone"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("revoked token phone"),
        "{}",
        stderr(&out)
    );
    let out = run(&["revoke", "phone"]);
    assert_eq!(code(&out), 0);
    assert!(stderr(&out).contains("revoked already"), "{}", stderr(&out));
    let out = run(&["revoke", "tablet"]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("no token named tablet") && stderr(&out).contains("acpd token list"),
        "{}",
        stderr(&out)
    );
    assert_eq!(code(&run(&["create", "phone"])), 0);
    let table = stdout(&run(&["list"]));
    let states: Vec<&str> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(states, ["revoked", "live"], "{table}");
}

#[test]
fn no_tokens_says_how_to_make_one() {
    let env = Env::new("");
    let out = env.acpd().args(["token", "list"]).output().unwrap();
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).contains("acpd token create NAME"),
        "{}",
        stdout(&out)
    );
}

/// A running daemon is asked to read the tokens again after each change; one that does not
/// answer makes the command fail, saying the change is saved but not in force there.
#[test]
fn a_running_daemon_reads_the_tokens_again() {
    let daemon = Daemon::start(Env::new(""));
    let out = daemon.cli(&["token", "create", "laptop"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("accepts it"), "{}", stderr(&out));
    let out = daemon.cli(&["token", "revoke", "laptop"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("refuses it and has closed its connections"),
        "{}",
        stderr(&out)
    );
    assert!(
        eventually(std::time::Duration::from_secs(10), || {
            daemon.log().matches("network tokens read again").count() == 2
        }),
        "{}",
        daemon.log()
    );
    // Stopped: it cannot answer.
    nix::sys::signal::kill(daemon.pid(), nix::sys::signal::Signal::SIGSTOP).unwrap();
    let out = daemon.cli(&["token", "create", "phone", "--timeout", "1s"]);
    nix::sys::signal::kill(daemon.pid(), nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the change is saved, but the daemon did not read it")
            && stderr(&out).contains("kill -CONT"),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).starts_with("acpd_"),
        "the token is still shown once"
    );
}

/// Eight processes creating one name at once: one token, seven errors naming it.
#[test]
fn racing_creates_of_one_name_make_one_token() {
    let env = Env::new("");
    let children: Vec<_> = (0..8)
        .map(|_| {
            env.acpd()
                .args(["token", "create", "same"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let made: Vec<_> = outs.iter().filter(|o| code(o) == 0).collect();
    assert_eq!(made.len(), 1, "{outs:?}");
    for o in outs.iter().filter(|o| code(o) != 0) {
        assert_eq!(code(o), 2, "{}", stderr(o));
        assert!(
            stderr(o).contains("a token named same exists already"),
            "{}",
            stderr(o)
        );
    }
    let out = env.acpd().args(["token", "list"]).output().unwrap();
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
}

/// A token nobody could read (stdout closed) is not left accepted: it is revoked again, exit 74.
#[test]
fn a_token_never_shown_is_revoked() {
    let env = Env::new("");
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = env
        .acpd()
        .args(["token", "create", "lost"])
        .stdout(std::process::Stdio::from(write))
        .output()
        .unwrap();
    assert_eq!(code(&out), 74, "{}", stderr(&out));
    assert!(stderr(&out).contains("revoked again"), "{}", stderr(&out));
    let out = env.acpd().args(["token", "list"]).output().unwrap();
    let row = stdout(&out).lines().nth(1).unwrap().to_owned();
    assert!(row.starts_with("lost ") && row.contains("revoked"), "{row}");
}
