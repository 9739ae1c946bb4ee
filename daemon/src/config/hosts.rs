//! The keys that put a provider's command on another host: `host`, `ssh_options`,
//! `remote_acpd`, `launcher` (see `crate::remote`).

use toml::Spanned;

use super::{At, ConfigError, ProviderConfig};

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
) -> Result<Option<crate::remote::Remote>, ConfigError> {
    use crate::remote::{Remote, SshHost, Via};
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
