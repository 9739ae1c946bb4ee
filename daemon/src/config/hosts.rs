//! The keys that put a provider's command on another host: `host`, `ssh_options`,
//! `remote_acpd`, `launcher`, and what they parse into ([`Remote`]); `crate::remote` builds
//! the ssh or launcher argv from it.

use toml::Spanned;

use super::validate::At;
use super::{ConfigError, ProviderConfig};

/// `host` or `launcher` (never both), `ssh_options` only with `host`, `remote_acpd` only
/// with one of them, and neither for a `registry` agent (installed on this host).
pub(super) fn remote(
    provider: &ProviderConfig,
    host: Option<Spanned<String>>,
    ssh_options: Option<Spanned<Vec<Spanned<String>>>>,
    remote_acpd: Option<Spanned<String>>,
    launcher: Option<Spanned<Vec<Spanned<String>>>>,
    key: &dyn Fn(&str) -> String,
    at: &At<'_>,
) -> Result<Option<Remote>, ConfigError> {
    let words = |value: Spanned<Vec<Spanned<String>>>, k: &str| {
        let span = value.span();
        let words: Vec<Spanned<String>> = value.into_inner();
        if let Some(w) = words.iter().find(|w| w.get_ref().contains('\0')) {
            return Err(at(w.span(), &key(k), "arguments must not contain NUL"));
        }
        Ok((
            span,
            words
                .into_iter()
                .map(Spanned::into_inner)
                .collect::<Vec<_>>(),
        ))
    };
    if let (None, Some(o)) = (&host, &ssh_options) {
        return Err(at(o.span(), &key("ssh_options"), "needs `host`"));
    }
    let (span, via) = match (host, launcher) {
        (Some(_), Some(l)) => {
            return Err(at(
                l.span(),
                &key("launcher"),
                "cannot be combined with `host`",
            ));
        }
        (Some(host), None) => {
            let parsed = SshHost::parse(host.get_ref())
                .map_err(|msg| at(host.span(), &key("host"), &msg))?;
            let options = match ssh_options {
                Some(o) => words(o, "ssh_options")?.1,
                None => Vec::new(),
            };
            let via = Via::Ssh {
                host: parsed,
                options,
            };
            (host.span(), via)
        }
        (None, Some(l)) => {
            let (span, argv) = words(l, "launcher")?;
            if argv.first().is_none_or(String::is_empty) {
                let msg = "must be a non-empty array whose first element is the program";
                return Err(at(span, &key("launcher"), msg));
            }
            (span, Via::Launcher(argv))
        }
        (None, None) => {
            if let Some(a) = remote_acpd {
                return Err(at(
                    a.span(),
                    &key("remote_acpd"),
                    "needs `host` or `launcher`",
                ));
            }
            return Ok(None);
        }
    };
    if provider.registry.is_some() {
        let (k, msg) = match via {
            Via::Ssh { .. } => (
                "host",
                "cannot be combined with `registry` (its agent is installed on this host)",
            ),
            Via::Launcher(_) => (
                "launcher",
                "cannot be combined with `registry` (its agent is installed on this host)",
            ),
        };
        return Err(at(span, &key(k), msg));
    }
    let remote_acpd = match remote_acpd {
        Some(a) if a.get_ref().is_empty() || a.get_ref().contains('\0') => {
            return Err(at(
                a.span(),
                &key("remote_acpd"),
                "must be a non-empty path or name",
            ));
        }
        Some(a) => a.into_inner(),
        None => "acpd".to_string(),
    };
    Ok(Some(Remote { via, remote_acpd }))
}

/// How a provider's command reaches its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub via: Via,
    /// The far side's acpd (`remote_acpd`, default `acpd` on the far side's PATH).
    pub remote_acpd: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// `host = "ssh://…"`, with `ssh_options` inserted before the destination.
    Ssh { host: SshHost, options: Vec<String> },
    /// `launcher = [argv…]`: the far command is appended as argv, no shell in between.
    Launcher(Vec<String>),
}

/// `ssh://[user@]host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshHost {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl SshHost {
    /// Parses `ssh://[user@]host[:port][/]` (IPv6 literals in brackets), strictly: every
    /// character of the text is accounted for, so nothing is silently dropped. The
    /// destination becomes one ssh argument, so nothing in it may look like an option or carry
    /// shell syntax. No percent-escapes, paths, queries or fragments.
    pub fn parse(url: &str) -> Result<SshHost, String> {
        let rest = url
            .strip_prefix("ssh://")
            .ok_or("must look like \"ssh://[user@]host[:port]\"")?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (user, hostport) = match rest.split_once('@') {
            Some((user, hp)) => (Some(user), hp),
            None => (None, rest),
        };
        if let Some(user) = user
            && (user.is_empty()
                || user.len() > 64
                || user.starts_with('-')
                || !user
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(format!("bad user name {user:?}"));
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (addr, after) = v6.split_once(']').ok_or("unclosed '[' in the host")?;
            if addr.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("bad IPv6 address {addr:?}"));
            }
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or_else(|| {
                    format!("unexpected {after:?} after the IPv6 address (only \":PORT\")")
                })?),
            };
            (addr.to_string(), port)
        } else {
            let (host, port) = match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            };
            // DNS labels or an IPv4 address: [A-Za-z0-9_-] labels, none empty, none led by
            // '-' (so the whole never reads as an option), one trailing dot allowed.
            let labels = host.strip_suffix('.').unwrap_or(host);
            let host_ok = !labels.is_empty()
                && host.len() <= 253
                && labels.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && !l.starts_with('-')
                        && l.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                });
            if !host_ok {
                return Err(format!("bad host name {host:?}"));
            }
            (host.to_string(), port)
        };
        let port = match port {
            None => None,
            Some(p) => Some(
                Some(p)
                    .filter(|p| {
                        !p.is_empty()
                            && p.len() <= 5
                            && !p.starts_with('0')
                            && p.bytes().all(|b| b.is_ascii_digit())
                    })
                    .and_then(|p| p.parse::<u16>().ok())
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("bad port {p:?} (1 to 65535)"))?,
            ),
        };
        Ok(SshHost {
            user: user.map(str::to_string),
            host,
            port,
        })
    }

    /// `[user@]host[:port]`, as the diagnostic and logs name it.
    pub fn display(&self) -> String {
        let mut s = String::new();
        if let Some(u) = &self.user {
            s.push_str(u);
            s.push('@');
        }
        if self.host.contains(':') {
            s.push_str(&format!("[{}]", self.host));
        } else {
            s.push_str(&self.host);
        }
        if let Some(p) = self.port {
            s.push_str(&format!(":{p}"));
        }
        s
    }
}

impl Remote {
    /// What errors call the far side: the ssh destination, or the launcher's program.
    pub fn target(&self) -> String {
        match &self.via {
            Via::Ssh { host, .. } => host.display(),
            Via::Launcher(argv) => argv.first().cloned().unwrap_or_default(),
        }
    }
}
