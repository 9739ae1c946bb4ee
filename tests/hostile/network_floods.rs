//! The network face against floods: a thousand WebSockets on one token, ten thousand bad TLS
//! handshakes, headers sent a byte at a time, a hundred unfinished 16 MiB messages. Each is
//! refused or ended with the rule's name, acpd's memory stays flat, and an honest client still
//! gets through.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::network::{pid, refused, still_served};
use common::raw::rss_kib;
use common::remote::{Face, Ws, host_port, tls_connect};
use common::*;

#[test]
fn a_thousand_websockets_on_one_token_are_refused_past_its_limit_and_memory_stays_flat() {
    let face = Face::start("max_connections_per_token = 16\nrequests_per_second = 100000");
    let token = face.token("phone", &[]);
    still_served(&face, &token);
    let before = rss_kib(pid(&face));
    let mut open = Vec::new();
    let mut refused_429 = 0;
    for _ in 0..1000 {
        match Ws::connect(
            &face.url,
            &face.cert,
            &[("Authorization", &format!("Bearer {token}"))],
        ) {
            Ok(ws) => open.push(ws),
            Err(r) => {
                assert_eq!(r.status, 429, "{r:?}");
                assert!(r.body.contains("max_connections_per_token"), "{}", r.body);
                refused_429 += 1;
            }
        }
    }
    assert_eq!(open.len(), 16);
    assert_eq!(refused_429, 984);
    let grown = rss_kib(pid(&face)).saturating_sub(before);
    assert!(
        grown < 32 * 1024,
        "acpd grew {grown} KiB over 1000 upgrades"
    );
    assert!(refused(&face, "max_connections_per_token") >= 984.0);
    // Another token is not locked out by the first one's connections.
    let other = face.token("laptop", &[]);
    still_served(&face, &other);
    drop(open);
    assert!(
        eventually(Duration::from_secs(10), || Ws::connect(
            &face.url,
            &face.cert,
            &[("Authorization", &format!("Bearer {token}"))]
        )
        .is_ok()),
        "the token's places were not given back"
    );
}

#[test]
fn ten_thousand_bad_tls_handshakes_cost_nothing_lasting() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    still_served(&face, &token);
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", pid(&face)))
            .unwrap()
            .count()
    };
    let (fds_before, rss_before) = (fds(), rss_kib(pid(&face)));
    let addr = host_port(&face.url);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                for _ in 0..2500 {
                    let mut tcp = TcpStream::connect(&addr).unwrap();
                    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    // Plain HTTP to a TLS port: not a ClientHello.
                    let _ = tcp.write_all(b"GET /acp HTTP/1.1\r\nHost: x\r\n\r\n");
                    let mut sink = [0u8; 256];
                    while matches!(tcp.read(&mut sink), Ok(n) if n > 0) {}
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(refused(&face, "tls_handshake") >= 10_000.0);
    assert!(
        eventually(Duration::from_secs(10), || fds() <= fds_before + 2),
        "descriptors left open: {} before, {} after",
        fds_before,
        fds()
    );
    let grown = rss_kib(pid(&face)).saturating_sub(rss_before);
    assert!(grown < 32 * 1024, "acpd grew {grown} KiB");
    still_served(&face, &token);
}

#[test]
fn headers_sent_a_byte_a_second_are_cut_off_at_the_header_timeout() {
    let face = Face::start("http_header_timeout = \"2s\"");
    let token = face.token("laptop", &[]);
    // Through TLS, a request whose headers trickle in.
    let mut tls = tls_connect(&face.url, &face.cert);
    let request = format!(
        "POST /acp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nX-Slow: {}\r\n\r\n",
        "a".repeat(40)
    );
    let started = Instant::now();
    let mut cut = false;
    for byte in request.as_bytes() {
        if tls.write_all(&[*byte]).and_then(|()| tls.flush()).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        if started.elapsed() > Duration::from_secs(15) {
            break;
        }
    }
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest);
    assert!(
        cut || started.elapsed() < Duration::from_secs(15),
        "a trickled request was read for {:?}",
        started.elapsed()
    );
    // A silent TCP connection (no ClientHello at all) is closed too.
    let mut silent = TcpStream::connect(host_port(&face.url)).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let started = Instant::now();
    let mut sink = [0u8; 16];
    assert!(matches!(silent.read(&mut sink), Ok(0) | Err(_)));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(refused(&face, "http_header_timeout") >= 1.0);
    still_served(&face, &token);
}

