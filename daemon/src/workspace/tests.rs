#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::*;

/// git through acpd's helper runner: other tests of this binary start the stray reaper, which
/// would reap a plain `Command`'s child before it is waited for.
async fn sh_git(dir: &Path, args: &[&str]) -> String {
    let mut argv: Vec<OsString> = ["git", "-C"].map(OsString::from).to_vec();
    argv.push(dir.into());
    argv.extend(["-c", "user.name=t", "-c", "user.email=t@t"].map(OsString::from));
    argv.extend(args.iter().map(OsString::from));
    let env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k == "PATH" || k == "HOME")
        .collect();
    let out = crate::supervise::run_helper(&argv, dir, env, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn repo(dir: &Path) {
    sh_git(dir, &["init", "-q", "-b", "main"]).await;
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/a.txt"), "one\n").unwrap();
    sh_git(dir, &["add", "."]).await;
    sh_git(dir, &["commit", "-q", "-m", "first"]).await;
}

#[tokio::test]
async fn a_worktree_commits_and_reports_the_child_s_work_and_goes_on_remove() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    std::fs::create_dir(&repo_dir).unwrap();
    repo(&repo_dir).await;
    let trees = tmp.path().join("trees");
    let wt = Worktree::create_in(&trees, &repo_dir.join("sub"), "run-1", None)
        .await
        .unwrap();
    assert_eq!(wt.branch, "acpd/run-1");
    assert_eq!(wt.cwd, trees.join("run-1/sub"));
    std::fs::write(wt.cwd.join("a.txt"), "two\n").unwrap();
    std::fs::write(wt.cwd.join("new.txt"), "new\n").unwrap();
    let report = wt.settle(1).await;
    assert_eq!(report.failure, None);
    assert_eq!(report.changed, ["sub/a.txt", "sub/new.txt"]);
    assert!(
        report.diffstat.contains("2 files changed"),
        "{}",
        report.diffstat
    );
    // The parent's checkout is untouched.
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("sub/a.txt")).unwrap(),
        "one\n"
    );
    assert!(trees.join("run-1.owner").exists());
    wt.remove(true).await;
    assert!(!trees.join("run-1").exists());
    assert!(!trees.join("run-1.owner").exists());
    assert_eq!(
        sh_git(&repo_dir, &["show", "acpd/run-1:sub/a.txt"]).await,
        "two"
    );
}

#[tokio::test]
async fn a_cwd_outside_a_repository_is_a_typed_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Worktree::create_in(&tmp.path().join("trees"), tmp.path(), "run-2", None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, WorkspaceError::NotARepository { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(&tmp.path().display().to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("not a git repository"), "{err}");
}

#[tokio::test]
async fn a_ref_that_looks_like_an_option_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    repo(tmp.path()).await;
    let err = Worktree::create_in(&tmp.path().join("t"), tmp.path(), "r", Some("--output=x"))
        .await
        .unwrap_err();
    assert!(matches!(err, WorkspaceError::BadRef(_)), "{err}");
    let err = Worktree::create_in(&tmp.path().join("t"), tmp.path(), "../x", None)
        .await
        .unwrap_err();
    assert!(matches!(err, WorkspaceError::BadRef(_)), "{err}");
}

#[tokio::test]
async fn the_sweep_removes_a_dead_owner_s_worktree_and_keeps_a_live_one() {
    let tmp = tempfile::tempdir().unwrap();
    repo(tmp.path()).await;
    let trees = tmp.path().join("trees");
    let live = Worktree::create_in(&trees, tmp.path(), "live", None)
        .await
        .unwrap();
    let dead = Worktree::create_in(&trees, tmp.path(), "dead", None)
        .await
        .unwrap();
    // A marker whose owner's start time is not this process's: a dead acpd.
    let text = std::fs::read_to_string(trees.join("dead.owner")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["start"] = serde_json::json!(1);
    std::fs::write(trees.join("dead.owner"), v.to_string()).unwrap();
    assert_eq!(
        sweep(Some(&trees), Some(&tmp.path().join("no-tmps"))).await,
        1
    );
    assert!(!dead.path.exists());
    assert!(live.path.exists());
    sh_git(tmp.path(), &["rev-parse", "--verify", "acpd/dead"]).await;
    live.remove(false).await;
    assert!(
        sh_git(tmp.path(), &["branch", "--list", "acpd/live"])
            .await
            .is_empty()
    );
}

/// A child's tmp whose acpd is gone goes at the next start: the pid and start time of a live
/// process under another boot id (a reboot reused them) is no owner, nor is a zombie's; a
/// live owner's tmp and a symlink planted as a marker stay.
#[tokio::test]
async fn the_sweep_removes_a_dead_owner_s_tmp_by_pid_start_and_boot() {
    let tmp = tempfile::tempdir().unwrap();
    let tmps = tmp.path().join("tmp");
    std::fs::create_dir(&tmps).unwrap();
    let trees = tmp.path().join("no-trees");
    for id in ["live", "rebooted", "old"] {
        mark_tmp(&tmps, id).unwrap();
        std::fs::create_dir(tmps.join(id)).unwrap();
        std::fs::write(tmps.join(id).join("f"), "x").unwrap();
    }
    let marker = |id: &str| tmps.join(format!("{id}.owner"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(marker("rebooted")).unwrap()).unwrap();
    assert!(v["boot"].is_string(), "{v}");
    v["boot"] = serde_json::json!("another-boot");
    std::fs::write(marker("rebooted"), v.to_string()).unwrap();
    // A marker from before the boot id was kept, naming a start time this pid never had.
    let old = serde_json::json!({"pid": std::process::id(), "start": 1});
    std::fs::write(marker("old"), old.to_string()).unwrap();
    // A symlink posing as a marker, and one posing as a tmp: neither is followed.
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), "x").unwrap();
    std::os::unix::fs::symlink(&victim, tmps.join("evil")).unwrap();
    std::fs::write(tmp.path().join("m"), old.to_string()).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("m"), marker("evil")).unwrap();
    assert_eq!(sweep(Some(&trees), Some(&tmps)).await, 2);
    assert!(tmps.join("live").is_dir() && marker("live").exists());
    for id in ["rebooted", "old"] {
        assert!(!tmps.join(id).exists(), "{id} stayed");
        assert!(!marker(id).exists(), "{id}'s marker stayed");
    }
    assert!(victim.join("keep").exists());
}

