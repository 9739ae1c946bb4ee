//! Isolation end to end: a git worktree per run (`workspace = "worktree"`) and the Landlock
//! sandbox (`sandbox = "landlock"`), with the echo agent writing files by plain file I/O in
//! its own process, over `acpd stdio` and real git repositories.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::raw::Raw;
use common::*;
use serde_json::json;

const GONE: Duration = Duration::from_secs(20);

/// [`common::git`]'s stdout, trimmed.
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    common::git(dir, args).trim().to_string()
}

/// A config whose provider `wt` works in worktrees (`extra` adds keys to it), a repository
/// with `notes.txt` committed, and a home and data dir of the test's own.
pub(crate) struct Setup {
    pub(crate) env: Env,
    pub(crate) repo: PathBuf,
    home: PathBuf,
    data: PathBuf,
}

impl Setup {
    pub(crate) fn new(extra: &str) -> Setup {
        Setup::with("", extra)
    }

    /// With top-level keys `top` too.
    fn with(top: &str, extra: &str) -> Setup {
        let env = Env::raw("");
        let toml = format!(
            "default_provider = \"wt\"\n{top}\n[providers.wt]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\n\
             workspace = \"worktree\"\ncancel_grace = \"300ms\"\neof_grace = \"300ms\"\n\
             term_grace = \"300ms\"\n{extra}\n"
        );
        std::fs::write(&env.config, toml).unwrap();
        let repo = env.path().join("repo");
        let home = env.path().join("home");
        let data = env.path().join("data");
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("notes.txt"), "original\n").unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-q", "-m", "first"]);
        Setup {
            env,
            repo,
            home,
            data,
        }
    }

    pub(crate) fn acpd(&self) -> Raw {
        let mut cmd = self.command();
        cmd.arg("stdio");
        let log = self.env.path().join("acpd.log");
        let mut raw = Raw::process(cmd, &log);
        raw.initialize(json!({}));
        raw
    }

    /// acpd with this setup's config, home and data dir; the subcommand is the caller's.
    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--config")
            .arg(&self.env.config)
            .current_dir(self.env.path())
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .env_remove("ACPD_MAX_DEPTH")
            .env("XDG_CONFIG_HOME", "/nonexistent-acpd-test-config")
            .env("HOME", &self.home)
            .env("XDG_DATA_HOME", &self.data)
            .env("ACPD_LOG", "warn")
            .env("STATE_DIRECTORY", self.env.path().join("state"));
        cmd
    }

    /// `acpd run --json ARGS` in the repository, with the same home and data dir.
    pub(crate) fn run(&self, args: &[&str]) -> (serde_json::Value, i32, String) {
        let mut cmd = base();
        cmd.arg("--config")
            .arg(&self.env.config)
            .args(["run", "--json"])
            .args(args)
            .current_dir(&self.repo)
            .env("HOME", &self.home)
            .env("XDG_DATA_HOME", &self.data)
            .env("STATE_DIRECTORY", self.env.path().join("state"));
        run_json(&mut cmd)
    }

    pub(crate) fn worktrees(&self) -> PathBuf {
        self.data.join("acpd/worktrees")
    }
}

