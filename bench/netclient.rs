//! The clients of the network rows (`network.rs`): one ACP connection through each door —
//! acpd's Unix socket, its WebSocket and its Streamable HTTP (POST + SSE) over TLS, and a stdio
//! agent (`acpremote mirror`) — each reading what comes as raw text and parsing only the lines
//! that are not chunks, so the client is never what limits the stream. The TLS side trusts only
//! the certificate the bench made (as tests/common/remote.rs does).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite;

/// A self-signed certificate for `localhost`, written where the daemon reads it.
pub struct Cert {
    pub der: Vec<u8>,
    pub config: String,
}

impl Cert {
    pub fn new(dir: &Path) -> Cert {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        // acpd refuses a key other users may read.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Cert {
            der: made.cert.der().to_vec(),
            config: format!(
                "listen = [\"https://127.0.0.1:0\"]\ntls_cert = {cert:?}\ntls_key = {key:?}\n"
            ),
        }
    }

    fn rustls(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(self.der.clone())).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }
}

/// Where and how to reach the daemon's network face.
pub struct Face {
    pub cert: Cert,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub token: String,
    /// The certificate and key files, read again on `acpd reload`.
    pub _certs: tempfile::TempDir,
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// One ACP connection, initialized, with one session.
pub struct Conn {
    door: Door,
    session: String,
    next_id: u64,
}

enum Door {
    /// Newline-delimited JSON-RPC both ways: the Unix socket, or a stdio agent's pipes.
    Lines {
        write: Box<dyn Write + Send>,
        read: BufReader<Box<dyn Read + Send>>,
        _child: Option<Reaped>,
    },
    Ws(Box<tungstenite::WebSocket<Tls>>),
    Sse {
        agent: ureq::Agent,
        url: String,
        token: String,
        conn: String,
        /// The connection's main stream, held open (the face ends a connection without one).
        _main: BufReader<Box<dyn Read + Send>>,
        session: BufReader<Box<dyn Read + Send>>,
    },
}

/// A child killed and reaped with its connection.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// Reads one SSE event's data line; `None` when the stream ended.
fn sse_data(read: &mut BufReader<Box<dyn Read + Send>>, line: &mut String) -> Option<()> {
    loop {
        line.clear();
        if read.read_line(line).ok()? == 0 {
            return None;
        }
        if line.starts_with("data: ") {
            line.drain(..6);
            return Some(());
        }
    }
}

impl Door {
    fn send(&mut self, text: &str, agent_session: Option<&str>) {
        match self {
            Door::Lines { write, .. } => {
                write.write_all(text.as_bytes()).unwrap();
                write.write_all(b"\n").unwrap();
                write.flush().unwrap();
            }
            Door::Ws(ws) => ws
                .send(tungstenite::Message::text(text.to_owned()))
                .unwrap(),
            Door::Sse {
                agent,
                url,
                token,
                conn,
                ..
            } => {
                let mut req = agent
                    .post(url.as_str())
                    .header("Authorization", &format!("Bearer {token}"))
                    .header("Content-Type", "application/json")
                    .header("Acp-Connection-Id", conn.as_str());
                if let Some(s) = agent_session {
                    req = req.header("Acp-Session-Id", s);
                }
                let status = req.send(text).unwrap().status().as_u16();
                assert_eq!(status, 202, "POST {text}");
            }
        }
    }

    /// The next message's text, whole (the session stream for SSE).
    fn next(&mut self, buf: &mut String) {
        match self {
            Door::Lines { read, .. } => {
                buf.clear();
                assert!(read.read_line(buf).unwrap() > 0, "the stream ended");
            }
            Door::Ws(ws) => loop {
                match ws.read().unwrap() {
                    tungstenite::Message::Text(t) => {
                        buf.clear();
                        buf.push_str(&t);
                        return;
                    }
                    tungstenite::Message::Close(f) => panic!("the face closed: {f:?}"),
                    _ => {}
                }
            },
            Door::Sse { session, .. } => {
                sse_data(session, buf).expect("the session stream ended");
            }
        }
    }
}

impl Conn {
    /// Through acpd's Unix socket.
    pub fn unix(socket: &Path) -> Conn {
        let s = UnixStream::connect(socket).unwrap();
        let read: Box<dyn Read + Send> = Box::new(s.try_clone().unwrap());
        Conn::lines(Box::new(s), read, None)
    }

    /// Through a stdio agent `argv` (e.g. `acpremote mirror`), with `env` added.
    pub fn stdio(argv: &[String], env: &[(&str, &str)]) -> Conn {
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        let write = child.stdin.take().unwrap();
        let read: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        Conn::lines(Box::new(write), read, Some(Reaped(child)))
    }

    pub fn pid(&self) -> Option<u32> {
        match &self.door {
            Door::Lines {
                _child: Some(c), ..
            } => Some(c.0.id()),
            _ => None,
        }
    }

    fn lines(
        write: Box<dyn Write + Send>,
        read: Box<dyn Read + Send>,
        child: Option<Reaped>,
    ) -> Conn {
        let door = Door::Lines {
            write,
            read: BufReader::with_capacity(256 * 1024, read),
            _child: child,
        };
        Conn::open(door)
    }

