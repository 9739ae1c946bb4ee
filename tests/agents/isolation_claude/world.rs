//! The world one isolation scenario runs in: a private HOME, repository and config, the mock
//! model, `acpd run`, `acpd mcp` with this test as its MCP client, `acpd serve`, and a search
//! for the processes a scenario left.

use crate::common::raw::Raw;
use crate::common::{BIN, eventually, run_json};
use crate::presets::Mock;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const KEY: &str = "sk-ant-mock-isolation";
/// How long one tool call through `acpd mcp` (Claude Code's whole turn) may take.
const TURN: Duration = Duration::from_secs(150);
/// How long a finished scenario's processes may take to go.
const GONE: Duration = Duration::from_secs(30);

/// One scenario at a time (Claude Code is heavy); a failed one does not stop the others.
pub(super) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) use crate::common::git;

/// A private world for one scenario: a HOME with Claude Code's config dir and an
/// `~/.ssh/authorized_keys`, a git repository with `notes.txt` committed, the mock model, and a
/// config of claude providers (each `(name, extra keys)`) plus `extra` TOML.
pub(super) struct World {
    dir: tempfile::TempDir,
    data: &'static Path,
    mock: Mock,
    mock_log: tempfile::NamedTempFile,
}

impl World {
    pub(super) fn new(data: &'static Path, providers: &[(&str, &str)], extra: &str) -> World {
        let mock_log = tempfile::NamedTempFile::new().unwrap();
        let mock = Mock::start(mock_log.path());
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path();
        for d in [
            "home/.ssh",
            "repo",
            "state",
            "xdg/config",
            "xdg/cache",
            "run",
        ] {
            std::fs::create_dir_all(w.join(d)).unwrap();
        }
        // Claude Code's config dir inside the one directory of HOME the claude preset may write.
        let claude_dir = w.join("home/.claude");
        std::fs::create_dir_all(&claude_dir).unwrap();
        // Manual permission mode: acpd's provider answers (`permission = "allow"`).
        std::fs::write(
            claude_dir.join("settings.json"),
            r#"{"permissions":{"defaultMode":"default"}}"#,
        )
        .unwrap();
        std::fs::write(
            w.join("home/.ssh/authorized_keys"),
            "ssh-ed25519 ORIGINAL\n",
        )
        .unwrap();
        let repo = w.join("repo");
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("notes.txt"), "original\n").unwrap();
        git(&repo, &["add", "."]);
        git(&repo, &["commit", "-q", "-m", "first"]);
        let mut toml = format!("default_provider = \"{}\"\n{extra}\n", providers[0].0);
        for (name, keys) in providers {
            toml.push_str(&format!(
                "[providers.{name}]\npreset = \"claude\"\npermission = \"allow\"\n\
                 eof_grace = \"5s\"\nterm_grace = \"2s\"\n{keys}\n[providers.{name}.env]\n\
                 CLAUDE_CONFIG_DIR = {:?}\nDISABLE_AUTOUPDATER = \"1\"\n\
                 DISABLE_TELEMETRY = \"1\"\nDISABLE_ERROR_REPORTING = \"1\"\n",
                claude_dir.to_string_lossy()
            ));
        }
        std::fs::write(w.join("config.toml"), toml).unwrap();
        World {
            dir,
            data,
            mock,
            mock_log,
        }
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(super) fn home(&self) -> PathBuf {
        self.path().join("home")
    }

    pub(super) fn repo(&self) -> PathBuf {
        self.path().join("repo")
    }

    pub(super) fn keys(&self) -> String {
        std::fs::read_to_string(self.home().join(".ssh/authorized_keys")).unwrap()
    }

    pub(super) fn notes(&self) -> String {
        std::fs::read_to_string(self.repo().join("notes.txt")).unwrap()
    }

    /// What the mock model was asked, for failure messages.
    pub(super) fn asked(&self) -> String {
        std::fs::read_to_string(self.mock_log.path()).unwrap_or_default()
    }

