//! What a person sees when something common goes wrong, as snapshots (`insta`): the real
//! binary's exit code and output for a missing program, one that cannot be run, a missing key
//! for each preset's agent, an unknown provider or preset, a bad cwd, no daemon, a config typo,
//! bad TOML, a bad duration, a missing config file. Each must name the cause and the next step;
//! a reviewer reads the `.snap` files under `snapshots/` as the list of messages.
//!
//! Paths, ids and timestamps are replaced by placeholders (insta filters). PATH is fixed, so
//! "PATH searched" reads the same everywhere. A snapshot that is missing or differs fails the
//! test (insta's default in CI); `cargo insta review` accepts a changed one.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use crate::common;
use common::raw::Raw;
use common::*;
use serde_json::json;

/// The agent's PATH in every case: a directory that does not exist, then the system's.
const PATH: &str = "/nonexistent-acpd-bin:/usr/bin:/bin";

/// `acpd` as a person runs it: the default log level (no `ACPD_LOG`), the fixed PATH.
fn person(env: &Env) -> Command {
    let mut cmd = env.acpd();
    cmd.env_remove("ACPD_LOG").env("PATH", PATH);
    cmd
}

/// `$ acpd ARGS`, the exit code, then stdout and stderr (each only when not empty).
fn transcript(mut cmd: Command, args: &[&str]) -> String {
    let out = cmd.args(args).output().unwrap();
    let mut t = format!("$ acpd {}\nexit: {}\n", args.join(" "), code(&out));
    for (name, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        if !bytes.is_empty() {
            t.push_str(&format!("--- {name}\n{}", String::from_utf8_lossy(bytes)));
        }
    }
    t
}