pub(crate) fn start(raw: &mut Raw, cwd: &Path, text: &str) -> String {
    raw.ok(
        "_acpd/subagent/start",
        json!({"cwd": cwd, "prompt": [{"type": "text", "text": text}]}),
    )["runId"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn two_runs_at_once_on_one_repository_each_get_their_own_branch() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let a = start(&mut raw, &s.repo, ":write notes.txt from run A");
    let b = start(&mut raw, &s.repo, ":write notes.txt from run B");
    let ra = raw.wait_run(&a);
    let rb = raw.wait_run(&b);
    for (run, r, text) in [(&a, &ra, "from run A"), (&b, &rb, "from run B")] {
        assert_eq!(r["stopReason"], "completed", "{r}");
        assert!(output_text(r).starts_with("wrote notes.txt"), "{r}");
        let w = &r["workspace"];
        assert_eq!(w["branch"], format!("acpd/{run}"), "{r}");
        assert_eq!(w["changed"], json!(["notes.txt"]), "{r}");
        assert!(
            w["diffstat"].as_str().unwrap().contains("1 file changed"),
            "{r}"
        );
        assert_eq!(w["base"], git(&s.repo, &["rev-parse", "HEAD"]));
        let branch = format!("acpd/{run}:notes.txt");
        assert_eq!(git(&s.repo, &["show", &branch]), text);
    }
    assert_ne!(ra["workspace"]["path"], rb["workspace"]["path"]);
    // The parent's checkout is untouched.
    assert_eq!(
        std::fs::read_to_string(s.repo.join("notes.txt")).unwrap(),
        "original\n"
    );
    assert_eq!(git(&s.repo, &["status", "--porcelain"]), "");
}

#[test]
fn dispose_removes_the_worktree_and_keeps_the_branch_unless_asked() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let kept = start(&mut raw, &s.repo, ":write new.txt kept");
    let gone = start(&mut raw, &s.repo, ":write new.txt gone");
    let path = PathBuf::from(raw.wait_run(&kept)["workspace"]["path"].as_str().unwrap());
    raw.wait_run(&gone);
    assert!(path.is_dir());
    raw.ok("_acpd/subagent/dispose", json!({"runId": kept}));
    raw.ok(
        "_acpd/subagent/dispose",
        json!({"runId": gone, "keepBranch": false}),
    );
    assert!(!path.exists(), "the worktree stayed");
    assert_eq!(
        git(&s.repo, &["show", &format!("acpd/{kept}:new.txt")]),
        "kept"
    );
    assert_eq!(
        git(&s.repo, &["branch", "--list", &format!("acpd/{gone}")]),
        ""
    );
    assert_eq!(git(&s.repo, &["worktree", "list"]).lines().count(), 1);
}

#[test]
fn a_cwd_outside_a_repository_is_a_typed_start_error() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let answer = raw.call(
        "_acpd/subagent/start",
        json!({"cwd": s.home, "prompt": [{"type": "text", "text": "hi"}]}),
    );
    let error = &answer["error"];
    assert_eq!(error["data"]["code"], "INVALID_CWD", "{answer}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(s.home.to_str().unwrap()), "{message}");
    assert!(message.contains("not a git repository"), "{message}");
}

#[test]
fn a_worktree_only_where_the_provider_allows_it() {
    let env = Env::new("");
    let mut raw = Raw::stdio(&env);
    raw.initialize(json!({}));
    let answer = raw.call(
        "_acpd/subagent/start",
        json!({"provider": "fast", "cwd": env.path(), "workspace": "worktree",
               "prompt": [{"type": "text", "text": "hi"}]}),
    );
    assert_eq!(
        answer["error"]["data"]["code"], "UNSUPPORTED_CAPABILITY",
        "{answer}"
    );
}

