//! `acpd connect --url`: the editor's stdio bridged to a remote acpd's WebSocket endpoint
//! (`wss://HOST:PORT/acp`), so an editor configured with `acpd connect` works unchanged
//! against another machine. TLS by rustls (ring), the token only in `Authorization: Bearer`,
//! one JSON-RPC message per stdin line and per text frame.

mod bridge;
mod tls;

use std::io::Read as _;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::{HeaderValue, Uri, header};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{WebSocketStream, tungstenite};

pub(super) use tls::Fingerprint;
use tls::Trust;

use super::EXIT_USAGE;

/// The largest frame or message either way: the daemon's default `max_line`.
const MAX_MESSAGE: usize = acpd_protocol::codec::DEFAULT_MAX_LINE;
/// The most of the server's refusal (an HTTP body) shown to the user.
const BODY_SHOWN: usize = 1024;
/// The most a token file may hold (a token is 48 characters).
const TOKEN_FILE_MAX: u64 = 4096;

/// What `acpd connect --url` was told.
pub(super) struct Remote<'a> {
    pub url: &'a str,
    pub token_file: Option<&'a Path>,
    pub ca: Option<&'a Path>,
    pub fingerprint: Option<Fingerprint>,
    pub within: Duration,
    pub provider: Option<&'a str>,
}

/// Why `acpd connect --url` could not start or went on no longer.
#[derive(Debug, thiserror::Error)]
pub(super) enum RemoteError {
    #[error("--url {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error(
        "refusing plain http:// to {host}: the token and everything of the session would cross \
         the network unencrypted; use https:// (the server's `listen` with tls_cert/tls_key), or \
         http://127.0.0.1:PORT for a daemon on this machine"
    )]
    PlainToRemote { host: String },
    #[error("cannot read the token file {}: {source}", path.display())]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the token file {} may be read by others (mode {mode:04o}); run `chmod 600 {}` (and \
         consider the token seen: `acpd token revoke` it on the server and create another)",
        path.display(),
        path.display()
    )]
    TokenFileOpen { path: PathBuf, mode: u32 },
    #[error(
        "the token in {origin} is not usable: {why}; it is the one line `acpd token create` \
         printed on the server"
    )]
    BadToken { origin: String, why: &'static str },
    #[error("cannot use --ca {}: {why}", path.display())]
    CaFile { path: PathBuf, why: String },
    #[error("cannot set up TLS: {0}")]
    TlsSetup(String),
    #[error("cannot resolve {host} ({source}); check the host name in --url")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error(
        "cannot connect to {addr} ({source}); is `acpd serve` listening there (its `listen` \
         setting) and the port reachable from here?"
    )]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "no answer from {url} within {} while {stage}; check that the address is right and \
         nothing drops the traffic, or pass a longer --timeout",
        humantime::format_duration(*within)
    )]
    Timeout {
        url: String,
        within: Duration,
        stage: &'static str,
    },
    #[error("the TLS handshake with {url} failed: {why}")]
    Tls { url: String, why: String },
    #[error("{url} refused the connection: HTTP {status}{body}{hint}")]
    Refused {
        url: String,
        status: u16,
        /// `: <the server's words>`, or empty.
        body: String,
        /// `; <what to do>`, or empty.
        hint: String,
    },
    #[error(
        "what answers at {url} is not an acpd WebSocket endpoint ({why}); check the URL (acpd \
         serves /acp)"
    )]
    NotAcpd { url: String, why: String },
}

impl RemoteError {
    /// 2 for what the command line or its files got wrong, 1 for the network and the server
    /// (as `acpd connect` without `--url` exits 1 when no daemon answers).
    fn exit_code(&self) -> u8 {
        match self {
            RemoteError::BadUrl { .. }
            | RemoteError::PlainToRemote { .. }
            | RemoteError::TokenFile { .. }
            | RemoteError::TokenFileOpen { .. }
            | RemoteError::BadToken { .. }
            | RemoteError::CaFile { .. } => EXIT_USAGE,
            _ => 1,
        }
    }
}

