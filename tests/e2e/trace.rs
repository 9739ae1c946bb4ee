//! Traffic traces (`trace_dir`): a run and a bridge session each write one private NDJSON file
//! holding both hops and the child's stderr, and `acpd trace show` prints it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::raw::*;
use common::*;
use serde_json::{Value, json};

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn traces(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn a_run_and_a_bridge_session_trace_both_hops_and_stderr() {
    let traces_dir = tempfile::tempdir().unwrap();
    let dir = traces_dir.path().join("t");
    let env = Env::raw(&format!(
        "trace_dir = \"{}\"\n[providers.fast]\ncommand = [\"{BIN}\", \"agent\", \"echo\", \"--stderr\", \"hello from stderr\"]\n\
         eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        dir.display()
    ));
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let run = raw.start_run("fast", "traced run");
    let result = raw.wait_run(&run);
    assert_eq!(result["stopReason"], "completed", "{result}");
    let sid = raw.new_session(env.path(), "fast");
    let id = raw.send_prompt(&sid, "traced session");
    raw.answer(&json!(id));
    raw.close_write();
    assert!(raw.drain_to_eof(std::time::Duration::from_secs(20)));

    let files = traces(&dir);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let run_file = files
        .iter()
        .find(|f| f.file_name().unwrap().to_string_lossy().starts_with(&run))
        .unwrap_or_else(|| panic!("no trace for {run}: {files:?}"));
    let mode = std::fs::metadata(run_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let recs = records(run_file);
    let dirs: Vec<&str> = recs.iter().map(|r| r["dir"].as_str().unwrap()).collect();
    for hop in [
        "parent->acpd",
        "acpd->child",
        "child->acpd",
        "acpd->parent",
        "stderr",
    ] {
        assert!(dirs.contains(&hop), "{hop} missing in {dirs:?}");
    }
    assert!(recs.iter().all(|r| r["id"] == run.as_str()));
    let prompt = recs
        .iter()
        .find(|r| r["msg"]["method"] == "session/prompt")
        .expect("the prompt sent to the child");
    assert_eq!(prompt["msg"]["params"]["prompt"][0]["text"], "traced run");
    assert!(
        recs.iter()
            .any(|r| r["dir"] == "stderr" && r["msg"] == "hello from stderr")
    );

    let bridge = files
        .iter()
        .find(|f| {
            f.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("bridge-")
        })
        .unwrap_or_else(|| panic!("no bridge trace: {files:?}"));
    let recs = records(bridge);
    // The parent's prompt under acpd's id, the child's under its own; the answer to the parent.
    let from_parent = recs
        .iter()
        .find(|r| r["dir"] == "parent->acpd" && r["msg"]["method"] == "session/prompt")
        .expect("the parent's prompt");
    assert_eq!(from_parent["msg"]["params"]["sessionId"], sid.as_str());
    let to_child = recs
        .iter()
        .find(|r| r["dir"] == "acpd->child" && r["msg"]["method"] == "session/prompt")
        .expect("the child's prompt");
    assert_ne!(to_child["msg"]["params"]["sessionId"], sid.as_str());
    assert!(recs.iter().any(|r| r["dir"] == "acpd->parent"
        && r["msg"]["params"]["update"]["content"]["text"] == "traced session"));
    assert!(
        recs.iter()
            .any(|r| r["dir"] == "acpd->parent" && r["msg"]["result"]["stopReason"] == "end_turn")
    );

    let out = base().args(["trace", "show"]).arg(bridge).output().unwrap();
    assert_eq!(code(&out), 0);
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(
        shown
            .lines()
            .any(|l| l.contains("parent->acpd") && l.contains("session/prompt #")),
        "{shown}"
    );
    assert!(
        shown.contains("stderr") && shown.contains("hello from stderr"),
        "{shown}"
    );
    let out = base()
        .args(["trace", "show", "/nonexistent/x.ndjson"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
}

#[test]
fn no_trace_dir_no_files() {
    let env = Env::new("");
    let out = env
        .acpd()
        .args(["run", "--provider", "fast", "quiet"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0);
    assert!(!env.path().join("t").exists());
    let entries: Vec<_> = std::fs::read_dir(env.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        entries
            .iter()
            .all(|n| !n.to_string_lossy().ends_with(".ndjson")),
        "{entries:?}"
    );
}

#[test]
fn a_trace_dir_others_can_write_is_refused_and_the_run_goes_on() {
    let env = Env::new("");
    let dir = env.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (v, code, stderr) = run_json(env.acpd().arg("--trace").arg(&dir).args([
        "run",
        "--json",
        "--provider",
        "fast",
        "untraced",
    ]));
    assert_eq!(
        (code, output_text(&v).as_str()),
        (0, "untraced"),
        "{stderr}"
    );
    assert!(
        stderr.contains("tracing is off: the trace directory is refused")
            && stderr.contains("group- or world-writable (mode 0777)"),
        "{stderr}"
    );
    assert_eq!(traces(&dir), Vec::<PathBuf>::new());
}

#[test]
fn trace_show_escapes_what_peers_wrote_and_reads_bytes_that_are_not_utf8() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("run.ndjson");
    let mut bytes = br#"{"ts":"2026-12-01T10:00:00Z","dir":"stderr","id":"r","msg":"\u001b]0;title\u0007\r\u001b[2Jhidden"}"#.to_vec();
    bytes.extend_from_slice(b"\n\xc3\x28 half a character \x1b[5m\n");
    std::fs::write(&file, &bytes).unwrap();
    let out = base().args(["trace", "show"]).arg(&file).output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        !out.stdout
            .iter()
            .any(|&b| b < 0x20 && b != b'\n' || b == 0x7f),
        "a control byte reached the terminal: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains(r"\u{1b}]0;title\u{7}\r\u{1b}[2Jhidden"),
        "{text}"
    );
    assert!(
        text.contains("\u{fffd}( half a character \\u{1b}[5m"),
        "{text}"
    );
}