#[test]
fn a_sigkilled_acpd_s_worktree_is_pruned_by_the_next_start() {
    let s = Setup::new("");
    let mut raw = s.acpd();
    let run = start(&mut raw, &s.repo, ":write left.txt behind");
    let r = raw.wait_run(&run);
    let path = PathBuf::from(r["workspace"]["path"].as_str().unwrap());
    assert!(path.is_dir());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(raw.pid() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let pid = raw.pid();
    assert!(eventually(GONE, || !exists(pid as i32) || is_zombie(pid)));
    assert!(path.is_dir(), "nothing removed it yet");
    let _next = s.acpd();
    assert!(
        eventually(GONE, || !path.exists()),
        "the next acpd did not prune {}",
        path.display()
    );
    assert!(eventually(GONE, || !s
        .worktrees()
        .join(format!("{run}.owner"))
        .exists()));
    assert_eq!(
        git(&s.repo, &["show", &format!("acpd/{run}:left.txt")]),
        "behind"
    );
    assert_eq!(git(&s.repo, &["worktree", "list"]).lines().count(), 1);
}

#[test]
fn acpd_run_workspace_worktree_works_on_its_own_branch_from_ref() {
    let s = Setup::new("");
    let first = git(&s.repo, &["rev-parse", "HEAD"]);
    std::fs::write(s.repo.join("notes.txt"), "second\n").unwrap();
    git(&s.repo, &["commit", "-q", "-am", "second"]);
    // From the first commit, named by a tag.
    git(&s.repo, &["tag", "v1", &first]);
    let (r, code, stderr) = s.run(&[
        "--workspace",
        "worktree",
        "--ref",
        "v1",
        ":write notes.txt from acpd run",
    ]);
    assert_eq!(code, 0, "{r}\n{stderr}");
    assert_eq!(r["stopReason"], "completed", "{r}");
    let run = r["runId"].as_str().unwrap();
    let w = &r["workspace"];
    assert_eq!(w["branch"], format!("acpd/{run}"), "{r}");
    assert_eq!(w["base"], first, "{r}");
    assert_eq!(w["changed"], json!(["notes.txt"]), "{r}");
    assert_eq!(
        git(&s.repo, &["show", &format!("acpd/{run}:notes.txt")]),
        "from acpd run"
    );
    // The parent's checkout is untouched, and the run's worktree went with the run.
    assert_eq!(
        std::fs::read_to_string(s.repo.join("notes.txt")).unwrap(),
        "second\n"
    );
    assert_eq!(git(&s.repo, &["status", "--porcelain"]), "");
    assert!(!Path::new(w["path"].as_str().unwrap()).exists(), "{r}");
    assert_eq!(git(&s.repo, &["worktree", "list"]).lines().count(), 1);
}

#[test]
fn acpd_run_workspace_shared_works_in_the_checkout_itself() {
    let s = Setup::new("");
    let (r, code, stderr) = s.run(&["--workspace", "shared", ":write notes.txt in place"]);
    assert_eq!(code, 0, "{r}\n{stderr}");
    assert!(r.get("workspace").is_none(), "{r}");
    assert_eq!(
        std::fs::read_to_string(s.repo.join("notes.txt")).unwrap(),
        "in place\n"
    );
}

#[test]
fn acpd_run_workspace_worktree_where_the_provider_does_not_allow_it_exits_3() {
    let s = Setup::new("");
    // `fast` works in its cwd (workspace = "shared", the default); it leaves a line in
    // `started` whenever its agent is started.
    let started = s.env.path().join("started");
    let script = format!(
        "echo started >> '{}'; exec '{BIN}' agent echo",
        started.display()
    );
    let argv = serde_json::to_string(&["/bin/sh", "-c", &script]).unwrap();
    let toml = std::fs::read_to_string(&s.env.config).unwrap();
    std::fs::write(
        &s.env.config,
        format!("{toml}\n[providers.fast]\ncommand = {argv}\n"),
    )
    .unwrap();
    let (r, code, stderr) = s.run(&["--provider", "fast", "--workspace", "worktree", "hi"]);
    assert_eq!(code, 3, "{r}\n{stderr}");
    assert_eq!(r["error"]["name"], "UNSUPPORTED_CAPABILITY", "{r}");
    assert!(
        stderr.contains("workspace = \"worktree\" under [providers.fast]"),
        "{stderr}"
    );
    assert!(!started.exists(), "the agent was started");
    // `--ref` without a worktree names what it needs.
    let (r, code, stderr) = s.run(&["--provider", "fast", "--ref", "main", "hi"]);
    assert_eq!((code, &r["error"]["name"]), (3, &json!("INVALID_REQUEST")));
    assert!(
        stderr.contains("--ref needs --workspace worktree"),
        "{stderr}"
    );
    assert!(!started.exists(), "the agent was started");
    // The same provider and flags otherwise start it (the check above could not be vacuous).
    let (r, code, _) = s.run(&["--provider", "fast", "--workspace", "shared", "hi"]);
    assert_eq!(code, 0, "{r}");
    assert!(started.exists());
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

#[test]
fn a_sandboxed_run_cannot_write_credentials_or_outside_its_worktree_and_completes() {
    let s = Setup::new("sandbox = \"landlock\"");
    std::fs::create_dir_all(s.home.join(".ssh")).unwrap();
    let keys = s.home.join(".ssh/authorized_keys");
    let outside = s.env.path().join("outside.txt");
    let in_repo = s.repo.join("notes.txt");
    let mut raw = s.acpd();
    let script = format!(
        ":write {} ssh-ed25519 AAAA attacker\n:write {} escaped\n:write {} parent edited\n\
         :write inside.txt fine\n:env TMPDIR",
        keys.display(),
        outside.display(),
        in_repo.display()
    );
    let run = start(&mut raw, &s.repo, &script);
    let r = raw.wait_run(&run);
    assert_eq!(r["stopReason"], "completed", "{r}");
    let text = output_text(&r);
    for path in [&keys, &outside, &in_repo] {
        assert!(
            text.contains(&format!(
                "write error {}: Permission denied",
                path.display()
            )),
            "{text}"
        );
    }
    assert!(text.contains("wrote inside.txt"), "{text}");
    assert!(!keys.exists(), "the sandbox let authorized_keys be written");
    assert!(!outside.exists());
    assert_eq!(std::fs::read_to_string(&in_repo).unwrap(), "original\n");
    assert_eq!(r["workspace"]["changed"], json!(["inside.txt"]), "{r}");
    // A private tmp of its own, which goes with the child.
    let tmp = text
        .lines()
        .find_map(|l| l.strip_prefix("TMPDIR="))
        .map(PathBuf::from)
        .expect("TMPDIR set");
    assert!(
        tmp.starts_with(s.data.join("acpd/tmp")),
        "{}",
        tmp.display()
    );
    raw.ok("_acpd/subagent/dispose", json!({"runId": run}));
    assert!(eventually(GONE, || !tmp.exists()), "the tmp stayed");
}

#[test]
fn providers_report_the_sandbox_the_kernel_enforces() {
    let s = Setup::new("sandbox = \"landlock\"");
    let mut raw = s.acpd();
    let providers = raw.ok("_acpd/providers", json!({}));
    let wt = providers["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "wt")
        .unwrap()
        .clone();
    assert_eq!(wt["workspace"], "worktree", "{wt}");
    assert!(
        wt["sandbox"]
            .as_str()
            .unwrap()
            .starts_with("landlock (ABI "),
        "{wt}"
    );
}

/// `session/new` asking for a worktree (`_meta.acpd.workspace`) in `cwd`; the answer.
fn new_in_worktree(raw: &mut Raw, cwd: &Path, acpd: serde_json::Value) -> serde_json::Value {
    raw.call(
        "session/new",
        json!({"cwd": cwd, "mcpServers": [], "_meta": {"acpd": acpd}}),
    )
}

/// Prompts `sid` with `text`; the agent text streamed before the answer.
fn say(raw: &mut Raw, sid: &str, text: &str) -> String {
    let start = raw.seen.len();
    let answer = raw.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    raw.seen[start..]
        .iter()
        .filter(|l| l.method() == "session/update")
        .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
        .collect()
}

/// A repository with a committed subdirectory `sub`, where the editor's cwd is.
fn with_sub(s: &Setup) -> PathBuf {
    let sub = s.repo.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("keep.txt"), "k\n").unwrap();
    git(&s.repo, &["add", "."]);
    git(&s.repo, &["commit", "-q", "-m", "sub"]);
    sub
}

/// The echo agent keeps its sessions (so they can be closed, loaded and deleted).
fn keeping_sessions(s: &Setup) {
    let sessions = s.env.path().join("echo-sessions");
    std::fs::create_dir_all(&sessions).unwrap();
    let config = std::fs::read_to_string(&s.env.config).unwrap().replace(
        "\"agent\", \"echo\"]",
        &format!(
            "\"agent\", \"echo\", \"--sessions\", \"{}\"]",
            sessions.display()
        ),
    );
    std::fs::write(&s.env.config, config).unwrap();
}

#[test]
fn a_bridge_session_in_a_worktree_writes_there_and_its_close_keeps_the_branch() {
    let s = Setup::new("");
    keeping_sessions(&s);
    let sub = with_sub(&s);
    let head = git(&s.repo, &["rev-parse", "HEAD"]);
    let mut raw = s.acpd();
    let r = new_in_worktree(&mut raw, &sub, json!({"workspace": "worktree"}));
    let sid = r["result"]["sessionId"]
        .as_str()
        .expect("a session")
        .to_string();
    let w = &r["result"]["_meta"]["acpd"]["workspace"];
    assert_eq!(w["branch"], format!("acpd/{sid}"), "{r}");
    assert_eq!(w["base"], head, "{r}");
    let path = PathBuf::from(w["path"].as_str().unwrap());
    assert!(path.starts_with(s.worktrees()), "{r}");
    // The child's cwd is the worktree, at the editor's cwd's place in the repository.
    let text = say(&mut raw, &sid, ":write new.txt from the session\n:cwd");
    assert!(text.contains("wrote new.txt"), "{text}");
    assert!(
        text.contains(&format!("cwd {}", path.join("sub").display())),
        "{text}"
    );
    assert!(path.join("sub/new.txt").is_file());
    assert!(
        !sub.join("new.txt").exists(),
        "the editor's checkout was written"
    );
    assert_eq!(git(&s.repo, &["status", "--porcelain"]), "");
    raw.ok("session/close", json!({"sessionId": sid}));
    assert!(eventually(GONE, || !path.exists()), "the worktree stayed");
    assert_eq!(
        git(&s.repo, &["show", &format!("acpd/{sid}:sub/new.txt")]),
        "from the session"
    );
    assert_eq!(git(&s.repo, &["worktree", "list"]).lines().count(), 1);
    let marker = s.worktrees().join(format!("{sid}.owner"));
    assert!(eventually(GONE, || !marker.exists()), "the marker stayed");
    // Loaded again, the session's worktree is made again on its branch, its work there.
    raw.ok(
        "session/load",
        json!({"sessionId": sid, "cwd": sub, "mcpServers": []}),
    );
    let text = say(&mut raw, &sid, ":cwd");
    assert!(
        text.contains(&format!("cwd {}", path.join("sub").display())),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(path.join("sub/new.txt")).unwrap(),
        "from the session\n"
    );
    // Closed and loaded at once, as an editor does: the load waits for the old worktree to go.
    raw.ok("session/close", json!({"sessionId": sid}));
    raw.ok(
        "session/load",
        json!({"sessionId": sid, "cwd": sub, "mcpServers": []}),
    );
    let text = say(&mut raw, &sid, ":cwd");
    assert!(
        text.contains(&format!("cwd {}", path.join("sub").display())),
        "{text}"
    );
    raw.ok("session/close", json!({"sessionId": sid}));
    assert!(eventually(GONE, || !path.exists()), "the worktree stayed");
}

#[test]
fn a_sigkilled_acpd_s_sandbox_tmp_is_removed_by_the_next_start() {
    let s = Setup::new("sandbox = \"landlock\"");
    let mut raw = s.acpd();
    let sid = raw.new_session(&s.repo, "wt");
    let text = say(&mut raw, &sid, ":env TMPDIR\n:pid");
    let tmp = text
        .lines()
        .find_map(|l| l.strip_prefix("TMPDIR="))
        .map(PathBuf::from)
        .expect("TMPDIR set");
    let child: i32 = text
        .lines()
        .find_map(|l| l.strip_prefix("pid "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {text}"));
    assert!(tmp.is_dir());
    let pid = raw.pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(GONE, || !exists(pid as i32) || is_zombie(pid)));
    assert!(
        eventually(GONE, || !exists(child) || is_zombie(child as u32)),
        "the child lives on"
    );
    assert!(tmp.is_dir(), "nothing removed it yet");
    let _next = s.acpd();
    assert!(
        eventually(GONE, || !tmp.exists()),
        "the next acpd left {}",
        tmp.display()
    );
    let mut marker = tmp.clone().into_os_string();
    marker.push(".owner");
    assert!(eventually(GONE, || !Path::new(&marker).exists()));
}

#[test]
fn a_bridge_worktree_is_refused_before_anything_is_made() {
    let s = Setup::new("\n[providers.plain]\ncommand = [\"/nonexistent/agent\"]\n");
    let mut raw = s.acpd();
    let code = |r: &serde_json::Value| r["error"]["data"]["code"].clone();
    // A provider that does not allow worktrees (its agent is never started).
    let r = new_in_worktree(
        &mut raw,
        &s.repo,
        json!({"provider": "plain", "workspace": "worktree"}),
    );
    assert_eq!(code(&r), "UNSUPPORTED_CAPABILITY", "{r}");
    // A cwd outside any repository.
    let r = new_in_worktree(&mut raw, &s.home, json!({"workspace": "worktree"}));
    assert_eq!(code(&r), "INVALID_CWD", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("not a git repository"), "{message}");
    // A ref without a worktree, a ref git does not know, a workspace that is no kind.
    let r = new_in_worktree(&mut raw, &s.repo, json!({"ref": "main"}));
    assert_eq!(code(&r), "INVALID_REQUEST", "{r}");
    let r = new_in_worktree(
        &mut raw,
        &s.repo,
        json!({"workspace": "worktree", "ref": "no-such-ref"}),
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-such-ref"),
        "{r}"
    );
    let r = new_in_worktree(&mut raw, &s.repo, json!({"workspace": "sideways"}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let left: Vec<_> = std::fs::read_dir(s.worktrees())
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert_eq!(git(&s.repo, &["branch", "--list", "acpd/*"]), "");
    // Without `workspace` the session works in the editor's cwd, as before.
    let r = new_in_worktree(&mut raw, &s.repo, json!({}));
    assert!(r["result"]["_meta"]["acpd"].is_null(), "{r}");
}

fn serve(s: &Setup) -> Served {
    Served::start(s.command(), s.env.path())
}

fn editor(served: &Served) -> Raw {
    let mut raw = Raw::socket(&served.1);
    raw.initialize(json!({}));
    raw
}

#[test]
fn a_detached_worktree_session_is_loaded_in_the_same_worktree_and_deleted_with_it() {
    let s = Setup::with("detach_timeout = \"60s\"", "");
    keeping_sessions(&s);
    let served = serve(&s);
    let mut first = editor(&served);
    let r = new_in_worktree(&mut first, &s.repo, json!({"workspace": "worktree"}));
    let sid = r["result"]["sessionId"]
        .as_str()
        .expect("a session")
        .to_string();
    let workspace = r["result"]["_meta"]["acpd"]["workspace"].clone();
    let path = PathBuf::from(workspace["path"].as_str().unwrap());
    say(&mut first, &sid, ":write one.txt before the detach");
    drop(first);
    // Detached: the worktree stays with its live child, and the next editor finds it.
    let mut second = editor(&served);
    let loaded = second.ok(
        "session/load",
        json!({"sessionId": sid, "cwd": s.repo, "mcpServers": []}),
    );
    assert_eq!(loaded["_meta"]["acpd"]["workspace"], workspace, "{loaded}");
    let text = say(&mut second, &sid, ":write two.txt after it\n:cwd");
    assert!(text.contains(&format!("cwd {}", path.display())), "{text}");
    assert!(path.join("one.txt").is_file() && path.join("two.txt").is_file());
    second.ok("session/delete", json!({"sessionId": sid}));
    assert!(eventually(GONE, || !path.exists()), "the worktree stayed");
    for f in ["one.txt", "two.txt"] {
        git(&s.repo, &["show", &format!("acpd/{sid}:{f}")]);
    }
    assert!(!s.repo.join("one.txt").exists());
}
