//! What a hostile child's text does to the terminal of `acpd run`: its escape sequences (a
//! window title, the clipboard through OSC 52, a cleared screen) reach the terminal escaped,
//! not run; its lines and tabs stay as they are, and a pipe gets its bytes unchanged. The
//! terminal is a real pty, from util-linux `script`.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::*;

const SCRIPT: &str = "/usr/bin/script";

/// A prompt the echo agent says back: an OSC title, OSC 52 (set the clipboard), a cleared
/// screen, a carriage return, a tab and a line break.
const HOSTILE: &str = "a\x1b]0;pwned\x07b\x1b]52;c;cm0gLXJmIH4=\x07c\x1b[2Jd\re\tf\ng";

#[test]
fn a_childs_escape_sequences_reach_the_terminal_of_acpd_run_escaped() {
    if !Path::new(SCRIPT).exists() {
        eprintln!("skipped: needs {SCRIPT} (util-linux) for a pty");
        return;
    }
    let env = Env::new("");
    // `script` runs acpd on a pty and copies what the terminal was sent to its stdout; acpd's
    // stderr (its status line) goes to a file, so only the reply is on the terminal.
    let line = "exec \"$0\" --config \"$1\" run --provider fast \"$2\" 2>\"$3\"";
    let out = Command::new(SCRIPT)
        .args(["-q", "-e", "-c"])
        .arg(format!(
            "sh -c '{line}' '{BIN}' '{}' \"$HOSTILE\" '{}'",
            env.config.display(),
            env.path().join("stderr").display()
        ))
        .arg("/dev/null")
        .envs(base().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env_remove("ACPD_CONFIG")
        .env_remove("ACPD_DEPTH")
        .env_remove("ACPD_MAX_DEPTH")
        .env("HOSTILE", HOSTILE)
        .current_dir(env.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The pty turns each line break into CR LF.
    let seen = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    assert_eq!(
        seen, "a\\u{1b}]0;pwned\\u{7}b\\u{1b}]52;c;cm0gLXJmIH4=\\u{7}c\\u{1b}[2Jd\\re\tf\ng\n",
        "{:?}",
        out.stdout
    );
    // Piped, the same reply is the agent's bytes.
    let piped = env
        .acpd()
        .args(["run", "--provider", "fast", HOSTILE])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&piped.stdout),
        format!("{HOSTILE}\n")
    );
}