/// Snapshots `text` with the machine's particulars replaced.
fn snap(name: &str, env: &Env, text: &str) {
    let dir = env.path().to_string_lossy().into_owned();
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    settings.set_snapshot_path("snapshots");
    settings.add_filter(&regex_escape(&dir), "[DIR]");
    settings.add_filter(&regex_escape(BIN), "[ACPD]");
    settings.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", "[TIME]");
    settings.add_filter(
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "[UUID]",
    );
    // Another test's acpd, killed, leaves a cgroup the next acpd sweeps and says so.
    settings.add_filter(r"(?m)^.*swept cgroups left by a dead acpd.*\n", "");
    // How acpd contains children depends on the machine (doctor's first line).
    settings.add_filter(r"containment: .*", "containment: [CONTAINMENT]");
    settings.bind(|| insta::assert_snapshot!(name, text));
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// A config with one provider `x` whose command is `command` (TOML array text).
fn provider(command: &str) -> Env {
    Env::raw(&format!(
        "default_provider = \"x\"\n[providers.x]\ncommand = {command}\n\
         eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n"
    ))
}

fn in_env(env: &Env, name: &str, body: &[u8], mode: u32) {
    let f = env.path().join(name);
    std::fs::write(&f, body).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn run_x(env: &Env) -> String {
    transcript(person(env), &["run", "--provider", "x", "hi"])
}

#[test]
fn missing_binary() {
    let env = provider("[\"nosuchagent-acp\"]");
    snap("missing_binary", &env, &run_x(&env));
}

#[test]
fn not_executable() {
    let env = provider("[\"./agent\"]");
    in_env(&env, "agent", b"#!/bin/sh\n", 0o644);
    snap("not_executable", &env, &run_x(&env));
}

#[test]
fn bad_shebang() {
    // The file is there; exec says ENOENT for its interpreter.
    let env = provider("[\"./agent\"]");
    in_env(&env, "agent", b"#!/nonexistent/interp\n", 0o755);
    snap("bad_shebang", &env, &run_x(&env));
}

#[test]
fn crlf_shebang() {
    let env = provider("[\"./agent\"]");
    in_env(&env, "agent", b"#!/bin/sh\r\nexec true\r\n", 0o755);
    snap("crlf_shebang", &env, &run_x(&env));
}

#[test]
fn command_is_a_directory() {
    let env = provider("[\"./agent\"]");
    std::fs::create_dir(env.path().join("agent")).unwrap();
    snap("command_is_a_directory", &env, &run_x(&env));
}

#[test]
fn command_is_a_symlink_loop() {
    let env = provider("[\"./agent\"]");
    std::os::unix::fs::symlink("agent2", env.path().join("agent")).unwrap();
    std::os::unix::fs::symlink("agent", env.path().join("agent2")).unwrap();
    snap("command_is_a_symlink_loop", &env, &run_x(&env));
}

#[test]
fn command_is_an_empty_file() {
    // `execvp` hands a file the kernel cannot run to /bin/sh: it starts, and does nothing.
    let env = provider("[\"./agent\"]");
    in_env(&env, "agent", b"", 0o755);
    snap("command_is_an_empty_file", &env, &run_x(&env));
}

/// A provider of `preset` whose agent is the echo with `flags`: the preset's knowledge of its
/// credentials, a real process that asks for them.
fn preset_env(preset: &str, flags: &[&str]) -> Env {
    let mut argv = vec![BIN, "agent", "echo"];
    argv.extend(flags);
    Env::raw(&format!(
        "[providers.{preset}]\npreset = {preset:?}\ncommand = {}\n\
         eof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        serde_json::to_string(&argv).unwrap()
    ))
}

#[test]
fn missing_key_claude() {
    // claude-agent-acp advertises no auth method and fails the first prompt with −32000.
    let env = preset_env("claude", &[]);
    let t = transcript(
        person(&env),
        &[
            "run",
            "--provider",
            "claude",
            ":error -32000 Authentication required",
        ],
    );
    snap("missing_key_claude", &env, &t);
}

#[test]
fn missing_key_codex() {
    let env = preset_env("codex", &["--auth", "api-key", "--auth", "chat-gpt"]);
    let t = transcript(person(&env), &["run", "--provider", "codex", "hi"]);
    snap("missing_key_codex", &env, &t);
}

#[test]
fn missing_key_gemini() {
    let env = preset_env(
        "gemini",
        &["--auth", "gemini-api-key", "--auth", "oauth-personal"],
    );
    let t = transcript(person(&env), &["run", "--provider", "gemini", "hi"]);
    snap("missing_key_gemini", &env, &t);
}

#[test]
fn missing_key_opencode() {
    let env = preset_env("opencode", &["--auth", "opencode-login"]);
    let t = transcript(person(&env), &["run", "--provider", "opencode", "hi"]);
    snap("missing_key_opencode", &env, &t);
}

#[test]
fn auth_is_one_exit_code_at_any_stage() {
    let at_prompt = preset_env("claude", &[]);
    let out = person(&at_prompt)
        .args([
            "run",
            "--provider",
            "claude",
            ":error -32000 Authentication required",
        ])
        .output()
        .unwrap();
    let at_session_new = preset_env("codex", &["--auth", "api-key"]);
    let started = person(&at_session_new)
        .args(["run", "--provider", "codex", "hi"])
        .output()
        .unwrap();
    let at_initialize = preset_env(
        "codex",
        &["--fail-at", "initialize", "--error-code", "-32000"],
    );
    let init = person(&at_initialize)
        .args(["run", "--provider", "codex", "hi"])
        .output()
        .unwrap();
    assert_eq!(
        [code(&out), code(&started), code(&init)],
        [7, 7, 7],
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&started.stderr),
        String::from_utf8_lossy(&init.stderr)
    );
}

/// What an editor gets for `session/new` through `acpd stdio`, and what acpd logged.
fn editor_view(env: &Env, provider: &str) -> String {
    let mut raw = Raw::stdio(env);
    raw.initialize(json!({}));
    let answer = raw.call(
        "session/new",
        json!({"cwd": env.path(), "mcpServers": [], "_meta": {"acpd": {"provider": provider}}}),
    );
    let error = serde_json::to_string_pretty(&answer["error"]).unwrap();
    drop(raw);
    let log = std::fs::read_to_string(env.path().join("acpd.log")).unwrap_or_default();
    let logged: Vec<&str> = log
        .lines()
        // The session's own start (the default provider's probe may log its own line too).
        .filter(|l| l.contains("acpd::failure") && l.contains("run=bridge-"))
        .collect();
    format!("error:\n{error}\nlog:\n{}\n", logged.join("\n"))
}

#[test]
fn editor_missing_binary() {
    let env = provider("[\"nosuchagent-acp\"]");
    // The agent's PATH is acpd's; Raw::stdio inherits the test's, so the provider fixes it.
    let text = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{text}env = {{ PATH = {PATH:?} }}\n")).unwrap();
    let view = editor_view(&env, "x");
    // The cause in the error's data and message, and in the log at the default level.
    assert_eq!(view.matches("PATH searched").count(), 3, "{view}");
    snap("editor_missing_binary", &env, &view);
}

/// A PATH the provider's `env_file` sets is named by the file, never shown: not on the
/// terminal, not in the editor's error, not in the log.
#[test]
fn a_missing_program_on_an_env_file_s_path_names_the_file_not_the_value() {
    const SECRET: &str = "/opt/secret-path-7f3a/bin";
    let env = provider("[\"nosuchagent-acp\"]");
    let file = env.path().join("agent.env");
    in_env(
        &env,
        "agent.env",
        format!("PATH={SECRET}\n").as_bytes(),
        0o600,
    );
    let text = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(
        &env.config,
        format!("{text}env_file = {:?}\n", file.display().to_string()),
    )
    .unwrap();
    let said = format!(
        "PATH searched: the PATH from env_file {} (value not shown)",
        file.display()
    );
    let ran = run_x(&env);
    assert!(ran.contains(&said), "{ran}");
    assert!(!ran.contains("secret-path-7f3a"), "{ran}");
    let view = editor_view(&env, "x");
    assert!(view.contains(&said), "{view}");
    let log = std::fs::read_to_string(env.path().join("acpd.log")).unwrap();
    assert!(log.contains(&said), "{log}");
    assert!(
        !format!("{view}{log}").contains("secret-path-7f3a"),
        "{view}{log}"
    );
}

#[test]
fn editor_missing_key_codex() {
    let env = preset_env("codex", &["--auth", "api-key"]);
    let view = editor_view(&env, "codex");
    // The agent's own code and data (an editor's login UI reads them), advice in the message.
    assert!(view.contains("\"code\": -32000"), "{view}");
    assert!(view.contains("authMethods"), "{view}");
    snap("editor_missing_key_codex", &env, &view);
}

#[test]
fn an_agent_that_lies_at_initialize_then_works_is_not_held_against_it() {
    // −32000 at the first initialize only (a marker file), then a working agent.
    let env = Env::raw("");
    let script = format!(
        "if [ -e seen ]; then exec {BIN} agent echo; else : > seen; exec {BIN} agent echo \
         --fail-at initialize --error-code -32000; fi"
    );
    let argv = serde_json::to_string(&["/bin/sh", "-c", &script]).unwrap();
    std::fs::write(
        &env.config,
        format!("default_provider = \"x\"\n[providers.x]\ncommand = {argv}\n"),
    )
    .unwrap();
    let first = person(&env).args(["run", "hi"]).output().unwrap();
    assert_eq!(
        code(&first),
        7,
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = person(&env).args(["run", "hi"]).output().unwrap();
    assert_eq!(
        code(&second),
        0,
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&second.stdout), "hi\n");
}

#[test]
fn unknown_provider() {
    let env = preset_env("claude", &[]);
    snap(
        "unknown_provider",
        &env,
        &transcript(person(&env), &["run", "--provider", "cluade", "hi"]),
    );
}

#[test]
fn doctor_of_a_preset_not_configured() {
    // No config at all: the built-in one has only the echo provider.
    let env = Env::raw("");
    let mut cmd = base();
    cmd.env_remove("ACPD_LOG").current_dir(env.path());
    snap(
        "doctor_of_a_preset_not_configured",
        &env,
        &transcript(cmd, &["doctor", "claude"]),
    );
}

#[test]
fn unknown_preset() {
    let env = Env::raw("[providers.x]\npreset = \"cluade\"\n");
    snap(
        "unknown_preset",
        &env,
        &transcript(person(&env), &["providers"]),
    );
}

#[test]
fn install_unknown_preset() {
    let env = Env::raw("");
    snap(
        "install_unknown_preset",
        &env,
        &transcript(person(&env), &["install", "codx"]),
    );
}

#[test]
fn bad_cwd() {
    let env = preset_env("claude", &[]);
    let t = transcript(
        person(&env),
        &[
            "run",
            "--provider",
            "claude",
            "--cwd",
            "/nonexistent-acpd-dir",
            "hi",
        ],
    );
    snap("bad_cwd", &env, &t);
}

#[test]
fn no_daemon() {
    let env = Env::raw("");
    let socket = env.path().join("acpd.sock");
    let t = transcript(
        person(&env),
        &["status", "--socket", &socket.to_string_lossy()],
    );
    snap("no_daemon", &env, &t);
}

#[test]
fn daemon_refused() {
    // A socket file nobody listens on (a daemon that died without removing it).
    let env = Env::raw("");
    let socket = env.path().join("acpd.sock");
    let bound = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    drop(bound);
    let t = transcript(
        person(&env),
        &["status", "--socket", &socket.to_string_lossy()],
    );
    snap("daemon_refused", &env, &t);
}

#[test]
fn config_typo() {
    let env = Env::raw("[providers.x]\npreest = \"claude\"\n");
    snap(
        "config_typo",
        &env,
        &transcript(person(&env), &["providers"]),
    );
}

#[test]
fn config_unknown_key_without_a_near_name() {
    let env = Env::raw("max_depth = 2\nfrobnicate = true\n");
    snap(
        "config_unknown_key_without_a_near_name",
        &env,
        &transcript(person(&env), &["providers"]),
    );
}

#[test]
fn bad_toml() {
    let env = Env::raw("[providers.x\ncommand = [\"a\"]\n");
    snap("bad_toml", &env, &transcript(person(&env), &["providers"]));
}

#[test]
fn bad_duration() {
    let env = Env::raw("[providers.x]\npreset = \"claude\"\nrun_timeout = \"5 parsecs\"\n");
    snap(
        "bad_duration",
        &env,
        &transcript(person(&env), &["providers"]),
    );
}

#[test]
fn config_not_found() {
    let env = Env::raw("");
    let mut cmd = base();
    cmd.env_remove("ACPD_LOG").current_dir(env.path());
    let missing = Path::new(env.path()).join("nope.toml");
    let t = transcript(cmd, &["--config", &missing.to_string_lossy(), "providers"]);
    snap("config_not_found", &env, &t);
}
