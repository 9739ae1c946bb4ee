//! A sandboxed child's confinement binds every run it starts: delegation from inside a
//! `sandbox = "landlock"` child works through the command acpd offers it, and a run started
//! from its tree (through that offer, or by dialing acpd's socket itself) may write nowhere
//! the child could not and use no network it may not; a run nested under such a run is held
//! to that run's narrower confinement in turn. Skipped, saying so, where the kernel enforces
//! no Landlock network rules (ABI 4).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::raw::Raw;
use common::*;
use serde_json::{Value, json};

const GONE: Duration = Duration::from_secs(20);

fn skip() -> bool {
    let abi = landlock_abi();
    if abi < 4 {
        eprintln!(
            "skipped: this kernel enforces Landlock ABI {abi}; these tests need ABI 4 \
             (network rules)"
        );
        return true;
    }
    false
}

/// A config whose default provider `boxed` is sandboxed without network and offers
/// delegation, beside `free` (unsandboxed), `open` (sandboxed, with network) and `wt`
/// (sandboxed, in worktrees); a home and data dir of the test's own, and `work` where the
/// parent works.
struct Setup {
    env: Env,
    home: PathBuf,
    data: PathBuf,
    work: PathBuf,
}

const GRACES: &str = "cancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n";

impl Setup {
    /// With `extra` providers added.
    fn new(extra: &str) -> Setup {
        let env = Env::raw("");
        let echo = format!("command = [\"{BIN}\", \"agent\", \"echo\"]\n{GRACES}");
        let toml = format!(
            "default_provider = \"boxed\"\nmax_depth = 3\ndetach_timeout = \"0s\"\n\
             [providers.boxed]\n{echo}sandbox = \"landlock\"\nnetwork = false\n\
             offer_delegation = true\n\
             [providers.free]\n{echo}\
             [providers.open]\n{echo}sandbox = \"landlock\"\n\
             [providers.wt]\n{echo}sandbox = \"landlock\"\nnetwork = false\n\
             workspace = \"worktree\"\noffer_delegation = true\n{extra}"
        );
        std::fs::write(&env.config, toml).unwrap();
        let home = env.path().join("home");
        let data = env.path().join("data");
        let work = env.path().join("work");
        for d in [&home, &data, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        Setup {
            env,
            home,
            data,
            work,
        }
    }

    /// acpd with this setup's config, home and data dir; the subcommand is the caller's.
    fn command(&self) -> Command {
        self.command_of(Path::new(BIN))
    }

    /// [`Setup::command`] running the acpd binary at `program`.
    fn command_of(&self, program: &Path) -> Command {
        // `base()`'s environment, for another program.
        let mut cmd = Command::new(program);
        cmd.envs(base().get_envs().filter_map(|(k, v)| Some((k, v?))))
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .env_remove("ACPD_MAX_DEPTH");
        cmd.arg("--config")
            .arg(&self.env.config)
            .current_dir(self.env.path())
            .env("HOME", &self.home)
            .env("XDG_DATA_HOME", &self.data)
            .env("STATE_DIRECTORY", self.env.path().join("state"));
        cmd
    }

    fn stdio(&self) -> Raw {
        let mut cmd = self.command();
        cmd.arg("stdio");
        let mut raw = Raw::process(cmd, &self.env.path().join("acpd.log"));
        raw.initialize(json!({}));
        raw
    }
}

/// A run of `boxed` in `cwd` told `script`; its result.
fn run_boxed(raw: &mut Raw, cwd: &Path, script: &str) -> Value {
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"cwd": cwd, "prompt": [{"type": "text", "text": script}]}),
    )["runId"]
        .as_str()
        .unwrap()
        .to_string();
    raw.wait_run(&run)
}

/// `:delegate-json` with these arguments, as one directive line.
fn delegate(args: Value) -> String {
    format!(":delegate-json {args}")
}

