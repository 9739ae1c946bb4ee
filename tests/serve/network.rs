//! The network face end to end: a real `acpd serve --listen https://127.0.0.1:0` with a
//! certificate the test makes, reached over WebSocket and Streamable HTTP (POST + SSE) with a
//! token made by `acpd token create` — and refused, with the rule's name, when a request
//! carries no token, a wrong one, or one where tokens must never travel.

use crate::common;

use common::remote::{Face, Http, Ws, wait_for};
use serde_json::{Value, json};

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
           "params": {"protocolVersion": 1, "clientCapabilities": {}}})
}

/// The text of the agent_message_chunk updates among `seen`.
fn said(seen: &[Value]) -> String {
    seen.iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect()
}

#[test]
fn a_websocket_client_runs_a_session_through_the_face() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let mut ws = face.ws(&token);
    let init = ws.call("initialize", initialize()["params"].clone());
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let new = ws.call(
        "session/new",
        json!({"cwd": face.daemon.env.path(), "mcpServers": []}),
    );
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    let answer = ws.call(
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "over the network"}]}),
    );
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(said(&ws.seen), "over the network");
}

#[test]
fn a_streamable_http_client_runs_a_session_through_the_face() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let http = Http::new(&face.url, &face.cert, Some(&token));
    let init = http.post(&initialize(), None, None);
    assert_eq!(init.status, 200, "{init:?}");
    assert_eq!(init.json()["result"]["protocolVersion"], 1);
    let conn = init
        .header("acp-connection-id")
        .expect("Acp-Connection-Id")
        .to_owned();
    let main = http.sse(&conn, None).unwrap();
    let mut seen = Vec::new();
    let new = json!({"jsonrpc": "2.0", "id": 1, "method": "session/new",
                     "params": {"cwd": face.daemon.env.path(), "mcpServers": []}});
    assert_eq!(http.post(&new, Some(&conn), None).status, 202);
    let created = wait_for(&main, &mut seen, |m| m["id"] == 1);
    let sid = created["result"]["sessionId"].as_str().unwrap().to_owned();
    let stream = http.sse(&conn, Some(&sid)).unwrap();
    let prompt = json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "over http"}]}});
    // A session's message without its header is refused, as the transport RFD has it.
    assert_eq!(http.post(&prompt, Some(&conn), None).status, 400);
    let r = http.post(&prompt, Some(&conn), Some(&sid));
    assert_eq!(r.status, 202, "{r:?}");
    let mut updates = Vec::new();
    let answer = wait_for(&stream, &mut updates, |m| m["id"] == 2);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(said(&updates), "over http");
    // A second reader of the same stream is refused; DELETE ends the connection.
    assert_eq!(http.sse(&conn, Some(&sid)).unwrap_err().status, 409);
    assert_eq!(http.delete(&conn).status, 202);
    assert_eq!(http.post(&prompt, Some(&conn), Some(&sid)).status, 404);
}

#[test]
fn requests_without_a_valid_token_get_nothing_and_name_the_rule() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let none = Http::new(&face.url, &face.cert, None);
    let r = none.post(&initialize(), None, None);
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"acpd\""));
    let wrong = Http::new(&face.url, &face.cert, Some("acpd_not-a-token-acpd-made"));
    let r = wrong.post(&initialize(), None, None);
    assert_eq!(r.status, 401, "{r:?}");
    assert!(
        r.header("www-authenticate")
            .unwrap()
            .contains("invalid_token")
    );
    // A token in the URL is refused even with a good header, and never echoed or logged.
    let mut leaky = Http::new(&face.url, &face.cert, Some(&token));
    leaky.url = format!("{}?access_token={token}", leaky.url);
    let r = leaky.post(&initialize(), None, None);
    assert_eq!(r.status, 400, "{r:?}");
    assert!(!r.body.contains(&token));
    for (k, v) in [
        ("Cookie", format!("session={token}")),
        ("Sec-WebSocket-Protocol", token.clone()),
    ] {
        let refused = Ws::connect(
            &face.url,
            &face.cert,
            &[("Authorization", &format!("Bearer {token}")), (k, &v)],
        )
        .err()
        .unwrap_or_else(|| panic!("{k} with a token was accepted"));
        assert_eq!(refused.status, 400, "{k}: {refused:?}");
    }
    let refused = Ws::connect(&face.url, &face.cert, &[])
        .err()
        .expect("no token, no socket");
    assert_eq!(refused.status, 401);
    assert!(
        !face.daemon.log().contains(&token),
        "the token reached the log"
    );
    let metrics = face.daemon.cli(&["status", "--metrics"]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    for reason in [
        "unauthenticated",
        "token_unknown",
        "credentials_in_url",
        "credentials_in_cookie",
    ] {
        let line = format!("acpd_network_refused_total{{reason=\"{reason}\"}}");
        let n: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line}: {text}"))
            .trim()
            .parse()
            .unwrap();
        assert!(n >= 1.0, "{line} {n}");
    }
}

