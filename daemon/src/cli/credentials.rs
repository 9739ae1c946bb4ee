//! Whether a provider's agent would find a credential: one of the variables its auth methods
//! read, in the environment the child gets (acpd's passed-through variables, the provider's
//! `env`, its `env_file`), or the login the agent stores after a terminal login. `acpd doctor`
//! warns and `acpd init` says what to set when none is there. Names only, never values.

use std::collections::BTreeMap;

use crate::config::ProviderConfig;
use crate::config::env_file::Secrets;
use crate::config::presets::{self, AuthHint};

/// What a child of `provider` would see for a variable, from the sources it gets them from.
pub(super) struct ChildView<'a> {
    provider: &'a ProviderConfig,
    secrets: Option<&'a Secrets>,
    ambient: BTreeMap<String, String>,
}

impl<'a> ChildView<'a> {
    /// The view from this process's environment and the provider's env file (already read).
    pub(super) fn new(provider: &'a ProviderConfig, secrets: Option<&'a Secrets>) -> Self {
        ChildView {
            provider,
            secrets,
            ambient: std::env::vars().collect(),
        }
    }

    /// A non-empty value is there (the value itself is never returned to a printer).
    fn is_set(&self, name: &str) -> bool {
        self.value(name).is_some_and(|v| !v.is_empty())
    }

    fn value(&self, name: &str) -> Option<String> {
        if self.secrets.is_some_and(|s| s.is_set(name)) {
            return Some("set".into());
        }
        if let Some(v) = self.provider.env.get(name) {
            return Some(v.clone());
        }
        let passed = self.provider.env_passthrough.iter().any(|p| p == name) || name == "HOME";
        passed.then(|| self.ambient.get(name).cloned()).flatten()
    }
}

/// No credential found: what would satisfy the agent.
#[derive(Debug, PartialEq)]
pub(super) struct Missing {
    /// Variables any of which would do.
    pub names: Vec<&'static str>,
    /// One line per method, for a person.
    pub how: Vec<&'static str>,
}

/// The hints that apply: the preset's methods the agent advertised (or implies without
/// advertising), or by advertised method id without a preset; every method of the preset
/// when nothing was advertised yet (`advertised` is `None`: the agent was not asked).
fn hints(provider: &ProviderConfig, advertised: Option<&[String]>) -> Vec<&'static AuthHint> {
    match (provider.preset.as_deref(), advertised) {
        (Some(preset), None) => presets::auth_hints(preset),
        (Some(preset), Some(ids)) => presets::auth_hints(preset)
            .into_iter()
            .filter(|h| h.method.is_none_or(|m| ids.iter().any(|id| id == m)))
            .collect(),
        (None, Some(ids)) => ids.iter().flat_map(|id| presets::auth_hints(id)).collect(),
        (None, None) => Vec::new(),
    }
}

/// `Some` when the hints name variables and none of them is set, and no stored login of the
/// agent is there. `None` also when acpd cannot tell (no variable is known to satisfy it).
pub(super) fn missing(
    provider: &ProviderConfig,
    advertised: Option<&[String]>,
    view: &ChildView<'_>,
) -> Option<Missing> {
    let hints = hints(provider, advertised);
    let mut names: Vec<&'static str> = Vec::new();
    for name in hints.iter().flat_map(|h| h.env.iter()) {
        if !names.contains(name) {
            names.push(name);
        }
    }
    if names.is_empty() || names.iter().any(|n| view.is_set(n)) {
        return None;
    }
    let login = hints
        .iter()
        .map(|h| h.preset)
        .chain(provider.preset.as_deref())
        .filter_map(presets::stored_login)
        .filter_map(|l| l.path(|k| view.value(k)))
        .any(|p| p.exists());
    if login {
        return None;
    }
    let mut how: Vec<&'static str> = Vec::new();
    for h in &hints {
        if !how.contains(&h.how) {
            how.push(h.how);
        }
    }
    Some(Missing { names, how })
}