#[test]
fn a_sandboxed_child_delegates_through_the_offered_command_and_not_beyond_its_sandbox() {
    if skip() {
        return;
    }
    let s = Setup::new("");
    let escaped = s.env.path().join("escaped.txt");
    let mut raw = s.stdio();
    let script = [
        ":delegate :write nested.txt from the nested run".to_string(),
        delegate(json!({"provider": "free",
            "prompt": format!(":write {} from an unsandboxed run", escaped.display())})),
        delegate(json!({"provider": "open", "prompt": ":write net.txt with network"})),
        delegate(json!({"cwd": s.home, "prompt": ":write home.txt in the home"})),
    ]
    .join("\n");
    let r = run_boxed(&mut raw, &s.work, &script);
    assert_eq!(r["stopReason"], "completed", "{r}");
    let text = output_text(&r);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    // The sandboxed child started the offered `acpd mcp`, and its run wrote where it may.
    assert_eq!(lines[0], "delegated: wrote nested.txt", "{text}");
    assert_eq!(
        std::fs::read_to_string(s.work.join("nested.txt")).unwrap(),
        "from the nested run\n"
    );
    // Unsandboxed, with network, in a directory it may not write: each refused, naming the
    // child's limit.
    let limit = format!("it may write only beneath {}", s.work.display());
    for (line, why) in lines[1..].iter().zip([
        "runs unsandboxed (sandbox = \"none\")",
        "may use the network (network = true)",
        "lies outside what the child asking may write",
    ]) {
        assert!(line.starts_with("delegate failed: "), "{text}");
        assert!(line.contains("NOT_PERMITTED"), "{line}");
        assert!(line.contains(why), "{why} not in {line}");
        assert!(line.contains(&limit), "{limit} not in {line}");
    }
    assert!(!escaped.exists(), "an unsandboxed run wrote {escaped:?}");
    assert!(!s.home.join("home.txt").exists());
    assert!(!s.work.join("net.txt").exists());
}

#[test]
fn a_nested_runs_own_delegation_is_held_to_its_narrower_confinement() {
    if skip() {
        return;
    }
    let s = Setup::new("");
    let sub = s.work.join("sub");
    std::fs::create_dir_all(sub.join("deeper")).unwrap();
    let mut raw = s.stdio();
    // The nested run works in work/sub; its child may write only there, whatever its
    // provider or the top child may.
    let inner = [
        delegate(json!({"cwd": s.work, "prompt": ":write up.txt above the nested run"})),
        delegate(json!({"cwd": sub.join("deeper"), "prompt": ":write deep.txt below it"})),
    ]
    .join("\n");
    let script = delegate(json!({"cwd": sub, "prompt": inner}));
    let r = run_boxed(&mut raw, &s.work, &script);
    let text = output_text(&r);
    assert!(text.starts_with("delegated: delegate failed: "), "{text}");
    assert!(text.contains("NOT_PERMITTED"), "{text}");
    assert!(
        text.contains(&format!("it may write only beneath {}", sub.display())),
        "{text}"
    );
    assert!(text.contains("delegated: wrote deep.txt"), "{text}");
    assert!(!s.work.join("up.txt").exists());
    assert!(sub.join("deeper/deep.txt").is_file());
}

/// An upgrade replaces acpd's binary while acpd runs: a sandboxed child is offered the file at
/// the path acpd was started from (the new binary), since the old one is out of its reach.
#[test]
fn a_sandboxed_child_still_delegates_after_an_upgrade_replaced_acpds_binary() {
    if skip() {
        return;
    }
    let s = Setup::new("");
    let bin = s.env.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let installed = bin.join("acpd");
    if std::fs::hard_link(BIN, &installed).is_err() {
        std::fs::copy(BIN, &installed).unwrap();
    }
    let mut cmd = s.command_of(&installed);
    cmd.arg("stdio");
    let mut raw = Raw::process(cmd, &s.env.path().join("acpd.log"));
    raw.initialize(json!({}));
    // The upgrade: a new file (a copy: a rename between two links of one file does nothing)
    // renamed over the old one.
    let new = bin.join("acpd.new");
    std::fs::copy(BIN, &new).unwrap();
    std::fs::rename(&new, &installed).unwrap();
    let exe = std::fs::read_link(format!("/proc/{}/exe", raw.pid())).unwrap();
    assert!(exe.to_string_lossy().ends_with(" (deleted)"), "{exe:?}");
    let r = run_boxed(
        &mut raw,
        &s.work,
        ":delegate :write nested.txt after the upgrade",
    );
    assert_eq!(output_text(&r), "delegated: wrote nested.txt\n", "{r}");
}

