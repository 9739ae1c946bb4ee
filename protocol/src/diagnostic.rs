//! The safe diagnostic: one line built only from fixed facts (stage, category, stop reason, exit
//! code, signal, error code, advertised and configured auth method ids, env var names), never from stderr,
//! paths, env values or prompt text, and bounded to 4096 bytes.

use crate::subagent::Failure;

pub const MAX_DIAGNOSTIC_BYTES: usize = 4096;
const TRUNCATED: &str = "\n[diagnostic truncated]";

/// The facts a diagnostic may carry.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    pub provider: &'a str,
    pub failure: Option<&'a Failure>,
    /// The child's own stop reason (`end_turn`, …), when it gave one.
    pub stop_reason: Option<&'a str>,
    /// The auth method ids the agent advertised.
    pub auth_methods: &'a [String],
    /// The provider's configured `auth_method`, when it is part of the failure.
    pub auth_method: Option<&'a str>,
    /// Environment variable names (never values) that would satisfy the auth methods.
    pub env_names: &'a [String],
    /// acpd's own fixed remarks, such as a permission fallback.
    pub notes: &'a [&'static str],
    /// The ssh destination of a remote provider (`[user@]host[:port]`, from its config).
    pub host: Option<&'a str>,
    /// The launcher program of a `launcher` provider.
    pub launcher: Option<&'a str>,
}

/// `Subagent failure (provider: P; stage: S; category: C; stop reason: R; exit code: N; signal:
/// S)` with absent facts left out.
pub fn build(facts: &Facts<'_>) -> String {
    let mut parts: Vec<String> = vec![format!("provider: {}", token(facts.provider))];
    if let Some(host) = facts.host {
        parts.push(format!("host: {}", host_token(host)));
    }
    if let Some(launcher) = facts.launcher {
        parts.push(format!(
            "launcher: {}",
            token(launcher.rsplit('/').next().unwrap_or(launcher))
        ));
    }
    if let Some(f) = facts.failure {
        parts.push(format!("stage: {}", f.stage.as_str()));
        parts.push(format!("category: {}", token(f.category.as_str())));
    }
    if let Some(r) = facts.stop_reason {
        parts.push(format!("stop reason: {}", token(r)));
    }
    if let Some(f) = facts.failure {
        if let Some(code) = f.code {
            parts.push(format!("error code: {code}"));
        }
        if let Some(code) = f.exit_code {
            parts.push(format!("exit code: {code}"));
        }
        if let Some(sig) = &f.signal {
            parts.push(format!("signal: {}", token(sig)));
        }
    }
    if !facts.auth_methods.is_empty() {
        let ids: Vec<String> = facts.auth_methods.iter().map(|m| token(m)).collect();
        parts.push(format!("auth methods: {}", ids.join(", ")));
    }
    if let Some(wanted) = facts.auth_method {
        parts.push(format!("configured auth_method: {}", token(wanted)));
    }
    if !facts.env_names.is_empty() {
        let names: Vec<String> = facts.env_names.iter().map(|m| token(m)).collect();
        parts.push(format!("env: {}", names.join(", ")));
    }
    for note in facts.notes {
        parts.push((*note).to_string());
    }
    limit(format!("Subagent failure ({})", parts.join("; ")))
}

/// Child- or config-supplied identifiers reduced to `[A-Za-z0-9_.-]`, at most 64 bytes, so no
/// free text can ride along.
fn token(raw: &str) -> String {
    let s: String = raw
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(64)
        .collect();
    if s.is_empty() { "?".into() } else { s }
}

/// A host as config wrote it, reduced like [`token`] but keeping what `user@host:port` and
/// `[v6]` need.
fn host_token(raw: &str) -> String {
    let s: String = raw
        .chars()
        .filter(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '@' | ':' | '[' | ']')
        })
        .take(128)
        .collect();
    if s.is_empty() { "?".into() } else { s }
}

