//! Real ACP clients nobody here wrote, against `acpd serve --listen https://127.0.0.1:0` with a
//! self-signed certificate this test makes and a token from `acpd token create` (issue 31, "Must
//! show"):
//!
//! - the TypeScript SDK 2.4.0's `experimental/http-client` (POST + SSE) and
//!   `experimental/ws-client` (WebSocket, on the pinned `ws` package), in
//!   tests/interop/remote-client.mjs;
//! - the Rust SDK's `agent-client-protocol-http` client (`HttpClient`, https:// and wss://), in
//!   tests/sdk-http-client, which this test builds with the cargo running it;
//! - PyPI's `acpremote mirror` (tests/interop/acpremote-requirements.txt, installed into
//!   target/acpremote/venv), which turns acpd's WebSocket back into a local stdio agent, driven
//!   over its stdio by remote-client.mjs.
//!
//! Each runs initialize → session/new → a streamed prompt holding a permission round-trip → a
//! prompt cancelled once its first chunk came; then, on a new connection after the first one's
//! session ended (`detach_timeout = "0s"`), initialize → session/load (the history replayed) →
//! one more prompt. Its summary must equal, session id aside, what the same TypeScript client
//! gets from the same daemon over the Unix socket (`acpd connect --socket`), and that one must
//! be what the echo agent says.
//!
//! A peer that cannot run here is skipped, saying why, only when its runtime is missing (node,
//! python3 with venv and pip); a runtime present whose packages or crate cannot be installed
//! or built fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::daemon::Daemon;
use crate::common::remote::{Cert, host_port};
use crate::common::*;
use crate::node::{self, interop_dir};

/// How long one client run may take on a loaded 2-core machine (node starts in seconds there).
const RUN: Duration = Duration::from_secs(120);

/// How long a test waits for the daemon to reach a state it expects.
const SETTLE: Duration = Duration::from_secs(20);

/// The build directory of this test binary's `acpd` (`target/debug`).
fn profile_dir() -> PathBuf {
    PathBuf::from(BIN).parent().unwrap().to_path_buf()
}

/// `true` when node and the pinned SDK and `ws` are ready; `false` (with the reason printed)
/// when node is missing.
fn node_ready() -> bool {
    if !node::present() {
        eprintln!(
            "SKIPPED: node is not installed, so the TypeScript SDK's remote clients cannot run"
        );
        return false;
    }
    node::install().unwrap_or_else(|why| panic!("{why}"));
    for package in ["@agentclientprotocol/sdk", "ws"] {
        let dir = interop_dir().join("node_modules").join(package);
        assert!(dir.exists(), "{} is missing after npm ci", dir.display());
    }
    true
}

/// The Rust SDK client, built once per test binary by the cargo that runs it (the build
/// directory's lock is free while tests run), in this binary's profile.
fn rust_client() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let profile = profile_dir();
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "-p", "acpd-sdk-http-client"])
                .arg("--manifest-path")
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"));
            match profile.file_name().and_then(|n| n.to_str()) {
                Some("debug") | None => {}
                Some(other) => {
                    cmd.args(["--profile", other]);
                }
            }
            let out = cmd
                .output()
                .map_err(|e| format!("cargo could not run: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cargo build -p acpd-sdk-http-client failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(profile.join("acpd-sdk-http-client"))
        })
        .clone()
        .unwrap_or_else(|why| panic!("{why}"))
}

/// `acpremote` from a venv under target/, installed from the pinned requirements once and again
/// when they change; `None` (with the reason printed) when python3, its venv or pip is missing.
fn acpremote() -> Option<PathBuf> {
    static READY: OnceLock<Option<PathBuf>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let missing = |what: &str| {
                eprintln!("SKIPPED: {what}, so `acpremote mirror` cannot be installed");
                None
            };
            let python = Command::new("python3")
                .args(["-c", "import venv, ensurepip"])
                .output();
            match python {
                Err(_) => return missing("python3 is not installed"),
                Ok(o) if !o.status.success() => {
                    return missing(
                        "python3 has no venv or ensurepip module (Debian: python3-venv)",
                    );
                }
                Ok(_) => {}
            }
            let venv = profile_dir().parent().unwrap().join("acpremote/venv");
            let pins = interop_dir().join("acpremote-requirements.txt");
            let wanted = std::fs::read(&pins).unwrap();
            let stamp = venv.join("installed-requirements.txt");
            let bin = venv.join("bin/acpremote");
            if bin.exists() && std::fs::read(&stamp).ok().as_ref() == Some(&wanted) {
                return Some(bin);
            }
            let run = |cmd: &mut Command, what: &str| {
                let out = cmd
                    .output()
                    .unwrap_or_else(|e| panic!("{what} could not run: {e}"));
                assert!(
                    out.status.success(),
                    "{what} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            run(
                Command::new("python3")
                    .args(["-m", "venv", "--clear"])
                    .arg(&venv),
                "python3 -m venv",
            );
            run(
                Command::new(venv.join("bin/pip"))
                    .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
                    .arg(&pins),
                "pip install -r tests/interop/acpremote-requirements.txt",
            );
            std::fs::write(&stamp, &wanted).unwrap();
            Some(bin)
        })
        .clone()
}

