//! Clients of acpd's network face for tests: a self-signed certificate made by the test, a
//! WebSocket client (tungstenite over rustls) and a Streamable HTTP client (ureq, with SSE
//! read on a thread), each trusting only that certificate.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite;

/// A self-signed certificate for `localhost` and 127.0.0.1, its key written 0600.
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: Vec<u8>,
}

impl Cert {
    pub fn new(dir: &Path) -> Cert {
        use std::os::unix::fs::PermissionsExt;
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let made = rcgen::generate_simple_self_signed(names).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        Cert {
            cert,
            key,
            der: made.cert.der().to_vec(),
        }
    }

    /// A certificate known by its DER only (to trust it from another thread).
    pub fn from_der(der: Vec<u8>) -> Cert {
        Cert {
            cert: PathBuf::new(),
            key: PathBuf::new(),
            der,
        }
    }

    /// The config lines serving https on a free port of 127.0.0.1 with this certificate.
    pub fn config(&self) -> String {
        format!(
            "listen = [\"https://127.0.0.1:0\"]\ntls_cert = {:?}\ntls_key = {:?}\n",
            self.cert, self.key
        )
    }

    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
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

/// `https://127.0.0.1:PORT/acp` → `127.0.0.1:PORT`.
pub fn host_port(url: &str) -> String {
    url.trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches("/acp")
        .to_owned()
}

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to the face, handshaken.
pub fn tls_connect(url: &str, cert: &Cert) -> TlsStream {
    let tcp = TcpStream::connect(host_port(url)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(cert.client_config(), name).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// An ACP client over WebSocket.
pub struct Ws {
    pub socket: tungstenite::WebSocket<TlsStream>,
    next_id: u64,
    /// Messages read while waiting for an answer (notifications, requests).
    pub seen: Vec<Value>,
}

/// A refused upgrade: the status and the body.
#[derive(Debug)]
pub struct HttpRefusal {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Ws {
    /// Upgrades `url` (https) to a WebSocket with `headers` (e.g. Authorization).
    pub fn connect(url: &str, cert: &Cert, headers: &[(&str, &str)]) -> Result<Ws, HttpRefusal> {
        use tungstenite::client::IntoClientRequest;
        let wss = url
            .replacen("https://", "wss://", 1)
            .replacen("127.0.0.1", "localhost", 1);
        let mut request = wss.into_client_request().unwrap();
        for (k, v) in headers {
            request.headers_mut().insert(
                tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        match tungstenite::client::client(request, tls_connect(url, cert)) {
            Ok((socket, _)) => Ok(Ws {
                socket,
                next_id: 1,
                seen: Vec::new(),
            }),
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
                let status = response.status().as_u16();
                let headers = response
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                    .collect();
                let body = response
                    .into_body()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                Err(HttpRefusal {
                    status,
                    body,
                    headers,
                })
            }
            Err(e) => panic!("websocket handshake failed: {e}"),
        }
    }

    pub fn send(&mut self, message: &Value) {
        self.socket
            .send(tungstenite::Message::text(message.to_string()))
            .unwrap();
    }

    /// The next message; `None` when the server closed (with the close frame's reason).
    pub fn recv(&mut self) -> Result<Value, String> {
        loop {
            match self.socket.read() {
                Ok(tungstenite::Message::Text(t)) => return Ok(serde_json::from_str(&t).unwrap()),
                Ok(tungstenite::Message::Close(frame)) => {
                    return Err(frame
                        .map(|f| format!("{}: {}", u16::from(f.code), f.reason))
                        .unwrap_or_default());
                }
                Ok(_) => continue,
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }

    /// Sends a request and returns its answer (a whole response), keeping what came before.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self
                .recv()
                .unwrap_or_else(|e| panic!("closed waiting for {method}: {e}"));
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                return m;
            }
            self.seen.push(m);
        }
    }
}

/// A Streamable HTTP client of `/acp`.
pub struct Http {
    agent: ureq::Agent,
    pub url: String,
    pub token: Option<String>,
}

/// A response: status, headers (lowercase names) and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

impl Http {
    pub fn new(url: &str, cert: &Cert, token: Option<&str>) -> Http {
        let roots = ureq::tls::RootCerts::Specific(Arc::new(vec![
            ureq::tls::Certificate::from_der(&cert.der).to_owned(),
        ]));
        let tls = ureq::tls::TlsConfig::builder().root_certs(roots).build();
        let agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .new_agent();
        Http {
            agent,
            url: url.replacen("127.0.0.1", "localhost", 1),
            token: token.map(str::to_owned),
        }
    }

    fn auth(
        &self,
        mut req: ureq::RequestBuilder<ureq::typestate::WithBody>,
    ) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        if let Some(t) = &self.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        req
    }

    /// POSTs `message` on connection `conn` (none: an initialize), for session `session`.
    pub fn post(&self, message: &Value, conn: Option<&str>, session: Option<&str>) -> Reply {
        let mut req = self
            .auth(self.agent.post(&self.url))
            .header("Content-Type", "application/json");
        if let Some(c) = conn {
            req = req.header("Acp-Connection-Id", c);
        }
        if let Some(s) = session {
            req = req.header("Acp-Session-Id", s);
        }
        reply(req.send(message.to_string()).unwrap())
    }

    pub fn delete(&self, conn: &str) -> Reply {
        let mut req = self
            .agent
            .delete(&self.url)
            .header("Acp-Connection-Id", conn);
        if let Some(t) = &self.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        reply(req.call().unwrap())
    }

    /// Opens an event stream; its messages arrive on the receiver (it ends with the stream).
    pub fn sse(&self, conn: &str, session: Option<&str>) -> Result<mpsc::Receiver<Value>, Reply> {
        let mut req = self
            .agent
            .get(&self.url)
            .header("Accept", "text/event-stream")
            .header("Acp-Connection-Id", conn)
            .config()
            .timeout_global(None)
            .build();
        if let Some(s) = session {
            req = req.header("Acp-Session-Id", s);
        }
        if let Some(t) = &self.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let response = req.call().unwrap();
        if response.status().as_u16() != 200 {
            return Err(reply(response));
        }
        let (tx, rx) = mpsc::channel();
        let body = response.into_body();
        std::thread::spawn(move || {
            let reader = BufReader::new(body.into_with_config().limit(u64::MAX).reader());
            for line in reader.lines() {
                let Ok(line) = line else { return };
                // A keep-alive comment is passed on as null: a receiver that is gone is found
                // out then, and the stream (its TCP connection) closed, as a vanished client's.
                let message = match line.strip_prefix("data: ") {
                    Some(data) => serde_json::from_str(data).unwrap(),
                    None if line.starts_with(':') => Value::Null,
                    None => continue,
                };
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }
}

fn reply(response: ureq::http::Response<ureq::Body>) -> Reply {
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let body = response.into_body().read_to_string().unwrap_or_default();
    Reply {
        status,
        headers,
        body,
    }
}

/// Waits (at most 20 s) for a message on `rx` that `want` accepts; the ones before it are kept.
pub fn wait_for(
    rx: &mpsc::Receiver<Value>,
    seen: &mut Vec<Value>,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let m = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no awaited message ({e}); seen: {seen:?}"));
        if want(&m) {
            return m;
        }
        seen.push(m);
    }
}

/// A daemon serving https on a free port with a fresh certificate, and its echo provider.
pub struct Face {
    pub daemon: super::daemon::Daemon,
    pub cert: Cert,
    pub url: String,
}

impl Face {
    /// With the echo provider `fast` the default and `extra` top-level keys.
    pub fn start(extra: &str) -> Face {
        let env = super::Env::new("");
        let providers = std::fs::read_to_string(&env.config).unwrap();
        Face::with_config(
            env,
            &format!("default_provider = \"fast\"\n{extra}\n{providers}"),
        )
    }

    /// Serves `config` (its top-level keys first) from `env`, with the listener and certificate.
    pub fn with_config(env: super::Env, config: &str) -> Face {
        let cert = Cert::new(env.path());
        std::fs::write(&env.config, format!("{}{config}", cert.config())).unwrap();
        let daemon = super::daemon::Daemon::start(env);
        let mut url = String::new();
        assert!(
            super::eventually(Duration::from_secs(10), || {
                url = daemon.status()["listening"][0]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                !url.is_empty()
            }),
            "no endpoint in status: {}",
            daemon.log()
        );
        Face { daemon, cert, url }
    }

    /// `acpd token create NAME [args]`: the token it printed.
    pub fn token(&self, name: &str, args: &[&str]) -> String {
        let out = self
            .daemon
            .env
            .acpd()
            .args(["token", "create", name])
            .args(args)
            .arg("--socket")
            .arg(&self.daemon.socket)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(token.starts_with("acpd_"), "{token}");
        token
    }

    pub fn ws(&self, token: &str) -> Ws {
        Ws::connect(
            &self.url,
            &self.cert,
            &[("Authorization", &format!("Bearer {token}"))],
        )
        .unwrap_or_else(|r| panic!("upgrade refused: {r:?}"))
    }
}