/// Caps `text` at [`MAX_DIAGNOSTIC_BYTES`], cutting on a UTF-8 boundary and marking the cut.
pub fn limit(text: String) -> String {
    if text.len() <= MAX_DIAGNOSTIC_BYTES {
        return text;
    }
    let mut out = crate::utf8::head(&text, MAX_DIAGNOSTIC_BYTES - TRUNCATED.len()).to_string();
    out.push_str(TRUNCATED);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subagent::{Category, Stage};
    use proptest::prelude::*;

    #[test]
    fn formats_present_facts_in_order() {
        let f = Failure {
            stage: Stage::Prompt,
            category: Category::ProcessExit,
            code: None,
            exit_code: Some(3),
            signal: None,
        };
        let d = build(&Facts {
            provider: "echo",
            failure: Some(&f),
            ..Default::default()
        });
        assert_eq!(
            d,
            "Subagent failure (provider: echo; stage: prompt; category: process-exit; exit code: 3)"
        );
    }

    #[test]
    fn names_the_far_side_without_free_text() {
        let f = Failure {
            stage: Stage::Spawn,
            category: Category::Unreachable,
            code: None,
            exit_code: Some(255),
            signal: None,
        };
        let d = build(&Facts {
            provider: "far",
            failure: Some(&f),
            host: Some("root@[::1]:2222; rm -rf /"),
            notes: &["unreachable: the host refused the connection"],
            ..Default::default()
        });
        assert_eq!(
            d,
            "Subagent failure (provider: far; host: root@[::1]:2222rm-rf; stage: spawn; \
             category: unreachable; exit code: 255; unreachable: the host refused the connection)"
        );
        let d = build(&Facts {
            provider: "pod",
            launcher: Some("/usr/local/bin/kubectl"),
            ..Default::default()
        });
        assert_eq!(d, "Subagent failure (provider: pod; launcher: kubectl)");
    }

    #[test]
    fn child_supplied_text_cannot_smuggle_content() {
        let f = Failure {
            stage: Stage::Prompt,
            category: Category::UnknownStopReason,
            code: None,
            exit_code: None,
            signal: None,
        };
        let d = build(&Facts {
            provider: "echo",
            failure: Some(&f),
            stop_reason: Some("secret prompt text /home/me; key=VALUE"),
            ..Default::default()
        });
        assert!(!d.contains(' ') || !d.contains("secret prompt"));
        assert!(!d.contains('/'));
        assert!(!d.contains('='));
    }

    #[test]
    fn auth_facts_name_methods_and_env_names_only() {
        let f = Failure {
            stage: Stage::Initialize,
            category: Category::Auth,
            code: None,
            exit_code: None,
            signal: None,
        };
        let d = build(&Facts {
            provider: "codex",
            failure: Some(&f),
            auth_methods: &["api-key".into(), "chatgpt".into()],
            auth_method: Some("oauth"),
            env_names: &["CODEX_API_KEY".into(), "OPENAI_API_KEY".into()],
            ..Default::default()
        });
        assert_eq!(
            d,
            "Subagent failure (provider: codex; stage: initialize; category: auth; auth methods: \
             api-key, chatgpt; configured auth_method: oauth; env: CODEX_API_KEY, OPENAI_API_KEY)"
        );
    }

    proptest! {
        #[test]
        fn limit_is_bounded_and_on_a_char_boundary(s in "\\PC{0,3000}") {
            let big = s.repeat(3);
            let out = limit(big.clone());
            prop_assert!(out.len() <= MAX_DIAGNOSTIC_BYTES);
            if big.len() <= MAX_DIAGNOSTIC_BYTES {
                prop_assert_eq!(out, big);
            } else {
                prop_assert!(out.ends_with(TRUNCATED));
                prop_assert!(big.starts_with(out.trim_end_matches(TRUNCATED)));
            }
        }

        #[test]
        fn build_is_bounded(names in proptest::collection::vec("\\PC{0,200}", 0..100)) {
            let d = build(&Facts { provider: "p", env_names: &names, auth_methods: &names, ..Default::default() });
            prop_assert!(d.len() <= MAX_DIAGNOSTIC_BYTES);
        }
    }
}
