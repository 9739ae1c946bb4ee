//! The setup line: what `acpd supervise --setup-stdin` reads before it starts its command —
//! the far cwd, the environment the provider gives its child, and the ladder's graces. It
//! travels in-band on stdin so no secret is ever in an argv and no shell ever sees it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest setup line read (environment values can be long; a line without an end is
/// not waited for forever).
pub(crate) const MAX_SETUP_LINE: usize = 1024 * 1024;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Setup {
    /// Absolute; the far side's working directory for the command.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Added over the far side's allowlisted environment (the provider's `env`, its
    /// `env_passthrough` values as read on the near side, `ACPD_DEPTH`, `ACPD_MAX_DEPTH`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub graces: Option<SetupGraces>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SetupGraces {
    pub eof_ms: u64,
    pub term_ms: u64,
}

impl Setup {
    pub(crate) fn new(
        cwd: PathBuf,
        env: BTreeMap<String, String>,
        graces: (Duration, Duration),
    ) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Setup {
            cwd: Some(cwd),
            env,
            graces: Some(SetupGraces {
                eof_ms: ms(graces.0),
                term_ms: ms(graces.1),
            }),
        }
    }

    /// One JSON line, newline included.
    pub(crate) fn line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        line
    }

    /// Parses a line read from stdin (newline optional); the error says what is wrong,
    /// never what the line held.
    pub(crate) fn parse(line: &[u8]) -> Result<Setup, String> {
        let line = line.trim_ascii_end();
        // serde's derived structs also take a positional array (`[cwd, env, graces]`); the
        // setup line's only form is an object with named keys, at every level.
        let shape: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| format!("bad setup line ({})", json_error_kind(&e)))?;
        let graces = shape.get("graces");
        if !shape.is_object() || graces.is_some_and(|g| !(g.is_object() || g.is_null())) {
            return Err("bad setup line (not a JSON object with named keys)".into());
        }
        let setup: Setup = serde_json::from_slice(line)
            .map_err(|e| format!("bad setup line ({})", json_error_kind(&e)))?;
        if let Some(g) = &setup.graces {
            let ceiling = crate::durations::CEILING.as_millis();
            if u128::from(g.eof_ms.max(g.term_ms)) > ceiling {
                return Err(format!(
                    "the setup line's graces exceed the ceiling of {}",
                    crate::durations::CEILING_TEXT
                ));
            }
        }
        if let Some(cwd) = &setup.cwd
            && !cwd.is_absolute()
        {
            return Err("the setup line's cwd is not absolute".into());
        }
        if let Some(bad) = setup
            .env
            .iter()
            .find(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
        {
            return Err(format!(
                "the setup line's env has an invalid name or value (name {:?})",
                bad.0
                    .chars()
                    .filter(|c| *c != '\0')
                    .take(64)
                    .collect::<String>()
            ));
        }
        Ok(setup)
    }

    pub(crate) fn graces(&self) -> Option<(Duration, Duration)> {
        self.graces.map(|g| {
            (
                Duration::from_millis(g.eof_ms),
                Duration::from_millis(g.term_ms),
            )
        })
    }
}

/// The kind of JSON error without its message, which may quote the input.
fn json_error_kind(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "unexpected fields or types",
        serde_json::error::Category::Eof => "incomplete JSON",
    }
}