    /// The WebSocket door, initialized (no session yet: [`Conn::ws_idle`]).
    pub fn ws_initialized(face: &Face) -> tungstenite::WebSocket<Tls> {
        use tungstenite::client::IntoClientRequest;
        let mut req = format!("wss://localhost:{}/acp", port(face))
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "Authorization",
            format!("Bearer {}", face.token).parse().unwrap(),
        );
        let tcp = TcpStream::connect(&face.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let _ = tcp.set_nodelay(true);
        let tls = rustls::ClientConnection::new(
            face.cert.rustls(),
            ServerName::try_from("localhost").unwrap(),
        )
        .unwrap();
        let (mut ws, _) = tungstenite::client::client(req, rustls::StreamOwned::new(tls, tcp))
            .unwrap_or_else(|e| panic!("websocket upgrade: {e}"));
        ws.send(tungstenite::Message::text(request(
            0,
            "initialize",
            json!({"protocolVersion": 1}),
        )))
        .unwrap();
        loop {
            if let tungstenite::Message::Text(t) = ws.read().unwrap() {
                assert!(t.contains("\"result\""), "initialize: {t}");
                return ws;
            }
        }
    }

    pub fn ws(face: &Face) -> Conn {
        let ws = Conn::ws_initialized(face);
        Conn::session(Door::Ws(Box::new(ws)))
    }

    /// The Streamable HTTP door: POST initialize, the main SSE stream, session/new, and the
    /// session's own stream, where its updates and its prompts' answers come.
    pub fn sse(face: &Face) -> Conn {
        let roots = ureq::tls::RootCerts::Specific(Arc::new(vec![
            ureq::tls::Certificate::from_der(&face.cert.der).to_owned(),
        ]));
        let agent = ureq::Agent::config_builder()
            .tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build())
            .http_status_as_error(false)
            .build()
            .new_agent();
        let url = format!("https://localhost:{}/acp", port(face));
        let bearer = format!("Bearer {}", face.token);
        let init = agent
            .post(&url)
            .header("Authorization", &bearer)
            .header("Content-Type", "application/json")
            .send(request(0, "initialize", json!({"protocolVersion": 1})))
            .unwrap();
        assert_eq!(init.status().as_u16(), 200, "POST initialize");
        let conn = init
            .headers()
            .get("Acp-Connection-Id")
            .and_then(|v| v.to_str().ok())
            .expect("Acp-Connection-Id")
            .to_owned();
        let stream = |session: Option<&str>| -> BufReader<Box<dyn Read + Send>> {
            let mut req = agent
                .get(&url)
                .header("Authorization", &bearer)
                .header("Accept", "text/event-stream")
                .header("Acp-Connection-Id", &conn);
            if let Some(s) = session {
                req = req.header("Acp-Session-Id", s);
            }
            let resp = req.call().unwrap();
            assert_eq!(resp.status().as_u16(), 200, "GET the event stream");
            let read: Box<dyn Read + Send> =
                Box::new(resp.into_body().into_with_config().limit(u64::MAX).reader());
            BufReader::with_capacity(256 * 1024, read)
        };
        let mut main = stream(None);
        let mut door = Door::Sse {
            agent: agent.clone(),
            url: url.clone(),
            token: face.token.clone(),
            conn: conn.clone(),
            _main: BufReader::new(Box::new(std::io::empty())),
            session: BufReader::new(Box::new(std::io::empty())),
        };
        door.send(&request(1, "session/new", new_params()), None);
        let mut line = String::new();
        sse_data(&mut main, &mut line).expect("session/new answered");
        let session = session_id(&line);
        if let Door::Sse {
            _main: m,
            session: s,
            ..
        } = &mut door
        {
            *s = stream(Some(&session));
            *m = main;
        }
        Conn {
            door,
            session,
            next_id: 2,
        }
    }

    /// initialize, then [`Conn::session`].
    fn open(mut door: Door) -> Conn {
        door.send(
            &request(0, "initialize", json!({"protocolVersion": 1})),
            None,
        );
        let mut line = String::new();
        door.next(&mut line);
        assert!(line.contains("\"result\""), "initialize: {line}");
        Conn::session(door)
    }

    fn session(mut door: Door) -> Conn {
        door.send(&request(1, "session/new", new_params()), None);
        let mut line = String::new();
        door.next(&mut line);
        let session = session_id(&line);
        Conn {
            door,
            session,
            next_id: 2,
        }
    }

    pub fn prompt(&mut self, text: &str) {
        let id = self.next_id;
        self.next_id += 1;
        let params = json!({"sessionId": self.session, "prompt": [{"type": "text", "text": text}]});
        let msg = request(id, "session/prompt", params);
        self.door.send(&msg, Some(&self.session));
    }

    /// Reads until the prompt's answer; returns the agent_message_chunk updates seen, and when
    /// the first of them came.
    pub fn drain(&mut self) -> (u64, Option<Instant>) {
        let (mut chunks, mut first) = (0u64, None);
        let mut buf = String::with_capacity(4096);
        loop {
            self.door.next(&mut buf);
            if buf.contains("agent_message_chunk") {
                chunks += 1;
                first.get_or_insert_with(Instant::now);
            } else if buf.contains("\"stopReason\"") {
                return (chunks, first);
            }
        }
    }
}

fn new_params() -> Value {
    json!({"cwd": std::env::temp_dir(), "mcpServers": []})
}

fn session_id(answer: &str) -> String {
    let v: Value = serde_json::from_str(answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    v["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new: {answer}"))
        .to_owned()
}

fn port(face: &Face) -> &str {
    face.addr.rsplit(':').next().unwrap()
}