/// `curl` over HTTP/2 (ALPN h2): the initialize POST and its `Acp-Connection-Id`.
#[test]
fn http2_clients_are_served_through_alpn() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: curl is not installed");
        return;
    }
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let port = face
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/acp")
        .to_owned();
    let out = std::process::Command::new("curl")
        .args(["-sS", "-i", "--http2", "--cacert"])
        .arg(&face.cert.cert)
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-H", "Content-Type: application/json"])
        .args(["--data", &initialize().to_string()])
        .arg(format!("https://localhost:{port}/acp"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("HTTP/2 200"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.to_ascii_lowercase().contains("acp-connection-id: "),
        "{text}"
    );
    assert!(text.contains("\"protocolVersion\":1"), "{text}");
}

/// A browser page is let in only from an origin on `allowed_origins`.
#[test]
fn a_browser_origin_off_the_list_is_refused() {
    let face = Face::start("allowed_origins = [\"https://app.example\"]");
    let token = face.token("laptop", &[]);
    let auth = format!("Bearer {token}");
    let refused = Ws::connect(
        &face.url,
        &face.cert,
        &[("Authorization", &auth), ("Origin", "https://evil.example")],
    )
    .err()
    .expect("a foreign origin was let in");
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.body.contains("allowed_origins"), "{}", refused.body);
    Ws::connect(
        &face.url,
        &face.cert,
        &[("Authorization", &auth), ("Origin", "https://app.example")],
    )
    .expect("the listed origin");
}

/// A renewed certificate is served after `acpd reload` (SIGHUP), without a restart; a bad one
/// is refused and the one in use kept.
#[test]
fn a_reload_puts_a_renewed_certificate_in_force() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let renewed_dir = tempfile::tempdir().unwrap();
    let renewed = common::remote::Cert::new(renewed_dir.path());
    // Not yet: a client trusting only the renewed certificate is refused by TLS.
    assert!(
        std::panic::catch_unwind(|| {
            let mut ws = Ws::connect(
                &face.url,
                &renewed,
                &[("Authorization", &format!("Bearer {token}"))],
            );
            let _ = ws.as_mut().map(|w| w.socket.read());
        })
        .is_err()
    );
    std::fs::copy(&renewed.cert, &face.cert.cert).unwrap();
    std::fs::copy(&renewed.key, &face.cert.key).unwrap();
    let out = face.daemon.cli(&["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ws = Ws::connect(
        &face.url,
        &renewed,
        &[("Authorization", &format!("Bearer {token}"))],
    )
    .unwrap_or_else(|r| panic!("{r:?}"));
    let init = ws.call("initialize", initialize()["params"].clone());
    assert_eq!(init["result"]["protocolVersion"], 1);
    // A broken certificate file: the reload keeps the renewed one.
    std::fs::write(&face.cert.cert, "not a certificate").unwrap();
    let _ = face.daemon.cli(&["reload"]);
    assert!(
        common::eventually(std::time::Duration::from_secs(10), || face
            .daemon
            .log()
            .contains("TLS certificate reload rejected")),
        "{}",
        face.daemon.log()
    );
    Ws::connect(
        &face.url,
        &renewed,
        &[("Authorization", &format!("Bearer {token}"))],
    )
    .expect("the certificate in use was kept");
}