/// Where to connect, read from `--url`.
#[derive(Debug)]
struct Target {
    /// The WebSocket URI (`wss://host:port/acp`).
    uri: Uri,
    /// The host as a TLS server name and for DNS (an IPv6 address without its brackets).
    host: String,
    port: u16,
    tls: bool,
}

impl Target {
    fn parse(url: &str) -> Result<Target, RemoteError> {
        let bad = |why: &str| RemoteError::BadUrl {
            url: url.to_string(),
            why: why.to_string(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| bad(&format!("not a URL ({e}); write it as https://HOST:PORT")))?;
        let (tls, scheme, default_port) = match uri.scheme_str() {
            Some("https" | "wss") => (true, "wss", 443),
            Some("http" | "ws") => (false, "ws", 80),
            _ => return Err(bad("the scheme must be https:// (or http:// to 127.0.0.1)")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| bad("it names no host; write it as https://HOST:PORT"))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "credentials do not go in the URL (anyone who sees it has them); put the token \
                 in --token-file FILE or $ACPD_TOKEN",
            ));
        }
        let query = uri.query().unwrap_or_default();
        if query.contains("acpd_") {
            return Err(bad(
                "a token does not go in the URL (servers and proxies log URLs); put it in \
                 --token-file FILE or $ACPD_TOKEN",
            ));
        }
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_string();
        let port = authority.port_u16().unwrap_or(default_port);
        let path = match uri.path() {
            "" | "/" => "/acp",
            path => path,
        };
        let path_and_query = match uri.query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        let uri = Uri::builder()
            .scheme(scheme)
            .authority(authority.as_str())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        if !tls && host.parse::<IpAddr>().is_ok_and(|ip| !ip.is_loopback()) {
            return Err(RemoteError::PlainToRemote { host });
        }
        Ok(Target {
            uri,
            host,
            port,
            tls,
        })
    }
}

/// The `Authorization` header for the token of `--token-file`, else of `$ACPD_TOKEN`; `None`
/// when neither is there (the server then answers 401, and the message says where a token
/// goes). The value is marked sensitive, and the token is never in an error.
fn authorization(file: Option<&Path>) -> Result<Option<HeaderValue>, RemoteError> {
    let (token, origin) = match file {
        Some(path) => (read_token_file(path)?, path.display().to_string()),
        None => match std::env::var("ACPD_TOKEN") {
            Ok(token) => (token, "$ACPD_TOKEN".to_string()),
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(RemoteError::BadToken {
                    origin: "$ACPD_TOKEN".into(),
                    why: "it is not UTF-8",
                });
            }
        },
    };
    let bad = |why| RemoteError::BadToken {
        origin: origin.clone(),
        why,
    };
    let token = token.strip_suffix('\n').unwrap_or(&token);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.is_empty() {
        return Err(bad("it is empty"));
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            "it holds spaces, control characters or more than one line",
        ));
    }
    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| bad("it is not printable ASCII"))?;
    value.set_sensitive(true);
    Ok(Some(value))
}

/// The token file's text, refused when its mode lets the group or others at it.
fn read_token_file(path: &Path) -> Result<String, RemoteError> {
    let failed = |source| RemoteError::TokenFile {
        path: path.to_path_buf(),
        source,
    };
    let (bytes, mode) = read_regular(path, TOKEN_FILE_MAX).map_err(failed)?;
    if mode & 0o077 != 0 {
        return Err(RemoteError::TokenFileOpen {
            path: path.to_path_buf(),
            mode: mode & 0o7777,
        });
    }
    String::from_utf8(bytes).map_err(|_| RemoteError::BadToken {
        origin: path.display().to_string(),
        why: "it is not UTF-8",
    })
}