impl Missing {
    /// The warning for provider `name`: what to set, and where a daemon takes it from.
    pub(super) fn warning(&self, name: &str) -> String {
        format!(
            "{name} has no credential: {}. For a daemon (acpd serve), put `{}=…` in a file \
             (chmod 600) and name it with env_file in [providers.{name}]",
            self.how.join("; or "),
            self.names.first().copied().unwrap_or("KEY"),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn provider(preset: &str) -> ProviderConfig {
        let ctx = presets::PresetContext::default();
        presets::find(preset).unwrap().provider(preset, &ctx)
    }

    fn view<'a>(
        p: &'a ProviderConfig,
        secrets: Option<&'a Secrets>,
        ambient: &[(&str, &str)],
    ) -> ChildView<'a> {
        ChildView {
            provider: p,
            secrets,
            ambient: ambient
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    #[test]
    fn a_key_in_any_source_or_a_stored_login_satisfies_it() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path().to_str().unwrap();
        let claude = provider("claude");
        let none = missing(&claude, Some(&[]), &view(&claude, None, &[("HOME", h)])).unwrap();
        assert!(none.names.contains(&"ANTHROPIC_API_KEY"), "{none:?}");
        let warning = none.warning("claude");
        assert!(warning.contains("set ANTHROPIC_API_KEY") && warning.contains("env_file"));
        // An empty value is no key; a key acpd does not pass through never reaches the agent.
        let empty = view(&claude, None, &[("HOME", h), ("ANTHROPIC_API_KEY", "")]);
        assert!(missing(&claude, Some(&[]), &empty).is_some());
        let set = view(&claude, None, &[("ANTHROPIC_API_KEY", "k")]);
        assert!(missing(&claude, Some(&[]), &set).is_none());
        let mut custom = provider("claude");
        custom.env_passthrough.clear();
        let unpassed = view(&custom, None, &[("HOME", h), ("ANTHROPIC_API_KEY", "k")]);
        assert!(missing(&custom, Some(&[]), &unpassed).is_some());
        // The env file.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.env");
        std::fs::write(&file, "CLAUDE_CODE_OAUTH_TOKEN=t\n").unwrap();
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&file, private).unwrap();
        let secrets = crate::config::env_file::EnvFile::Path(file).read().unwrap();
        let from_file = view(&claude, Some(&secrets), &[("HOME", h)]);
        assert!(missing(&claude, Some(&[]), &from_file).is_none());
        // A stored login, where the provider's own env points.
        std::fs::create_dir_all(home.path().join(".claude")).unwrap();
        std::fs::write(home.path().join(".claude/.credentials.json"), "{}").unwrap();
        assert!(missing(&claude, Some(&[]), &view(&claude, None, &[("HOME", h)])).is_none());
        let mut elsewhere = provider("claude");
        elsewhere.env.insert(
            "CLAUDE_CONFIG_DIR".into(),
            dir.path().to_str().unwrap().into(),
        );
        let v = view(&elsewhere, None, &[("HOME", h)]);
        assert!(missing(&elsewhere, Some(&[]), &v).is_some());
    }

    #[test]
    fn nothing_is_said_when_no_variable_is_known() {
        let opencode = provider("opencode");
        assert!(missing(&opencode, None, &view(&opencode, None, &[])).is_none());
        let plain = ProviderConfig::with_defaults("x", vec!["x".into()]);
        let ids = ["key".to_string()];
        assert!(missing(&plain, Some(&ids), &view(&plain, None, &[])).is_none());
        // Without a preset, by advertised method id.
        let ids = ["gemini-api-key".to_string()];
        let m = missing(&plain, Some(&ids), &view(&plain, None, &[])).unwrap();
        assert_eq!(m.names, ["GEMINI_API_KEY"]);
        // Codex before it was asked: every method of the preset.
        let codex = provider("codex");
        let m = missing(&codex, None, &view(&codex, None, &[])).unwrap();
        assert_eq!(m.names, ["CODEX_API_KEY", "OPENAI_API_KEY"]);
        assert_eq!(m.how.len(), 2);
    }
}
