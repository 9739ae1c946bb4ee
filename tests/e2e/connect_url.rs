//! `acpd connect --url`: the real binary bridging its stdio to a WebSocket server over TLS
//! (the test peer in `peer.rs`): lines and frames one for one, the certificate checked against
//! a pin or a CA file (never skipped), the token only in `Authorization`, and each failure a
//! user meets told in words that say what to do.

mod peer;

use std::os::unix::fs::PermissionsExt as _;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::common;
use peer::{Cert, Peer, TOKEN};

/// How long a test waits for a line or an exit it expects.
const WAIT: Duration = Duration::from_secs(20);

/// `acpd connect --url …` with piped stdio, its token (if any) in a mode-600 file.
struct Connect {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    _dir: tempfile::TempDir,
}

impl Connect {
    fn start(args: &[&str], token: Option<&str>) -> Connect {
        Connect::start_with(args, token, |_| {})
    }

    fn start_with(
        args: &[&str],
        token: Option<&str>,
        tweak: impl FnOnce(&mut std::process::Command),
    ) -> Connect {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = common::base();
        tweak(&mut cmd);
        cmd.arg("connect").args(args);
        if !args.contains(&"--timeout") {
            cmd.args(["--timeout", "10s"]);
        }
        cmd.env_remove("ACPD_TOKEN");
        if let Some(token) = token {
            let file = dir.path().join("token");
            std::fs::write(&file, format!("{token}\n")).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
            cmd.arg("--token-file").arg(&file);
        }
        let mut child = tokio::process::Command::from(cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Connect {
            stdin: child.stdin.take(),
            child,
            stdout,
            _dir: dir,
        }
    }

    async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("a line within the wait")
            .unwrap()
            .expect("a line, not the end of stdout")
    }

    /// Closes stdin (unless already) and waits for the exit: its code and stderr.
    async fn exit(mut self) -> (i32, String) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("acpd connect exits within the wait")
            .unwrap();
        let mut stderr = String::new();
        let mut err = self.child.stderr.take().unwrap();
        err.read_to_string(&mut stderr).await.unwrap();
        (status.code().unwrap_or(-1), stderr)
    }
}

#[tokio::test]
async fn lines_and_frames_cross_one_for_one_to_a_pinned_certificate() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    // With every log line on (the WebSocket crate's own trace of the request included), the
    // token still never reaches stderr.
    let mut c = Connect::start_with(
        &["--url", &peer.url(), "--fingerprint", &cert.fingerprint],
        Some(TOKEN),
        |cmd| {
            cmd.env("ACPD_LOG", "trace,tungstenite::handshake::client=trace");
        },
    );
    let request = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
    c.send(request).await;
    assert_eq!(c.line().await, request);
    // A raw CR LF inside a frame is JSON whitespace: still one line.
    c.send("newline").await;
    assert_eq!(c.line().await, r#"{"a":  1}"#);
    // A binary frame is skipped (with a warning), the next text frame still arrives.
    c.send("binary").await;
    assert_eq!(c.line().await, r#"{"after":"binary"}"#);
    let (code, stderr) = c.exit().await;
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(
        stderr.contains("binary frame (2 bytes); ignored"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(TOKEN),
        "the token is never printed: {stderr}"
    );
    let seen = peer.seen.lock().unwrap();
    assert_eq!(
        seen.authorization.as_deref(),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(seen.texts, [request, "newline", "binary"]);
    // stdin's end is a close frame, then the exit once the server closed.
    assert_eq!(seen.close.as_ref().map(|c| c.0), Some(1000));
}

#[tokio::test]
async fn a_ca_file_is_trusted_and_an_unknown_issuer_is_refused_with_its_fingerprint() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let mut c = Connect::start(&["--url", &peer.url(), "--ca", cert.pem()], Some(TOKEN));
    c.send("{}").await;
    assert_eq!(c.line().await, "{}");
    assert_eq!(c.exit().await.0, 0);

    // The same name, but not the right certificate: the public roots do not know it.
    let url = format!("https://localhost:{}", peer.port);
    let (code, stderr) = Connect::start(&["--url", &url], Some(TOKEN)).exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("the TLS handshake with wss://localhost:"),
        "{stderr}"
    );
    assert!(stderr.contains("unknown issuer"), "{stderr}");
    assert!(stderr.contains(&cert.fingerprint), "{stderr}");
    assert!(stderr.contains("--ca FILE"), "{stderr}");
}

#[tokio::test]
async fn a_wrong_fingerprint_is_refused_naming_the_expected_and_the_seen() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let other = Cert::new();
    let (code, stderr) = Connect::start(
        &["--url", &peer.url(), "--fingerprint", &other.fingerprint],
        Some(TOKEN),
    )
    .exit()
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("fingerprint mismatch"), "{stderr}");
    assert!(
        stderr.contains(&format!("expects {}", other.fingerprint)),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("presented {}", cert.fingerprint)),
        "{stderr}"
    );
    assert!(
        peer.seen.lock().unwrap().authorization.is_none(),
        "no request went out"
    );
}