    /// `acpd --config <ours>` in this world's environment and nothing else of the test's.
    pub(super) fn acpd(&self) -> Command {
        let w = self.path();
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("XDG_DATA_HOME", self.data.join("data"))
            .env("XDG_CONFIG_HOME", w.join("xdg/config"))
            .env("XDG_CACHE_HOME", w.join("xdg/cache"))
            .env("XDG_RUNTIME_DIR", w.join("run"))
            .env("STATE_DIRECTORY", w.join("state"))
            .env("ACPD_LOG", "warn")
            .env("ANTHROPIC_API_KEY", KEY)
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{}", self.mock.port),
            )
            .arg("--config")
            .arg(w.join("config.toml"))
            .current_dir(w);
        cmd
    }

    /// `acpd run --json --provider <provider> --cwd <repo> <prompt>`: result, exit code, stderr.
    pub(super) fn run(&self, provider: &str, prompt: &str) -> (Value, i32, String) {
        let mut cmd = self.acpd();
        cmd.args(["run", "--json", "--timeout", "120s", "--provider", provider])
            .arg("--cwd")
            .arg(self.repo())
            .arg(prompt);
        run_json(&mut cmd)
    }

    /// The processes of this world still alive (those whose HOME is its home), but `except`.
    pub(super) fn left(&self, except: &[i32]) -> Vec<String> {
        let want = format!("HOME={}", self.home().display()).into_bytes();
        let mut out = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            if except.contains(&pid) {
                continue;
            }
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            if environ.split(|b| *b == 0).any(|v| v == want.as_slice()) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                out.push(format!("{pid} {cmdline}"));
            }
        }
        out
    }

    /// Nothing of this world is left but `except` (and the sentinels of acpds still running).
    #[track_caller]
    pub(super) fn assert_nothing_left(&self, except: &[i32]) {
        let others = |l: &String| !l.contains(" sentinel") || except.is_empty();
        let gone = eventually(GONE, || {
            self.left(except).iter().filter(|l| others(l)).count() == 0
        });
        assert!(
            gone,
            "processes outlived the scenario: {:?}",
            self.left(except)
        );
    }
}

/// `acpd mcp <args>` in `world`, initialized, with this test as its MCP client.
pub(super) struct Mcp {
    pub(super) raw: Raw,
    /// Answers read while waiting for another, by id.
    answers: HashMap<u64, Value>,
}

impl Mcp {
    pub(super) fn start(world: &World, args: &[&str]) -> Mcp {
        let mut cmd = world.acpd();
        cmd.arg("mcp").args(args).env("ACPD_LOG", "info");
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = world.path().join(format!("mcp-{n}.log"));
        let mut mcp = Mcp {
            raw: Raw::process(cmd, &log),
            answers: HashMap::new(),
        };
        let id = mcp.raw.send(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "isolation_claude", "version": "0"}}),
        );
        let init = mcp.answer(id);
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        mcp.raw
            .line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        mcp
    }

    pub(super) fn pid(&self) -> i32 {
        self.raw.pid() as i32
    }

    /// Sends `tools/call` of `tool`; returns the request id.
    pub(super) fn send(&mut self, tool: &str, arguments: Value) -> u64 {
        self.raw
            .send("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// The whole answer to request `id` (within [`TURN`]).
    pub(super) fn answer(&mut self, id: u64) -> Value {
        let deadline = Instant::now() + TURN;
        loop {
            if let Some(answer) = self.answers.remove(&id) {
                return answer;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.raw.next_within(left) else {
                panic!(
                    "no answer to {id} (eof: {}); acpd mcp said: {}",
                    self.raw.eof,
                    self.raw.log()
                );
            };
            if line.is_response()
                && let Some(got) = line.value["id"].as_u64()
            {
                self.answers.insert(got, line.value);
            }
        }
    }

    /// A tool call's result (`content`, `structuredContent`, `isError`).
    pub(super) fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let id = self.send(tool, arguments);
        self.result(id)
    }

    pub(super) fn result(&mut self, id: u64) -> Value {
        let answer = self.answer(id);
        assert!(
            answer.get("error").is_none(),
            "{answer}\n{}",
            self.raw.log()
        );
        answer["result"].clone()
    }

    /// The client leaves; `acpd mcp` disposes what it holds and exits 0.
    pub(super) fn close(mut self) {
        self.raw.close_write();
        let process = self.raw.process.as_mut().unwrap();
        let exited = eventually(GONE, || process.try_wait().is_ok_and(|s| s.is_some()));
        assert!(exited, "acpd mcp did not exit after its client left");
        let status = process.wait().unwrap();
        assert!(
            status.success(),
            "acpd mcp exited {status}: {}",
            self.raw.log()
        );
    }
}

/// The run's result from a `delegate` tool result (its `structuredContent`).
pub(super) fn delegated(result: &Value) -> &Value {
    &result["structuredContent"]
}

/// A finished delegation's text, as the model would read it.
pub(super) fn tool_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|b| b["text"].as_str()).collect())
        .unwrap_or_default()
}

/// `acpd serve` in `world` on `<world>/run/acpd.sock`; SIGTERMed and awaited on drop.
pub(super) struct Serve {
    child: Child,
    pub(super) socket: PathBuf,
    log: PathBuf,
}

impl Serve {
    pub(super) fn start(world: &World) -> Serve {
        let socket = world.path().join("run/acpd.sock");
        let log = world.path().join("daemon.log");
        let child = world
            .acpd()
            .args(["serve", "--socket"])
            .arg(&socket)
            .env("ACPD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let serve = Serve { child, socket, log };
        assert!(
            eventually(Duration::from_secs(10), || serve.socket.exists()),
            "acpd serve did not listen: {}",
            serve.log()
        );
        serve
    }

    pub(super) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if !eventually(GONE, || self.child.try_wait().is_ok_and(|s| s.is_some())) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