/// A child in a worktree acpd made may delegate in that worktree, and to a worktree of its own
/// of the same repository: acpd's worktrees of a repository the child may write are within
/// its confinement.
#[test]
fn a_child_in_a_worktree_delegates_there_and_to_a_worktree_of_its_own() {
    if skip() {
        return;
    }
    let s = Setup::new("");
    git(&s.work, &["init", "-q", "-b", "main"]);
    std::fs::write(s.work.join("a.txt"), "a\n").unwrap();
    git(&s.work, &["add", "."]);
    git(&s.work, &["commit", "-q", "-m", "first"]);
    let mut raw = s.stdio();
    let script = [
        ":delegate :write shared.txt in the parent's worktree".to_string(),
        delegate(json!({"provider": "wt", "prompt": ":write own.txt in a worktree of its own"})),
    ]
    .join("\n");
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "wt", "cwd": s.work, "prompt": [{"type": "text", "text": script}]}),
    )["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let r = raw.wait_run(&run);
    let text = output_text(&r);
    assert!(
        text.starts_with("delegated: wrote shared.txt\ndelegated: wrote own.txt"),
        "{text}"
    );
    assert_eq!(r["workspace"]["changed"], json!(["shared.txt"]), "{r}");
    let branches = git(&s.work, &["branch", "--list", "acpd/*"]);
    assert_eq!(branches.lines().count(), 2, "{branches}");
}

fn serve(s: &Setup) -> Served {
    Served::start(s.command(), s.env.path())
}