/// A daemon serving its Unix socket and `https://127.0.0.1:<port>` (certificate and key
/// made here), whose default provider is the echo agent keeping its sessions on disk.
struct Face {
    daemon: Daemon,
    /// `127.0.0.1:<port>` of the network listener.
    addr: String,
    /// The self-signed certificate, the only root a client trusts.
    ca: PathBuf,
    token: String,
}

impl Face {
    fn start() -> Face {
        let env = Env::raw("");
        let dir = env.path().to_path_buf();
        let sessions = dir.join("echo-sessions");
        std::fs::create_dir_all(&sessions).unwrap();
        let cert = Cert::new(&dir);
        let (ca, key) = (cert.cert, cert.key);
        let toml = format!(
            "default_provider = \"p\"\ndetach_timeout = \"0s\"\ntls_cert = {ca:?}\ntls_key = {key:?}\n\
             [providers.p]\ncommand = [{BIN:?}, \"agent\", \"echo\", \"--sessions\", {sessions:?}]\n\
             cwd = {dir:?}\ncancel_grace = \"300ms\"\neof_grace = \"300ms\"\nterm_grace = \"300ms\"\n",
        );
        std::fs::write(&env.config, toml).unwrap();
        let daemon = Daemon::start_with(env, |cmd| {
            cmd.args(["--listen", "https://127.0.0.1:0"]);
        });
        let addr = listening(&daemon);
        // With `--socket`, so that this daemon reads its tokens again at once.
        let out = daemon.cli(&["token", "create", "peers"]);
        assert!(
            out.status.success(),
            "acpd token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let token = stdout
            .split_whitespace()
            .find(|w| w.starts_with("acpd_"))
            .unwrap_or_else(|| panic!("acpd token create printed no token: {stdout}"))
            .to_string();
        Face {
            daemon,
            addr,
            ca,
            token,
        }
    }

    fn https(&self) -> String {
        format!("https://{}/acp", self.addr)
    }

    fn wss(&self) -> String {
        format!("wss://{}/acp", self.addr)
    }

    /// `node remote-client.mjs ARGS` from the daemon's directory (the sessions' cwd), trusting
    /// the certificate and holding the token.
    fn node(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("node");
        cmd.arg(interop_dir().join("remote-client.mjs"))
            .args(args)
            .current_dir(self.daemon.env.path())
            .env("NODE_EXTRA_CA_CERTS", &self.ca)
            .env("ACPD_TOKEN", &self.token)
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .env_remove("ACPD_MAX_DEPTH");
        cmd
    }

    /// The TypeScript client over the Unix socket, through `acpd connect`: the reference.
    fn over_socket(&self, phase: &[&str]) -> Command {
        let env = &self.daemon.env;
        let mut args = vec!["stdio"];
        args.extend_from_slice(phase);
        args.extend_from_slice(&["--", BIN, "--config", env.config.to_str().unwrap()]);
        args.extend_from_slice(&["connect", "--socket", self.daemon.socket.to_str().unwrap()]);
        self.node(&args)
    }

    /// Waits until the daemon holds `sid` live no more (its connection ended it), so that a
    /// `session/load` starts a child that replays it.
    fn ended(&self, sid: &str) {
        let mut last = Value::Null;
        let gone = eventually(SETTLE, || {
            last = self.daemon.cli_json(&["runs"]);
            !last["sessions"]
                .as_array()
                .is_some_and(|all| all.iter().any(|s| s["sessionId"] == sid))
        });
        assert!(gone, "{sid} still live after its connection ended: {last}");
    }

    /// Both phases through `client` (a command given the phase's arguments): the first's and
    /// the load's summaries, merged, the session id left out.
    fn both_phases(&self, client: impl Fn(&[&str]) -> Command) -> Value {
        let first = summary(client(&["first"]));
        let sid = first["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no sessionId in {first}"))
            .to_string();
        self.ended(&sid);
        let load = summary(client(&["load", &sid]));
        let mut all = json!({"first": first, "load": load});
        all["first"].as_object_mut().unwrap().remove("sessionId");
        all
    }

    /// What the Unix socket answers: checked against what the echo agent says, then the
    /// reference every network door must equal.
    fn reference(&self) -> Value {
        let mut got = self.both_phases(|phase| self.over_socket(phase));
        for phase in ["first", "load"] {
            let exit = got[phase].as_object_mut().unwrap().remove("childExit");
            assert_eq!(exit, Some(json!(0)), "acpd connect exited with {exit:?}");
        }
        assert_eq!(got, expected(), "over the Unix socket");
        got
    }
}