/// What would expose sessions without TLS beyond this machine, or serve https without a
/// certificate, is a start error saying what to do.
#[test]
fn a_plain_listener_beyond_loopback_or_https_without_a_certificate_does_not_start() {
    let env = common::Env::new("");
    for (flag, says) in [
        ("http://0.0.0.0:18443", "without TLS beyond this machine"),
        ("https://127.0.0.1:0", "needs a certificate"),
    ] {
        let out = env
            .acpd()
            .env_remove("CREDENTIALS_DIRECTORY")
            .args(["serve", "--socket"])
            .arg(env.path().join("acpd.sock"))
            .args(["--listen", flag])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} started");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{flag}: {err}");
    }
    let out = common::Env::raw("listen = [\"http://192.0.2.1:8080\"]\n")
        .acpd()
        .args(["serve"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("listen") && err.contains("without TLS"),
        "{err}"
    );
}

/// The TCP port systemd passes (acpd-https.socket: `FileDescriptorName=https`) is served, in
/// either order with the Unix socket.
#[test]
fn the_https_port_systemd_passes_is_served() {
    if std::process::Command::new("systemd-socket-activate")
        .arg("--help")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: systemd-socket-activate is not installed (Debian package systemd)");
        return;
    }
    for tcp_first in [true, false] {
        let env = common::Env::new("default_provider = \"fast\"");
        let cert = common::remote::Cert::new(env.path());
        let config = format!(
            "tls_cert = {:?}\ntls_key = {:?}\n{}",
            cert.cert,
            cert.key,
            std::fs::read_to_string(&env.config).unwrap()
        );
        std::fs::write(&env.config, config).unwrap();
        let socket = env.path().join("activated.sock");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let tcp = format!("127.0.0.1:{port}");
        let unix = socket.to_str().unwrap().to_owned();
        let (first, second) = if tcp_first {
            (&tcp, &unix)
        } else {
            (&unix, &tcp)
        };
        let name = |l: &String| if *l == tcp { "https" } else { "acpd.socket" };
        // Made before the daemon starts: it reads the tokens as it starts.
        let out = env
            .acpd()
            .args(["token", "create", "laptop", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let activator = std::process::Command::new("systemd-socket-activate")
            .args(["-l", first, "-l", second])
            .arg(format!("--fdname={}:{}", name(first), name(second)))
            // systemd-socket-activate passes its program only the variables named with -E.
            .arg(format!(
                "--setenv=STATE_DIRECTORY={}",
                env.path().join("state").display()
            ))
            .args(["--", common::BIN, "--config"])
            .arg(&env.config)
            .args(["serve"])
            .env("XDG_CONFIG_HOME", "/nonexistent-acpd-test-config")
            .env("STATE_DIRECTORY", env.path().join("state"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(env.path().join("serve.log")).unwrap())
            .spawn()
            .unwrap();
        // Ended however the test ends: a failed assertion must not leave acpd serving.
        let mut activator = common::Served(activator, env.path().to_path_buf());
        assert!(common::eventually(
            std::time::Duration::from_secs(10),
            || socket.exists()
        ));
        let status = env
            .acpd()
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        let status: Value = serde_json::from_slice(&status.stdout).unwrap_or(Value::Null);
        assert_eq!(
            status["listening"],
            json!([format!("https://{tcp}/acp")]),
            "{status}"
        );
        let url = format!("https://{tcp}/acp");
        let log = || std::fs::read_to_string(env.path().join("serve.log")).unwrap_or_default();
        let mut ws = Ws::connect(
            &url,
            &cert,
            &[("Authorization", &format!("Bearer {token}"))],
        )
        .unwrap_or_else(|r| panic!("{r:?}; log: {}", log()));
        let init = ws.call("initialize", initialize()["params"].clone());
        assert_eq!(init["result"]["protocolVersion"], 1);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(activator.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        assert!(activator.0.wait().unwrap().success());
    }
}
