//! The network face's keys (`listen`, TLS files, `allowed_origins` and the limits of remote
//! connections): checked here so a listener that would serve without TLS beyond this machine is
//! a config error, never a start that quietly exposes sessions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::ConfigError;
use super::schema::RawConfig;
use super::validate::{At, at_least_one, parse_duration};

/// One network listener: `https://IP:PORT`, or `http://` on a loopback address (development).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenUrl {
    pub addr: SocketAddr,
    pub tls: bool,
}

impl std::fmt::Display for ListenUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.addr)
    }
}

impl std::str::FromStr for ListenUrl {
    type Err = String;

    /// An IP address and a port, never a host name: nothing is resolved, so what is bound is
    /// what the operator wrote.
    fn from_str(text: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!(
                "must be a URL like \"https://0.0.0.0:8443\" (or \"http://127.0.0.1:8080\" for \
                 local development), got {text:?}"
            ));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let addr: SocketAddr = rest.parse().map_err(|_| {
            format!(
                "must name an IP address and a port like \"https://0.0.0.0:8443\" or \
                 \"https://[::]:8443\" (host names are not resolved), got {text:?}"
            )
        })?;
        if !tls && !addr.ip().is_loopback() {
            return Err(format!(
                "{text:?} would serve sessions without TLS beyond this machine; use \
                 \"https://{addr}\" with tls_cert and tls_key, or bind 127.0.0.1 for local \
                 development"
            ));
        }
        Ok(ListenUrl { addr, tls })
    }
}

/// The network face: where it listens, its certificate, and what one remote peer may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub listen: Vec<ListenUrl>,
    /// PEM certificate chain; `None`: `$CREDENTIALS_DIRECTORY/tls_cert` (systemd) if present.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key; `None`: `$CREDENTIALS_DIRECTORY/tls_key` (systemd) if present.
    pub tls_key: Option<PathBuf>,
    /// Browser origins allowed to open `/acp` (an `Origin` header not listed is refused 403).
    pub allowed_origins: Vec<String>,
    /// Network connections (HTTP or WebSocket ACP connections) at once, all tokens together.
    pub max_network_connections: usize,
    /// ACP connections one token may hold at once.
    pub max_connections_per_token: usize,
    /// How long a client may take to send a request's headers (slowloris).
    pub http_header_timeout: Duration,
    /// How long a connection may go without a message or a keep-alive answer before it is closed.
    pub http_idle_timeout: Duration,
    /// How often an idle SSE stream gets a comment and a WebSocket a ping.
    pub http_keepalive: Duration,
    /// Requests one token may make per second (a burst of as many is allowed).
    pub requests_per_second: u32,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            listen: Vec::new(),
            tls_cert: None,
            tls_key: None,
            allowed_origins: Vec::new(),
            max_network_connections: 256,
            max_connections_per_token: 16,
            http_header_timeout: Duration::from_secs(10),
            http_idle_timeout: Duration::from_secs(300),
            http_keepalive: Duration::from_secs(15),
            requests_per_second: 50,
        }
    }
}

/// The raw network keys, taken out of the file's table.
#[derive(Default)]
pub(super) struct RawNetwork {
    pub(super) listen: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) tls_cert: Option<Spanned<String>>,
    pub(super) tls_key: Option<Spanned<String>>,
    pub(super) allowed_origins: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) max_network_connections: Option<Spanned<usize>>,
    pub(super) max_connections_per_token: Option<Spanned<usize>>,
    pub(super) http_header_timeout: Option<Spanned<String>>,
    pub(super) http_idle_timeout: Option<Spanned<String>>,
    pub(super) http_keepalive: Option<Spanned<String>>,
    pub(super) requests_per_second: Option<Spanned<usize>>,
}

impl RawNetwork {
    pub(super) fn take(raw: &mut RawConfig) -> RawNetwork {
        RawNetwork {
            listen: raw.listen.take(),
            tls_cert: raw.tls_cert.take(),
            tls_key: raw.tls_key.take(),
            allowed_origins: raw.allowed_origins.take(),
            max_network_connections: raw.max_network_connections.take(),
            max_connections_per_token: raw.max_connections_per_token.take(),
            http_header_timeout: raw.http_header_timeout.take(),
            http_idle_timeout: raw.http_idle_timeout.take(),
            http_keepalive: raw.http_keepalive.take(),
            requests_per_second: raw.requests_per_second.take(),
        }
    }
}

pub(super) fn build(raw: RawNetwork, at: &At<'_>) -> Result<NetworkConfig, ConfigError> {
    let mut net = NetworkConfig::default();
    if let Some(list) = raw.listen {
        for url in list.into_inner() {
            let parsed = url
                .get_ref()
                .parse()
                .map_err(|m: String| at(url.span(), "listen", &m))?;
            net.listen.push(parsed);
        }
    }
    for (value, key, slot) in [
        (raw.tls_cert, "tls_cert", &mut net.tls_cert),
        (raw.tls_key, "tls_key", &mut net.tls_key),
    ] {
        if let Some(path) = value {
            if !std::path::Path::new(path.get_ref()).is_absolute() {
                let msg = format!("must be an absolute path, got {:?}", path.get_ref());
                return Err(at(path.span(), key, &msg));
            }
            *slot = Some(PathBuf::from(path.into_inner()));
        }
    }
    if net.tls_cert.is_some() != net.tls_key.is_some() {
        let key = if net.tls_cert.is_some() {
            "tls_key"
        } else {
            "tls_cert"
        };
        return Err(at(
            0..0,
            key,
            "tls_cert and tls_key go together: set both (the certificate chain and its key)",
        ));
    }
    if let Some(origins) = raw.allowed_origins {
        for origin in origins.into_inner() {
            let o = origin.get_ref();
            if !(o.starts_with("https://") || o.starts_with("http://")) || o.ends_with('/') {
                let msg = format!(
                    "must be an origin like \"https://app.example\" (scheme, host, optional \
                     port, no path), got {o:?}"
                );
                return Err(at(origin.span(), "allowed_origins", &msg));
            }
            net.allowed_origins.push(origin.into_inner());
        }
    }
    if let Some(n) = raw.max_network_connections {
        net.max_network_connections = at_least_one(n, "max_network_connections", at)?;
    }
    if let Some(n) = raw.max_connections_per_token {
        net.max_connections_per_token = at_least_one(n, "max_connections_per_token", at)?;
    }
    if let Some(n) = raw.requests_per_second {
        let n = at_least_one(n, "requests_per_second", at)?;
        net.requests_per_second = u32::try_from(n).unwrap_or(u32::MAX);
    }
    for (value, key, slot) in [
        (
            raw.http_header_timeout,
            "http_header_timeout",
            &mut net.http_header_timeout,
        ),
        (
            raw.http_idle_timeout,
            "http_idle_timeout",
            &mut net.http_idle_timeout,
        ),
        (
            raw.http_keepalive,
            "http_keepalive",
            &mut net.http_keepalive,
        ),
    ] {
        if let Some(text) = value {
            let d = parse_duration(&text, key, at)?;
            if d.is_zero() {
                return Err(at(text.span(), key, "must be longer than 0s"));
            }
            *slot = d;
        }
    }
    Ok(net)
}
