//! (8) Isolation: a delegated run's start + wait + dispose with `workspace = "worktree"` and
//! `sandbox = "landlock"` (git worktree add, the Landlock ruleset built, the turn's commit and
//! report, worktree remove) against the same run on a plain provider, on one small repository.

use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

use crate::scale::{Ctl, median};
use crate::{ACPD, Opts};

fn git(dir: &std::path::Path, args: &[&str]) {
    let ok = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=b", "-c", "user.email=b@b"])
        .args(args)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

pub async fn run(opts: &Opts) -> Value {
    let reps = if opts.quick { 5 } else { 25 };
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("file.txt"), "x\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    let config = format!(
        "[providers.plain]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\n\
         [providers.isolated]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\n\
         workspace = \"worktree\"\nsandbox = \"landlock\"\n"
    );
    let ctl = Ctl::spawn_env(&config, &[("XDG_DATA_HOME", &data)]).await;
    let once = async |provider: &str| {
        let started = Instant::now();
        let r = ctl
            .call(
                "_acpd/subagent/start",
                json!({"provider": provider, "cwd": repo,
                       "prompt": [{"type": "text", "text": ":write out.txt done"}]}),
            )
            .await;
        let run = r["runId"].as_str().unwrap().to_string();
        let result = ctl.call("_acpd/subagent/wait", json!({"runId": run})).await;
        assert_eq!(result["stopReason"], "completed", "{result}");
        ctl.call("_acpd/subagent/dispose", json!({"runId": run}))
            .await;
        started.elapsed().as_secs_f64() * 1e3
    };
    let (mut plain, mut isolated) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        plain.push(once("plain").await);
        isolated.push(once("isolated").await);
    }
    let (p, i) = (median(plain), median(isolated));
    println!(
        "\n(8) isolation (median of {reps}): start+wait+dispose plain {p:.1} ms, with workspace = \"worktree\" and sandbox = \"landlock\" {i:.1} ms, ratio {:.2}",
        i / p
    );
    json!({ "plainMs": p, "isolatedMs": i, "ratio": i / p })
}
