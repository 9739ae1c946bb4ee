//! A WebSocket server over TLS built from the crates acpd uses (tokio-rustls, tokio-tungstenite),
//! with a certificate rcgen makes: the far end `acpd connect --url` talks to when no acpd is
//! needed to show a property of the client. It checks the bearer token, echoes text frames, and
//! obeys a few commands sent as frames: `flood N BYTES`, `close REASON`, `binary`, `newline`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::{SinkExt as _, StreamExt as _};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};

use crate::common::remote;

/// The token the peer accepts.
pub const TOKEN: &str = "acpd_test-token-for-the-peer-0123456789abcdefgh";

/// The face's test certificate (`common::remote::Cert`: localhost and 127.0.0.1, in PEM
/// files) and its fingerprint.
pub struct Cert {
    pub files: remote::Cert,
    /// `SHA256:` and the lowercase hex of the DER's SHA-256.
    pub fingerprint: String,
    _dir: tempfile::TempDir,
}

impl Cert {
    pub fn new() -> Cert {
        let dir = tempfile::tempdir().unwrap();
        let files = remote::Cert::new(dir.path());
        Cert {
            fingerprint: fingerprint(&files.der),
            files,
            _dir: dir,
        }
    }

    /// The PEM file holding the certificate.
    pub fn pem(&self) -> &str {
        self.files.cert.to_str().unwrap()
    }

    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::from_pem_file(&self.files.key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(self.files.der.clone())], key)
            .unwrap();
        Arc::new(config)
    }
}

/// `SHA256:` and the lowercase hex of the SHA-256 of a certificate's DER.
pub fn fingerprint(der: &[u8]) -> String {
    let hex: String = Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("SHA256:{hex}")
}

/// What the peer saw of its one client.
#[derive(Debug, Default)]
pub struct Seen {
    pub authorization: Option<String>,
    pub texts: Vec<String>,
    pub close: Option<(u16, String)>,
    /// When each ping arrived.
    pub pings: Vec<std::time::Instant>,
}

pub struct Peer {
    pub port: u16,
    pub seen: Arc<Mutex<Seen>>,
    /// Frames of a `flood` sent so far (each send waits until the socket took it).
    pub flooded: Arc<AtomicUsize>,
}

impl Peer {
    /// Serves connections on 127.0.0.1 until the test's runtime ends.
    pub async fn start(cert: &Cert) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let flooded = Arc::new(AtomicUsize::new(0));
        let (s, f) = (seen.clone(), flooded.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen, flooded) = (acceptor.clone(), s.clone(), f.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(tls, seen, flooded).await;
                    }
                });
            }
        });
        Peer {
            port,
            seen,
            flooded,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

async fn serve(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    seen: Arc<Mutex<Seen>>,
    flooded: Arc<AtomicUsize>,
) {
    let noted = seen.clone();
    // The callback's type is tungstenite's: its error is a whole HTTP response.
    #[allow(clippy::result_large_err)]
    let check = move |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        let auth = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        noted.lock().unwrap().authorization = auth.clone();
        if auth.as_deref() == Some(&format!("Bearer {TOKEN}")) && request.uri().path() == "/acp" {
            return Ok(response);
        }
        let refusal = Response::builder()
            .status(401)
            .header("WWW-Authenticate", "Bearer")
            .body(Some("unknown token (the test peer)\u{1b}[31m".to_string()))
            .unwrap();
        Err(refusal)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tls, check).await else {
        return;
    };
    while let Some(Ok(message)) = ws.next().await {
        let text = match message {
            Message::Text(text) => text.to_string(),
            Message::Ping(_) => {
                seen.lock().unwrap().pings.push(std::time::Instant::now());
                continue;
            }
            Message::Close(frame) => {
                seen.lock().unwrap().close =
                    frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                continue;
            }
            _ => continue,
        };
        seen.lock().unwrap().texts.push(text.clone());
        let mut words = text.split(' ');
        let sent = match words.next().unwrap_or_default() {
            "flood" => {
                let count: usize = words.next().unwrap().parse().unwrap();
                let size: usize = words.next().unwrap().parse().unwrap();
                for i in 0..count {
                    let frame = format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(size));
                    if ws.send(Message::text(frame)).await.is_err() {
                        return;
                    }
                    flooded.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
            "close" => {
                let reason = words.collect::<Vec<_>>().join(" ");
                let frame = CloseFrame {
                    code: CloseCode::Policy,
                    reason: reason.into(),
                };
                ws.send(Message::Close(Some(frame))).await
            }
            "binary" => match ws
                .send(Message::Binary(Bytes::from_static(b"\x00\x01")))
                .await
            {
                Ok(()) => ws.send(Message::text("{\"after\":\"binary\"}")).await,
                Err(e) => Err(e),
            },
            "newline" => ws.send(Message::text("{\"a\":\r\n1}")).await,
            _ => ws.send(Message::text(text)).await,
        };
        if sent.is_err() {
            return;
        }
    }
}