/// A bridge session's sandboxed child (working in the home, where `.ssh` is denied) that
/// dials the daemon's socket itself, as a hostile agent would, and asks for runs that would
/// write where it may not: every one is refused with NOT_PERMITTED naming its limit, and the
/// ones within it start.
#[test]
fn a_child_dialing_the_socket_itself_gets_no_run_beyond_its_sandbox() {
    if skip() {
        return;
    }
    let s = Setup::new("");
    let socket = s.env.path().join("run/acpd.sock");
    // Where the sandboxed script may write (with `.ssh` denied inside the home, only what is
    // in the home already).
    let out = s.home.join("proj/hostile.json");
    let script = s.env.path().join("hostile.py");
    let outside = s.env.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(s.home.join(".ssh/keys")).unwrap();
    std::fs::create_dir_all(s.home.join("proj/sub")).unwrap();
    std::os::unix::fs::symlink(&outside, s.home.join("link")).unwrap();
    // A repository the child may write (its `.git/config` too), one it may not: worktrees of
    // neither.
    let repo = s.home.join("repo");
    let far_repo = outside.join("repo");
    for r in [&repo, &far_repo] {
        std::fs::create_dir_all(r).unwrap();
        git(r, &["init", "-q", "-b", "main"]);
        std::fs::write(r.join("a.txt"), "a\n").unwrap();
        git(r, &["add", "."]);
        git(r, &["commit", "-q", "-m", "first"]);
    }
    let home = s.home.display().to_string();
    let attempts = json!([
        {"provider": "free", "cwd": format!("{home}/proj")},
        {"provider": "open", "cwd": format!("{home}/proj")},
        {"cwd": outside},
        {"cwd": format!("{home}/link")},
        {"cwd": format!("{home}/proj/../..")},
        {"cwd": "/proc/self/cwd"},
        {"cwd": format!("{home}/.ssh/keys")},
        {"provider": "wt", "cwd": far_repo},
        {"provider": "wt", "cwd": repo},
        // Within its limit: these start.
        {"cwd": format!("{home}/proj/sub")},
        {"provider": "wt", "workspace": "shared", "cwd": repo},
    ]);
    std::fs::write(
        &script,
        format!(
            r#"import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect({socket:?})
f = s.makefile("rwb")
def call(i, method, params):
    f.write((json.dumps({{"jsonrpc": "2.0", "id": i, "method": method, "params": params}}) + "\n").encode())
    f.flush()
    while True:
        msg = json.loads(f.readline())
        if msg.get("id") == i:
            return msg
call(1, "initialize", {{"protocolVersion": 1}})
answers = []
for i, a in enumerate(json.loads({attempts:?})):
    a["prompt"] = [{{"type": "text", "text": ":write planted.txt run %d" % i}}]
    answers.append(call(10 + i, "_acpd/subagent/start", a))
open({out:?} + ".tmp", "w").write(json.dumps(answers))
os.rename({out:?} + ".tmp", {out:?})
f.readline()
"#,
            attempts = attempts.to_string(),
        ),
    )
    .unwrap();
    let toml = std::fs::read_to_string(&s.env.config).unwrap();
    std::fs::write(
        &s.env.config,
        format!(
            "{toml}[providers.h]\n\
             command = [\"sh\", \"-c\", \"python3 {script} 2>{err} & exec {BIN} agent echo\"]\n\
             sandbox = \"landlock\"\nnetwork = false\n{GRACES}",
            script = script.display(),
            err = s.home.join("proj/py.err").display(),
        ),
    )
    .unwrap();
    let served = serve(&s);
    let mut editor = Raw::socket(&served.1);
    editor.initialize(json!({}));
    let _session = editor.new_session(&s.home, "h");
    assert!(
        eventually(GONE, || out.exists()),
        "the hostile script never finished: {}\n{}",
        std::fs::read_to_string(s.home.join("proj/py.err")).unwrap_or_default(),
        std::fs::read_to_string(s.env.path().join("serve.log")).unwrap_or_default()
    );
    let answers: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let limit = format!("it may write only beneath {home}");
    let (refused, started) = answers.split_at(answers.len() - 2);
    for (answer, attempt) in refused.iter().zip(attempts.as_array().unwrap()) {
        let error = &answer["error"];
        assert_eq!(error["code"], -33015, "{attempt}: {answer}");
        assert_eq!(
            error["data"]["code"], "NOT_PERMITTED",
            "{attempt}: {answer}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(&limit), "{attempt}: {message}");
        assert_eq!(error["data"]["confinement"]["network"], false, "{answer}");
    }
    for answer in started {
        assert!(answer["result"]["runId"].is_string(), "{answer}");
    }
    assert!(
        eventually(GONE, || s.home.join("proj/sub/planted.txt").is_file()),
        "the run within the limit did not write"
    );
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("repo")], "{left:?}");
    assert!(!s.home.join(".ssh/keys/planted.txt").exists());
    assert!(!far_repo.join("planted.txt").exists());
    assert_eq!(git(&far_repo, &["branch", "--list", "acpd/*"]), "");
    assert_eq!(git(&repo, &["branch", "--list", "acpd/*"]), "");
}