#[test]
fn a_hundred_unfinished_16_mib_messages_hold_a_bounded_budget_on_the_network_face() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let face = Face::start(
        "line_timeout = \"8s\"\nmax_connections_per_token = 200\nrequests_per_second = 1000",
    );
    let token = face.token("greedy", &[]);
    let acpd = pid(&face);
    let before = common::raw::peak_kib(acpd);
    const PARTIAL: usize = (16 << 20) - 1;
    let written = Arc::new(AtomicU64::new(0));
    let mut held = Vec::new();
    for i in 0..100 {
        let written = written.clone();
        let (url, cert, token) = (face.url.clone(), face.cert.der.clone(), token.clone());
        held.push(std::thread::spawn(move || {
            let cert = common::remote::Cert::from_der(cert);
            let mut tls = tls_connect(&url, &cert);
            tls.sock.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut head = if i % 2 == 0 {
                // A WebSocket: the upgrade, then one text frame's header announcing 16 MiB.
                use tokio_tungstenite::tungstenite::client::IntoClientRequest;
                let req = url.replacen("https://", "wss://", 1).into_client_request().unwrap();
                let key = req.headers()["sec-websocket-key"].to_str().unwrap().to_owned();
                let upgrade = format!(
                    "GET /acp HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                     Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
                );
                tls.write_all(upgrade.as_bytes()).unwrap();
                let mut response = [0u8; 1024];
                let n = tls.read(&mut response).unwrap();
                assert!(String::from_utf8_lossy(&response[..n]).contains("101"), "upgrade refused");
                // FIN + text, masked, 64-bit length; a zero mask keeps the payload as sent.
                let mut frame = vec![0x81, 0xFF];
                frame.extend_from_slice(&(PARTIAL as u64 + 1).to_be_bytes());
                frame.extend_from_slice(&[0, 0, 0, 0]);
                frame
            } else {
                format!(
                    "POST /acp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    PARTIAL + 1
                )
                .into_bytes()
            };
            head.extend(std::iter::repeat_n(b' ', 0));
            tls.write_all(&head).unwrap();
            let chunk = vec![b' '; 64 << 10];
            let mut sent = 0;
            while sent < PARTIAL {
                let n = chunk.len().min(PARTIAL - sent);
                if tls.write_all(&chunk[..n]).is_err() {
                    return;
                }
                sent += n;
                written.fetch_add(n as u64, Ordering::Relaxed);
            }
            // Silent, holding the connection until acpd ends it.
            let mut sink = [0u8; 1024];
            while matches!(tls.read(&mut sink), Ok(n) if n > 0) {}
        }));
    }
    // While they are held (the budget is taken), an honest client is served.
    assert!(
        eventually(Duration::from_secs(20), || written.load(Ordering::Relaxed)
            > 96 << 20),
        "the greedy clients sent only {} bytes",
        written.load(Ordering::Relaxed)
    );
    still_served(&face, &face.token("honest", &[]));
    let peak = common::raw::peak_kib(acpd).saturating_sub(before);
    // The budget (64 MiB) plus every connection's allowance and buffers (TLS, HTTP, WS).
    assert!(
        peak < 160 * 1024,
        "acpd's peak grew {peak} KiB for 100 unfinished messages"
    );
    for t in held {
        t.join().unwrap();
    }
    assert!(
        refused(&face, "line_timeout") + refused(&face, "unfinished_message_budget") >= 1.0,
        "no message was ended at its deadline"
    );
}

/// Idle WebSockets hold none of the budget for unfinished messages: 300 of them (past the
/// 256 a read buffer's worth each of the 64 MiB budget would allow) are all served.
#[test]
fn three_hundred_idle_websockets_are_all_admitted() {
    let face = Face::start(
        "max_connections_per_token = 400\nmax_network_connections = 400\nrequests_per_second = 100000",
    );
    let token = face.token("many", &[]);
    let auth = format!("Bearer {token}");
    let mut open = Vec::new();
    for i in 0..300 {
        let mut ws = Ws::connect(&face.url, &face.cert, &[("Authorization", &auth)])
            .unwrap_or_else(|r| panic!("connection {i} refused: {r:?}"));
        let init = ws.call(
            "initialize",
            serde_json::json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        assert!(init.get("result").is_some(), "connection {i}: {init}");
        open.push(ws);
    }
    assert_eq!(refused(&face, "unfinished_message_budget"), 0.0);
    still_served(&face, &token);
}

/// Messages larger than the pipe between the face and acpd reach a WebSocket client whole while
/// the client's own frames (pings) keep interrupting the wait for them.
#[test]
fn large_messages_reach_a_pinging_websocket_client_whole() {
    let face = Face::start("");
    let token = face.token("laptop", &[]);
    let mut ws = face.ws(&token);
    ws.call(
        "initialize",
        serde_json::json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let new = ws.call(
        "session/new",
        serde_json::json!({"cwd": face.daemon.env.path(), "mcpServers": []}),
    );
    let sid = new["result"]["sessionId"].as_str().unwrap().to_owned();
    ws.send(
        &serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": [{"type": "text", "text": ":chunks 30 200000"}]}}),
    );
    let mut chunks = Vec::new();
    loop {
        // A ping between every read: each wakes the face's loop mid-line.
        ws.socket
            .send(tokio_tungstenite::tungstenite::Message::Ping(
                Default::default(),
            ))
            .unwrap();
        let m = ws.recv().unwrap_or_else(|e| panic!("closed: {e}"));
        if m["id"] == 7 {
            assert_eq!(m["result"]["stopReason"], "end_turn", "{m}");
            break;
        }
        if let Some(text) = m["params"]["update"]["content"]["text"].as_str() {
            chunks.push(text.len());
        }
    }
    assert_eq!(chunks, vec![200000; 30]);
}
