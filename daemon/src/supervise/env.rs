//! The child environment: an allowlist, never a scrub. Nothing of acpd's own environment reaches
//! a child unless it is on this list or the provider passes it through by name.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// Variables every child gets from acpd's environment (and their lowercase forms), plus `LC_*`.
const ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "TZ",
    "TMPDIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

pub(crate) use acpd_protocol::subagent::{DEPTH_VAR, MAX_DEPTH_VAR};

fn allowed(name: &str) -> bool {
    name.starts_with("LC_")
        || ALLOWED
            .iter()
            .any(|a| *a == name || a.to_ascii_lowercase() == name)
}

/// Builds a child's environment from `ambient` (acpd's own), in increasing precedence: the
/// allowlist, the provider's `env_passthrough` names, the provider's `env`, then the depth pair.
pub(crate) fn child_env(
    ambient: impl IntoIterator<Item = (OsString, OsString)>,
    passthrough: &[String],
    extra: &BTreeMap<String, String>,
    depth: u32,
    max_depth: u32,
) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
    for (k, v) in ambient {
        let Some(name) = k.to_str() else { continue };
        if allowed(name) || passthrough.iter().any(|p| p == name) {
            env.insert(k, v);
        }
    }
    for (k, v) in extra {
        env.insert(k.into(), v.into());
    }
    env.insert(DEPTH_VAR.into(), depth.to_string().into());
    env.insert(MAX_DEPTH_VAR.into(), max_depth.to_string().into());
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(env: &'a [(OsString, OsString)], k: &str) -> Option<&'a str> {
        env.iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.to_str())
    }

    #[test]
    fn only_allowlisted_passthrough_and_explicit_names_survive() {
        let ambient = [
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("https_proxy", "p"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("NOTIFY_SOCKET", "/run/n"),
            ("ACPD_DEPTH", "7"),
            ("GIT_DIR", "/parent/.git"),
            ("GIT_WORK_TREE", "/parent"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let extra = BTreeMap::from([("MODE".to_string(), "fast".to_string())]);
        let env = child_env(ambient, &["OPENAI_API_KEY".into()], &extra, 2, 3);
        assert_eq!(get(&env, "PATH"), Some("/bin"));
        assert_eq!(get(&env, "LC_ALL"), Some("C"));
        assert_eq!(get(&env, "https_proxy"), Some("p"));
        assert_eq!(get(&env, "OPENAI_API_KEY"), Some("sk-secret"));
        assert_eq!(get(&env, "MODE"), Some("fast"));
        assert_eq!(get(&env, "AWS_SECRET_ACCESS_KEY"), None);
        assert_eq!(get(&env, "NOTIFY_SOCKET"), None);
        // A child in a worktree must not be pointed back at the parent's repository.
        assert_eq!(get(&env, "GIT_DIR"), None);
        assert_eq!(get(&env, "GIT_WORK_TREE"), None);
        assert_eq!(get(&env, "ACPD_DEPTH"), Some("2"));
        assert_eq!(get(&env, "ACPD_MAX_DEPTH"), Some("3"));
    }
}