/// The echo agent's answers to both phases, as a client sees them through acpd.
fn expected() -> Value {
    let chunk = |t: &str| json!(["agent_message_chunk", t]);
    let user = |t: &str| json!(["user_message_chunk", t]);
    let head = json!({
        "protocolVersion": 1,
        "acpd": env!("CARGO_PKG_VERSION"),
        "loadSession": true,
    });
    let with = |more: Value| {
        let mut v = head.clone();
        v.as_object_mut()
            .unwrap()
            .extend(more.as_object().unwrap().clone());
        v
    };
    json!({
        "first": with(json!({
            "prompt": {
                "stopReason": "end_turn",
                "updates": [chunk("hello\n"), chunk("permission: selected allow\n")],
                "permissions": [[["allow", "allow_once"], ["reject", "reject_once"]]],
            },
            "cancel": {
                "stopReason": "cancelled",
                "updates": [chunk("waiting\n")],
                "permissions": [],
            },
        })),
        "load": with(json!({
            "load": {
                "answered": true,
                "updates": [
                    user("hello\n:permission"),
                    chunk("hello\npermission: selected allow\n"),
                    user("waiting\n:hang"),
                    chunk("waiting\n"),
                ],
                "permissions": [],
            },
            "again": {
                "stopReason": "end_turn",
                "updates": [chunk("again")],
                "permissions": [],
            },
        })),
    })
}

/// Runs `cmd` to its end (killed past [`RUN`]) and parses the one JSON line it printed.
fn summary(mut cmd: Command) -> Value {
    let scratch = tempfile::tempdir().unwrap();
    let (out, err) = (scratch.path().join("out"), scratch.path().join("err"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?} could not start: {e}"));
    let started = Instant::now();
    let ended = eventually(RUN, || child.try_wait().unwrap().is_some());
    if !ended {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let stdout = std::fs::read_to_string(&out).unwrap();
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(
        ended && status.success(),
        "{cmd:?} {} after {:?}\nstdout: {stdout}\nstderr: {stderr}",
        if ended { "failed" } else { "was killed" },
        started.elapsed(),
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{cmd:?} printed no JSON summary ({e}): {stdout}\n{stderr}"))
}

/// The `host:port` the daemon's network listener bound (port 0 asked), as `acpd status` lists
/// its endpoints (`https://127.0.0.1:PORT/acp`).
fn listening(daemon: &Daemon) -> String {
    let mut url = String::new();
    let seen = eventually(SETTLE, || {
        url = daemon.status()["listening"][0]
            .as_str()
            .unwrap_or("")
            .to_owned();
        !url.is_empty()
    });
    assert!(seen, "acpd status lists no endpoint: {}", daemon.log());
    host_port(&url)
}

#[test]
fn typescript_sdk_http_client_gets_what_the_unix_socket_gets() {
    if !node_ready() {
        return;
    }
    let face = Face::start();
    let reference = face.reference();
    let url = face.https();
    let got = face.both_phases(|phase| {
        let mut args = vec!["http", url.as_str()];
        args.extend_from_slice(phase);
        face.node(&args)
    });
    assert_eq!(got, reference, "createHttpStream over {url}");
}

#[test]
fn typescript_sdk_ws_client_gets_what_the_unix_socket_gets() {
    if !node_ready() {
        return;
    }
    let face = Face::start();
    let reference = face.reference();
    let url = face.wss();
    let got = face.both_phases(|phase| {
        let mut args = vec!["ws", url.as_str()];
        args.extend_from_slice(phase);
        face.node(&args)
    });
    assert_eq!(got, reference, "createWebSocketStream over {url}");
}

#[test]
fn rust_sdk_http_client_gets_what_the_unix_socket_gets() {
    if !node_ready() {
        return;
    }
    let client = rust_client();
    let face = Face::start();
    let reference = face.reference();
    for url in [face.https(), face.wss()] {
        let got = face.both_phases(|phase| {
            let mut cmd = Command::new(&client);
            cmd.arg(&url)
                .arg(&face.ca)
                .args(phase)
                .current_dir(face.daemon.env.path())
                .env("ACPD_TOKEN", &face.token);
            cmd
        });
        assert_eq!(got, reference, "agent-client-protocol-http over {url}");
    }
}

#[test]
fn acpremote_mirror_gets_what_the_unix_socket_gets() {
    if !node_ready() {
        return;
    }
    let Some(acpremote) = acpremote() else {
        return;
    };
    let face = Face::start();
    let reference = face.reference();
    let url = face.wss();
    // The token from the environment (`--token-env`): `--bearer-token T` sends the same header
    // but puts the token where every local user reads it, /proc/PID/cmdline.
    let mirror = [
        acpremote.to_str().unwrap(),
        "mirror",
        &url,
        "--token-env",
        "ACPD_TOKEN",
    ];
    let mut got = face.both_phases(|phase| {
        let mut args = vec!["stdio"];
        args.extend_from_slice(phase);
        args.push("--");
        args.extend_from_slice(&mirror);
        let mut cmd = face.node(&args);
        // Python's ssl trusts the certificate through SSL_CERT_FILE.
        cmd.env("SSL_CERT_FILE", &face.ca);
        cmd
    });
    for phase in ["first", "load"] {
        let exit = got[phase].as_object_mut().unwrap().remove("childExit");
        assert_eq!(
            exit,
            Some(json!(0)),
            "acpremote mirror exited with {exit:?}"
        );
    }
    assert_eq!(got, reference, "acpremote mirror {url}");
}
