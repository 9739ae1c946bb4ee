//! A worktree run whose work git will not commit: the result says so (`workspace.failure`,
//! naming git's message and the worktree), and dispose keeps the worktree unless forced.

use std::path::PathBuf;

use serde_json::json;

use crate::isolation::{Setup, git, start as start_in};

/// A `.git` file the child writes makes its directory a repository of its own to git: `git
/// add --all` records a gitlink, not the files. Before, the turn reported `sub` changed and
/// dispose deleted the files.
#[test]
fn work_git_passes_over_is_a_workspace_failure_and_dispose_keeps_the_worktree() {
    let s = Setup::new("");
    std::fs::create_dir_all(s.repo.join("sub")).unwrap();
    let mut raw = s.acpd();
    // A `.git` file naming a repository with commits: git records `sub` as a gitlink.
    let script = format!(
        ":write .git gitdir: {}\n:write work.txt precious",
        s.repo.join(".git").display()
    );
    let run = start_in(&mut raw, &s.repo.join("sub"), &script);
    let r = raw.wait_run(&run);
    assert_eq!(r["stopReason"], "completed", "{r}");
    let w = &r["workspace"];
    let path = PathBuf::from(w["path"].as_str().unwrap());
    let failure = &w["failure"];
    assert_eq!(failure["kind"], "not-added", "{r}");
    assert_eq!(failure["path"], w["path"], "{r}");
    let message = failure["message"].as_str().unwrap();
    assert!(message.contains("sub/"), "{message}");
    let disposed = raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
    assert_eq!(disposed["kept"]["path"], w["path"], "{disposed}");
    assert_eq!(disposed["kept"]["kind"], "not-added", "{disposed}");
    assert_eq!(
        std::fs::read_to_string(path.join("sub/work.txt")).unwrap(),
        "precious\n"
    );
    // No marker: no later acpd's sweep takes the worktree either.
    assert!(!s.worktrees().join(format!("{run}.owner")).exists());
}

/// An empty repository beside the work makes `git add` fail: the dispose that finds it keeps
/// the worktree and names git's message; `force` removes it all the same.
#[test]
fn an_empty_nested_repository_keeps_the_worktree_unless_dispose_is_forced() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let mut paths = Vec::new();
    for text in [":write a.txt kept", ":write a.txt forced"] {
        let run = start_in(&mut raw, &s.repo, text);
        let r = raw.wait_run(&run);
        assert!(r["workspace"].get("failure").is_none(), "{r}");
        let path = PathBuf::from(r["workspace"]["path"].as_str().unwrap());
        // A hostile child's leftovers, planted between its turn and the dispose.
        git(&path, &["init", "-q", "nested"]);
        std::fs::write(path.join("late.txt"), "late\n").unwrap();
        paths.push((run, path));
    }
    let (kept_run, kept_path) = &paths[0];
    let disposed = raw.ok("_acpd/subagent/dispose", json!({"runId": kept_run}));
    let kept = &disposed["kept"];
    assert_eq!(kept["kind"], "stage", "{disposed}");
    assert_eq!(kept["path"], json!(kept_path), "{disposed}");
    let message = kept["message"].as_str().unwrap();
    assert!(message.contains("nested/"), "{message}");
    assert!(
        message.contains("does not have a commit checked out"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_to_string(kept_path.join("late.txt")).unwrap(),
        "late\n"
    );
    assert_eq!(
        git(&s.repo, &["show", &format!("acpd/{kept_run}:a.txt")]),
        "kept"
    );

    let (forced_run, forced_path) = &paths[1];
    let disposed = raw.ok(
        "_acpd/subagent/dispose",
        json!({"runId": forced_run, "force": true}),
    );
    assert!(disposed.get("kept").is_none(), "{disposed}");
    assert!(!forced_path.exists(), "a forced dispose left the worktree");
}

/// `acpd run` says where the work stayed and exits 8, not 0.
#[test]
fn acpd_run_with_uncommitted_work_exits_8_and_names_the_worktree() {
    let s = Setup::new("");
    std::fs::create_dir_all(s.repo.join("sub")).unwrap();
    let script = format!(
        ":write .git gitdir: {}\n:write work.txt precious",
        s.repo.join(".git").display()
    );
    let (r, code, stderr) = s.run(&["--workspace", "worktree", "--cwd", "sub", &script]);
    assert_eq!(code, 8, "{r} {stderr}");
    assert_eq!(r["stopReason"], "completed", "{r}");
    let path = r["workspace"]["path"].as_str().unwrap();
    assert!(stderr.contains(path), "{stderr}");
    assert!(stderr.contains("stays"), "{stderr}");
    assert!(PathBuf::from(path).join("sub/work.txt").is_file());
}

/// A child's `.gitignore` that hides its own work: nothing is committed, and the result
/// names what was left out instead of reporting an empty turn in silence.
#[test]
fn files_a_child_s_gitignore_hides_are_listed_in_the_result() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let run = start_in(
        &mut raw,
        &s.repo,
        ":write .gitignore *\n:write hidden.txt secret",
    );
    let r = raw.wait_run(&run);
    let w = &r["workspace"];
    assert_eq!(w["changed"], json!([]), "{r}");
    assert_eq!(w["ignored"], json!([".gitignore", "hidden.txt"]), "{r}");
    assert!(w.get("failure").is_none(), "{r}");
}

/// What a turn had written when acpd was SIGKILLed is committed on the branch by the next
/// acpd's sweep, not removed with the worktree.
#[test]
fn a_sigkilled_acpd_s_unfinished_turn_is_committed_by_the_sweep() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let run = start_in(&mut raw, &s.repo, ":write half.txt done so far\n:hang");
    let path = s.worktrees().join(&run);
    let gone = std::time::Duration::from_secs(20);
    assert!(crate::common::eventually(gone, || path
        .join("half.txt")
        .is_file()));
    let pid = raw.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _next = s.acpd();
    assert!(
        crate::common::eventually(gone, || !path.exists()),
        "the next acpd did not sweep {}",
        path.display()
    );
    assert_eq!(
        git(&s.repo, &["show", &format!("acpd/{run}:half.txt")]),
        "done so far"
    );
}