/// A regular file's bytes (at most `max`) and its mode. Opened without blocking, so a FIFO
/// or a device put where a file belongs is an error instead of a hang.
pub(super) fn read_regular(path: &Path, max: u64) -> std::io::Result<(Vec<u8>, u32)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    if meta.len() > max {
        return Err(std::io::Error::other(format!(
            "it is {} bytes, more than the {max} it may hold",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok((bytes, meta.permissions().mode()))
}

/// A byte stream a WebSocket runs over: TLS, or plain TCP to this machine.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Ws = WebSocketStream<Box<dyn Io>>;

/// Resolves, connects, handshakes TLS and upgrades to a WebSocket, all within `within`.
async fn open(
    target: &Target,
    auth: Option<HeaderValue>,
    tls: Option<Arc<rustls::ClientConfig>>,
    within: Duration,
) -> Result<Ws, RemoteError> {
    let deadline = Instant::now() + within;
    let url = target.uri.to_string();
    let timeout = |stage| RemoteError::Timeout {
        url: url.clone(),
        within,
        stage,
    };
    let addrs: Vec<SocketAddr> = tokio::time::timeout_at(
        deadline,
        tokio::net::lookup_host((target.host.as_str(), target.port)),
    )
    .await
    .map_err(|_| timeout("resolving its host name"))?
    .map_err(|source| RemoteError::Resolve {
        host: target.host.clone(),
        source,
    })?
    .collect();
    if !target.tls && addrs.iter().any(|a| !a.ip().is_loopback()) {
        return Err(RemoteError::PlainToRemote {
            host: target.host.clone(),
        });
    }
    let tcp = tokio::time::timeout_at(deadline, connect_any(&addrs, &target.host))
        .await
        .map_err(|_| timeout("connecting"))??;
    // Each message is one small write the editor waits on.
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = match tls {
        None => Box::new(tcp),
        Some(config) => {
            let name =
                rustls_pki_types::ServerName::try_from(target.host.clone()).map_err(|e| {
                    RemoteError::BadUrl {
                        url: url.clone(),
                        why: format!("{:?} is not a host name TLS can check ({e})", target.host),
                    }
                })?;
            let handshake = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
            let stream = tokio::time::timeout_at(deadline, handshake)
                .await
                .map_err(|_| timeout("in the TLS handshake"))?
                .map_err(|e| RemoteError::Tls {
                    url: url.clone(),
                    why: tls_reason(&e, &target.host),
                })?;
            Box::new(stream)
        }
    };
    let mut request = (&target.uri)
        .into_client_request()
        .map_err(|e| RemoteError::BadUrl {
            url: url.clone(),
            why: e.to_string(),
        })?;
    if let Some(auth) = auth.clone() {
        request.headers_mut().insert(header::AUTHORIZATION, auth);
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let upgrade = tokio_tungstenite::client_async_with_config(request, stream, Some(config));
    match tokio::time::timeout_at(deadline, upgrade).await {
        Err(_) => Err(timeout("upgrading to a WebSocket")),
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(tungstenite::Error::Http(response))) => Err(RemoteError::Refused {
            url,
            status: response.status().as_u16(),
            body: body_shown(response.body().as_deref()),
            hint: refusal_hint(response.status().as_u16(), auth.is_some()),
        }),
        Ok(Err(e)) => Err(RemoteError::NotAcpd {
            url,
            why: e.to_string(),
        }),
    }
}

/// Connects to the first of `addrs` that accepts, else fails with the last one's error.
async fn connect_any(addrs: &[SocketAddr], host: &str) -> Result<TcpStream, RemoteError> {
    let mut last = None;
    for &addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(tcp) => return Ok(tcp),
            Err(source) => last = Some(RemoteError::Connect { addr, source }),
        }
    }
    Err(last.unwrap_or_else(|| RemoteError::Resolve {
        host: host.to_string(),
        source: std::io::Error::other("it has no address"),
    }))
}

/// A failed handshake's reason, from the rustls error inside tokio-rustls's `io::Error`.
fn tls_reason(error: &std::io::Error, host: &str) -> String {
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(e) => tls::refusal(e, host),
        None => format!("the connection broke during it ({error})"),
    }
}