#[tokio::test]
async fn a_refused_token_shows_the_servers_words_and_a_missing_one_says_where_it_goes() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let pin = ["--url", &peer.url(), "--fingerprint", &cert.fingerprint];
    let wrong = "acpd_not-the-token-0000000000000000000000000000";
    let (code, stderr) = Connect::start(&pin, Some(wrong)).exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("refused the connection: HTTP 401"),
        "{stderr}"
    );
    assert!(stderr.contains("unknown token (the test peer)"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "the server's words are escaped: {stderr:?}"
    );
    assert!(!stderr.contains(wrong), "{stderr}");
    let (code, stderr) = Connect::start(&pin, None).exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no token was sent"), "{stderr}");
    assert!(stderr.contains("$ACPD_TOKEN"), "{stderr}");
}

#[tokio::test]
async fn a_token_file_others_may_read_is_refused_before_connecting() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, TOKEN).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let args = [
        "--url",
        &peer.url(),
        "--fingerprint",
        &cert.fingerprint,
        "--token-file",
        file.to_str().unwrap(),
    ];
    let (code, stderr) = Connect::start(&args, None).exit().await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("run `chmod 600 {}`", file.display())),
        "{stderr}"
    );
    // A FIFO where the token file belongs (nobody writing it) is refused, not waited on; a
    // --ca file that holds no certificate too.
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut args = args.to_vec();
    args[5] = fifo.to_str().unwrap();
    let (code, stderr) = Connect::start(&args, None).exit().await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("it is not a regular file"), "{stderr}");
    let ca = ["--url", &peer.url(), "--ca", file.to_str().unwrap()];
    let (code, stderr) = Connect::start(&ca, Some(TOKEN)).exit().await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("it holds no PEM certificate"), "{stderr}");
    assert!(peer.seen.lock().unwrap().authorization.is_none());
}

#[tokio::test]
async fn plain_http_is_refused_off_this_machine_and_a_closed_port_is_named() {
    let (code, stderr) = Connect::start(&["--url", "http://192.0.2.7:8080"], None)
        .exit()
        .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("refusing plain http:// to 192.0.2.7"),
        "{stderr}"
    );
    let pin = Cert::new().fingerprint;
    let args = ["--url", "http://127.0.0.1:9", "--fingerprint", &pin];
    let (code, stderr) = Connect::start(&args, None).exit().await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("an http:// URL has none"), "{stderr}");
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("https://127.0.0.1:{port}");
    let (code, stderr) = Connect::start(&["--url", &url], None).exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot connect to 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(stderr.contains("refused"), "{stderr}");
}

#[tokio::test]
async fn the_servers_close_ends_connect_with_its_reason() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let mut c = Connect::start(
        &["--url", &peer.url(), "--fingerprint", &cert.fingerprint],
        Some(TOKEN),
    );
    c.send("close the token was revoked\u{1b}[2J").await;
    let status = tokio::time::timeout(WAIT, c.child.wait())
        .await
        .unwrap()
        .unwrap();
    let (code, stderr) = c.exit().await;
    assert_eq!(status.code(), Some(1));
    assert_eq!(code, 1);
    assert!(
        stderr.contains(
            "ended the connection: it closed the connection (1008): the token was revoked"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "the reason is escaped: {stderr:?}"
    );
}