/// A sandboxed child that runs an acpd of its own (`acpd run`) with an unsandboxed provider:
/// Landlock is inherited across fork and exec, so that acpd's child writes nowhere the
/// sandboxed child could not.
#[test]
fn an_acpd_started_inside_a_sandbox_passes_the_sandbox_on_to_its_children() {
    if skip() {
        return;
    }
    let s = Setup::new("");
    let escaped = s.env.path().join("escaped.txt");
    let inner = s.work.join("inner.toml");
    std::fs::write(
        &inner,
        format!(
            "default_provider = \"free\"\n[providers.free]\n\
             command = [\"{BIN}\", \"agent\", \"echo\"]\n{GRACES}"
        ),
    )
    .unwrap();
    let report = s.work.join("inner.json");
    let toml = std::fs::read_to_string(&s.env.config).unwrap();
    let line = format!(
        "{BIN} --config {} run --json --cwd {} ':write {} escaped' > {} 2>&1; exec {BIN} agent echo",
        inner.display(),
        s.work.display(),
        escaped.display(),
        report.display()
    );
    let argv = serde_json::to_string(&["/bin/sh", "-c", &line]).unwrap();
    std::fs::write(
        &s.env.config,
        format!(
            "{toml}[providers.nest]\ncommand = {argv}\nsandbox = \"landlock\"\n\
             network = false\nenv = {{ XDG_DATA_HOME = \"{}\", STATE_DIRECTORY = \"{}\" }}\n{GRACES}",
            s.work.join("data").display(),
            s.work.join("state").display()
        ),
    )
    .unwrap();
    let mut raw = s.stdio();
    let sid = raw.new_session(&s.work, "nest");
    assert!(sid.starts_with("echo-") || !sid.is_empty());
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(
        text.contains(&format!(
            "write error {}: Permission denied",
            escaped.display()
        )),
        "{text}"
    );
    assert!(!escaped.exists());
}

/// A sandboxed child makes a repository of its own, whose config names a filter every file
/// goes through, and asks for a worktree of it: acpd's git would check the files out through
/// that filter, a program the child chose, run by acpd outside any sandbox. Refused before
/// git runs in it, as is a worktree of the repository the child works in (it may write that
/// repository's `.git/config` too).
#[test]
fn a_child_gets_no_worktree_of_a_repository_whose_config_it_may_write() {
    if skip() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    let pwned = outside.path().join("pwned");
    let escaped = pwned.display();
    // Runs in the child's sandbox: it may write `work`, so it may make a repository there.
    let plant = format!(
        "git init -q evil && git -C evil config filter.x.smudge \"sh -c 'echo ran > {escaped}; cat'\" \
         && printf '* filter=x\\n' > evil/.gitattributes && echo hi > evil/f.txt \
         && git -C evil add . && git -C evil -c user.name=c -c user.email=c@c commit -qm planted \
         && git init -q -b main . && echo a > a.txt && git add a.txt \
         && git -c user.name=c -c user.email=c@c commit -qm own"
    );
    let argv = serde_json::to_string(&[
        "/bin/sh",
        "-c",
        &format!("{{ {plant}; }} > plant.log 2>&1; exec '{BIN}' agent echo"),
    ])
    .unwrap();
    let s = Setup::new(&format!(
        "[providers.planter]\ncommand = {argv}\nsandbox = \"landlock\"\nnetwork = false\n\
         offer_delegation = true\n{GRACES}"
    ));
    let mut raw = s.stdio();
    let script = [
        delegate(json!({"provider": "wt", "cwd": s.work.join("evil"), "prompt": "hi"})),
        delegate(json!({"provider": "wt", "cwd": s.work, "prompt": "hi"})),
    ]
    .join("\n");
    let run = raw.ok(
        "_acpd/subagent/start",
        json!({"provider": "planter", "cwd": s.work,
               "prompt": [{"type": "text", "text": script}]}),
    )["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let r = raw.wait_run(&run);
    let text = output_text(&r);
    let log = std::fs::read_to_string(s.work.join("plant.log")).unwrap_or_default();
    assert!(
        s.work.join("evil/f.txt").is_file(),
        "the plant failed: {log}"
    );
    assert!(
        !pwned.exists(),
        "acpd ran the child's filter outside its sandbox: {text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for (line, dir) in lines
        .iter()
        .zip([s.work.join("evil/.git"), s.work.join(".git")])
    {
        assert!(line.starts_with("delegate failed: "), "{text}");
        assert!(line.contains("NOT_PERMITTED"), "{line}");
        assert!(
            line.contains(&dir.display().to_string()),
            "{dir:?} not in {line}"
        );
    }
    assert_eq!(git(&s.work, &["branch", "--list", "acpd/*"]), "");
}