/// `: <body>` for a refusal's body, capped, control characters escaped; empty for none.
fn body_shown(body: Option<&[u8]>) -> String {
    let body = body.unwrap_or_default();
    let text = String::from_utf8_lossy(&body[..body.len().min(BODY_SHOWN)]);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let more = if body.len() > BODY_SHOWN { "…" } else { "" };
    format!(": {}{more}", super::daemon::shown(text))
}

/// What to do about an HTTP refusal of the upgrade.
fn refusal_hint(status: u16, sent_token: bool) -> String {
    let hint = match status {
        401 if !sent_token => {
            "no token was sent: pass --token-file FILE (mode 600) or set $ACPD_TOKEN, with a \
             token from `acpd token create NAME` on the server"
        }
        401 => "the token is unknown, revoked or expired; get a new one with `acpd token create`",
        403 => "this token or origin may not do that here (see the server's words above)",
        404 => "the server has no WebSocket endpoint at that path; acpd serves /acp",
        _ => return String::new(),
    };
    format!("; {hint}")
}

/// `acpd connect --url`: its exit code, the reason on stderr.
pub(super) async fn connect(remote: Remote<'_>) -> u8 {
    match run(&remote).await {
        Ok(code) => code,
        Err(e) => {
            errln!("acpd: {e}");
            e.exit_code()
        }
    }
}

async fn run(remote: &Remote<'_>) -> Result<u8, RemoteError> {
    let target = Target::parse(remote.url)?;
    let auth = authorization(remote.token_file)?;
    let tls = match (target.tls, remote.ca, remote.fingerprint) {
        (false, None, None) => None,
        (false, _, _) => {
            return Err(RemoteError::BadUrl {
                url: remote.url.to_string(),
                why: "--ca and --fingerprint check a TLS certificate, and an http:// URL has \
                      none; use https://"
                    .into(),
            });
        }
        (true, _, Some(pin)) => Some(tls::client_config(&Trust::Pinned(pin))?),
        (true, Some(ca), None) => Some(tls::client_config(&Trust::Ca(ca.to_path_buf()))?),
        (true, None, None) => Some(tls::client_config(&Trust::PublicRoots)?),
    };
    let mut ws = open(&target, auth, tls, remote.within).await?;
    let url = target.uri.to_string();
    if let Some(name) = remote.provider
        && let Err(code) = bridge::choose_provider(&mut ws, name).await
    {
        return Ok(code);
    }
    let (stdin, stdout) = crate::runtime::stdio();
    Ok(match bridge::bridge(ws, stdin, stdout).await {
        bridge::Bridged::Done | bridge::Bridged::EditorGone => 0,
        bridge::Bridged::ServerGone(why) => {
            errln!("acpd: the server at {url} ended the connection: {why}");
            1
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{RemoteError, Target};

    #[test]
    fn a_url_names_the_acp_endpoint_and_plain_http_stays_on_this_machine() {
        let t = Target::parse("https://example.net:8443").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.uri.to_string(), "wss://example.net:8443/acp");
        assert!(t.tls);
        let t = Target::parse("http://[::1]:9/x/acp").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((t.host.as_str(), t.port), ("::1", 9));
        assert_eq!(t.uri.to_string(), "ws://[::1]:9/x/acp");
        assert!(matches!(
            Target::parse("http://192.0.2.1:8080"),
            Err(RemoteError::PlainToRemote { .. })
        ));
        for bad in [
            "ftp://h",
            "https://u:p@h/",
            "https://h/acp?token=acpd_xyz",
            "host:1",
        ] {
            assert!(
                matches!(Target::parse(bad), Err(RemoteError::BadUrl { .. })),
                "{bad}"
            );
        }
    }
}
