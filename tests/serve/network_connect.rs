//! `acpd connect --url` against a real `acpd serve --listen https://127.0.0.1:0` (the face of
//! `network.rs`, with a certificate the test makes): an editor's session runs over it as over
//! the Unix socket, trusting the certificate by `--ca` or by `--fingerprint`; a wrong pin and a
//! missing token end it with the reason.

use crate::common;
use common::remote::Face;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const WAIT: Duration = Duration::from_secs(20);

/// `acpd connect --url` as an editor runs it: JSON-RPC lines on its stdin and stdout.
struct Editor {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Messages read while waiting for an answer.
    seen: Vec<Value>,
}

impl Editor {
    fn start(face: &Face, trust: &[&str], token: Option<&str>) -> Editor {
        let mut cmd = common::base();
        cmd.args(["connect", "--url", &face.url]).args(trust);
        cmd.env_remove("ACPD_TOKEN");
        if let Some(token) = token {
            let file = face.daemon.env.path().join("editor-token");
            std::fs::write(&file, format!("{token}\n")).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
            cmd.arg("--token-file").arg(&file);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Editor {
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Sends a request and returns its answer; what came before it is kept in `seen`.
    fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        loop {
            let line = self
                .lines
                .recv_timeout(WAIT)
                .unwrap_or_else(|e| panic!("no answer to {method} ({e}): {:?}", self.stderr()));
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
            self.seen.push(message);
        }
    }

    /// Closes stdin and waits (bounded) for the exit: its code and stderr.
    fn exit(mut self) -> (i32, String) {
        drop(self.stdin.take());
        let exited = common::eventually(WAIT, || matches!(self.child.try_wait(), Ok(Some(_))));
        if !exited {
            let _ = self.child.kill();
        }
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        (code, self.stderr())
    }

    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
        }
        text
    }
}

fn fingerprint(der: &[u8]) -> String {
    let hex: String = Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("SHA256:{hex}")
}

/// initialize → session/new → a streamed prompt, as over the Unix socket.
fn runs_a_session(face: &Face, trust: &[&str], token: &str) {
    let mut editor = Editor::start(face, trust, Some(token));
    let init = editor.call(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let new = editor.call(
        1,
        "session/new",
        json!({"cwd": face.daemon.env.path(), "mcpServers": []}),
    );
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let answer = editor.call(
        2,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "through acpd connect"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let said: String = editor
        .seen
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(said, "through acpd connect");
    let (code, stderr) = editor.exit();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !stderr.contains(token),
        "the token is never printed: {stderr}"
    );
}

#[test]
fn an_editor_runs_a_session_through_acpd_connect_url_trusting_a_ca_file_or_a_pin() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let ca = face.cert.cert.to_str().unwrap().to_owned();
    runs_a_session(&face, &["--ca", &ca], &token);
    let pin = fingerprint(&face.cert.der);
    runs_a_session(&face, &["--fingerprint", &pin], &token);
}

#[test]
fn a_wrong_pin_or_no_token_ends_acpd_connect_url_with_the_reason() {
    let face = Face::start("");
    let wrong = fingerprint(b"another certificate");
    let (code, stderr) = Editor::start(&face, &["--fingerprint", &wrong], None).exit();
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("fingerprint mismatch"), "{stderr}");
    assert!(stderr.contains(&format!("expects {wrong}")), "{stderr}");
    let seen = fingerprint(&face.cert.der);
    assert!(stderr.contains(&format!("presented {seen}")), "{stderr}");

    let ca = face.cert.cert.to_str().unwrap().to_owned();
    let (code, stderr) = Editor::start(&face, &["--ca", &ca], None).exit();
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("HTTP 401"), "{stderr}");
    // The face's own words, then where a token goes.
    assert!(stderr.contains("no token"), "{stderr}");
    assert!(stderr.contains("--token-file FILE"), "{stderr}");
}

#[test]
fn a_revoked_token_ends_acpd_connect_url_with_the_servers_reason() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let ca = face.cert.cert.to_str().unwrap().to_owned();
    let mut editor = Editor::start(&face, &["--ca", &ca], Some(&token));
    let init = editor.call(0, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let out = face
        .daemon
        .env
        .acpd()
        .args(["token", "revoke", "laptop", "--socket"])
        .arg(&face.daemon.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // connect ends by itself, stdin still open.
    assert!(
        common::eventually(WAIT, || matches!(editor.child.try_wait(), Ok(Some(_)))),
        "acpd connect still runs after its token was revoked"
    );
    let (code, stderr) = editor.exit();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("ended the connection: it closed the connection (1008)"),
        "{stderr}"
    );
}

#[test]
fn provider_chooses_the_connections_default_over_the_network_too() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let ca = face.cert.cert.to_str().unwrap().to_owned();
    let mut editor = Editor::start(&face, &["--ca", &ca, "--provider", "fast"], Some(&token));
    let init = editor.call(0, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    assert_eq!(editor.exit().0, 0);
    let (code, stderr) =
        Editor::start(&face, &["--ca", &ca, "--provider", "nope"], Some(&token)).exit();
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--provider: ") && stderr.contains("no provider named \"nope\""),
        "{stderr}"
    );
}

/// `echo REQUEST | acpd connect --url`: stdin ends right after the request, and its answer
/// still comes (the close frame waits for it, as the socket's half-close does).
#[test]
fn a_request_written_just_before_stdin_ends_is_still_answered() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let ca = face.cert.cert.to_str().unwrap().to_owned();
    for _ in 0..5 {
        let mut editor = Editor::start(&face, &["--ca", &ca], Some(&token));
        let request = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                             "params": {"protocolVersion": 1}});
        writeln!(editor.stdin.as_mut().unwrap(), "{request}").unwrap();
        drop(editor.stdin.take());
        let answer = editor.lines.recv_timeout(WAIT);
        let (code, stderr) = editor.exit();
        let answer: Value = serde_json::from_str(&answer.unwrap_or_default()).unwrap_or_default();
        assert_eq!(answer["result"]["protocolVersion"], 1, "{answer} {stderr}");
        assert_eq!(code, 0, "{stderr}");
    }
}