/// A worktree made again for the same id checks out the branch its earlier one left, with
/// that one's work on it.
#[tokio::test]
async fn a_worktree_made_again_resumes_its_own_branch() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    std::fs::create_dir(&repo_dir).unwrap();
    repo(&repo_dir).await;
    let trees = tmp.path().join("trees");
    assert!(!has_own_branch(&repo_dir, "s-1").await);
    let first = Worktree::create_in(&trees, &repo_dir, "s-1", None)
        .await
        .unwrap();
    std::fs::write(first.path.join("work.txt"), "done\n").unwrap();
    first.commit_all("acpd: session s-1").await.unwrap();
    first.remove(true).await;
    assert!(has_own_branch(&repo_dir, "s-1").await);
    assert!(!has_own_branch(tmp.path(), "s-1").await, "not a repository");
    let again = Worktree::create_at(&trees, &repo_dir.join("sub"), "s-1", Base::OwnBranch)
        .await
        .unwrap();
    assert_eq!(again.cwd, trees.join("s-1/sub"));
    assert_eq!(
        std::fs::read_to_string(again.path.join("work.txt")).unwrap(),
        "done\n"
    );
    again.remove(false).await;
    assert!(!has_own_branch(&repo_dir, "s-1").await);
}

/// A locked index (a git killed mid-write, another git at work in the worktree): the turn
/// says its work is not committed and where it is; once the lock is gone, dispose commits it
/// and removes the worktree.
#[tokio::test]
async fn a_locked_index_is_a_stage_failure_and_the_work_waits_for_dispose() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    std::fs::create_dir(&repo_dir).unwrap();
    repo(&repo_dir).await;
    let trees = tmp.path().join("trees");
    let wt = Worktree::create_in(&trees, &repo_dir, "run-lock", None)
        .await
        .unwrap();
    std::fs::write(wt.path.join("work.txt"), "work\n").unwrap();
    let lock = wt.git_dir.join("index.lock");
    std::fs::write(&lock, "").unwrap();
    let report = wt.settle(1).await;
    let failure = report.failure.expect("a failure");
    assert_eq!(failure.kind, WorkspaceFailureKind::Stage);
    assert_eq!(failure.path, wt.path);
    assert!(
        failure.message.contains("index.lock"),
        "{}",
        failure.message
    );
    let kept = wt.dispose("at dispose", true, false).await;
    assert!(
        matches!(kept, Err(WorkspaceError::Uncommitted { .. })),
        "{kept:?}"
    );
    assert!(wt.path.join("work.txt").is_file());
    std::fs::remove_file(&lock).unwrap();
    wt.dispose("at dispose", true, false).await.unwrap();
    assert!(!wt.path.exists());
    assert_eq!(
        sh_git(&repo_dir, &["show", "acpd/run-lock:work.txt"]).await,
        "work"
    );
}

/// A path git refuses to track (a `.gitmodules` that is a symlink) fails the whole `git add`:
/// the turn says so, naming git's words, rather than reporting nothing changed.
#[tokio::test]
async fn a_path_git_refuses_is_a_stage_failure_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    std::fs::create_dir(&repo_dir).unwrap();
    repo(&repo_dir).await;
    let trees = tmp.path().join("trees");
    let wt = Worktree::create_in(&trees, &repo_dir, "run-refused", None)
        .await
        .unwrap();
    std::fs::write(wt.path.join("work.txt"), "work\n").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", wt.path.join(".gitmodules")).unwrap();
    let failure = wt.settle(1).await.failure.expect("a failure");
    assert_eq!(failure.kind, WorkspaceFailureKind::Stage);
    assert!(
        failure.message.contains("invalid path '.gitmodules'"),
        "{}",
        failure.message
    );
    wt.dispose("at dispose", true, true).await.unwrap();
    assert!(!wt.path.exists(), "force removes it all the same");
}