#[tokio::test]
async fn a_line_over_max_line_is_answered_on_stdout_and_the_next_one_still_goes() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let mut c = Connect::start(
        &["--url", &peer.url(), "--fingerprint", &cert.fingerprint],
        Some(TOKEN),
    );
    let giant = format!("{{\"pad\":\"{}\"}}", "y".repeat(17 << 20));
    c.send(&giant).await;
    c.send("{\"after\":1}").await;
    let answer: Value = serde_json::from_str(&c.line().await).unwrap();
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert_eq!(answer["error"]["data"]["limit"], "max_line", "{answer}");
    assert_eq!(c.line().await, "{\"after\":1}");
    assert_eq!(c.exit().await.0, 0);
    assert_eq!(peer.seen.lock().unwrap().texts, ["{\"after\":1}"]);
}

/// An editor that stops reading stdout: frames stay on the server (its sends block), acpd
/// connect's memory stays flat, and once the editor reads again every frame arrives in order.
#[tokio::test]
async fn an_editor_that_stops_reading_holds_the_server_back_without_buffering() {
    const FRAMES: usize = 200;
    const SIZE: usize = 1 << 20;
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let mut c = Connect::start(
        &["--url", &peer.url(), "--fingerprint", &cert.fingerprint],
        Some(TOKEN),
    );
    c.send(&format!("flood {FRAMES} {SIZE}")).await;
    // Wait until the peer's sends stop advancing (its socket is full), at most WAIT.
    let started = std::time::Instant::now();
    let mut last = usize::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = peer.flooded.load(Ordering::SeqCst);
        if now == last || now == FRAMES || started.elapsed() > WAIT {
            break;
        }
        last = now;
    }
    let sent = peer.flooded.load(Ordering::SeqCst);
    assert!(
        sent < FRAMES / 4,
        "the server could send {sent} of {FRAMES} MiB frames"
    );
    let pid = c.child.id().unwrap() as i32;
    let rss = rss_kib(pid);
    assert!(
        rss < 96 * 1024,
        "acpd connect holds {rss} KiB while its stdout is not read"
    );
    for n in 0..FRAMES {
        let line = c.line().await;
        assert!(line.starts_with(&format!("{{\"n\":{n},")), "frame {n}");
        assert_eq!(
            line.len(),
            SIZE + format!("{{\"n\":{n},\"pad\":\"\"}}").len()
        );
    }
    assert_eq!(c.exit().await.0, 0);
}

/// An idle connection is pinged every 15 s (what keeps NATs and proxies from dropping it).
#[tokio::test]
async fn an_idle_connection_is_pinged_every_15_seconds() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let mut c = Connect::start(
        &["--url", &peer.url(), "--fingerprint", &cert.fingerprint],
        Some(TOKEN),
    );
    c.send("{}").await;
    assert_eq!(c.line().await, "{}");
    let opened = std::time::Instant::now();
    let deadline = opened + Duration::from_secs(25);
    while peer.seen.lock().unwrap().pings.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = *peer
        .seen
        .lock()
        .unwrap()
        .pings
        .first()
        .expect("a ping within 25 s");
    let after = first.duration_since(opened);
    assert!(after >= Duration::from_secs(13), "pinged after {after:?}");
    assert_eq!(c.exit().await.0, 0);
}

/// A frame over 16 MiB from the server ends connect (the limit named), as do a server that
/// never answers (at --timeout) and one that speaks plain HTTP where TLS was asked for.
#[tokio::test]
async fn an_oversized_frame_a_silent_server_and_a_plain_one_are_each_named() {
    let cert = Cert::new();
    let peer = Peer::start(&cert).await;
    let mut c = Connect::start(
        &["--url", &peer.url(), "--fingerprint", &cert.fingerprint],
        Some(TOKEN),
    );
    c.send(&format!("flood 1 {}", 16 << 20)).await;
    let status = tokio::time::timeout(WAIT, c.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let (_, stderr) = c.exit().await;
    assert!(stderr.contains("over the 16777216-byte limit"), "{stderr}");

    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = silent.accept().await {
            held.push(tcp);
        }
    });
    let (code, stderr) = Connect::start(&["--url", &url, "--timeout", "1s"], None)
        .exit()
        .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("within 1s while in the TLS handshake"),
        "{stderr}"
    );
    held.abort();

    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}", plain.local_addr().unwrap().port());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = plain.accept().await {
            let _ = tcp
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let (code, stderr) = Connect::start(&["--url", &url], None).exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("is not speaking TLS"), "{stderr}");
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}
