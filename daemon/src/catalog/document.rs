//! The ACP Registry's document format (the registry repository's FORMAT.md and
//! agent.schema.json): the aggregate `{version, agents: [...]}` or one `agent.json`, each agent
//! with `npx`, `uvx` and per-platform `binary` distributions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::CatalogError;

/// A registry document, reduced to the agents acpd can use.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Document {
    /// The aggregate's `version`; `None` for a lone `agent.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub agents: Vec<Agent>,
    /// Entries left out because they do not follow the format (a bad id or version would
    /// become a path under acpd's data directory; one broken entry must not hide the rest).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// One agent entry (`agent.json`). Unknown keys (icon, authors, …) are ignored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Agent {
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub description: String,
    pub distribution: Distribution,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Distribution {
    /// Per platform key (`linux-x86_64`, `darwin-aarch64`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub binary: BTreeMap<String, BinaryTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npx: Option<Package>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uvx: Option<Package>,
}

/// An `npx` or `uvx` distribution: the package (with an optional version) and its argv/env.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Package {
    pub package: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One platform's archive and the command to run from it once extracted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BinaryTarget {
    /// `.zip`, `.tar.gz`/`.tgz`, `.tar.bz2`/`.tbz2`, else a raw binary.
    pub archive: String,
    /// Relative to the extracted archive (`./agent`, `bin/agent`).
    pub cmd: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Optional hex SHA-256 of the archive, checked when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// How this machine would run an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice<'a> {
    Binary {
        platform: String,
        target: &'a BinaryTarget,
    },
    Npx(&'a Package),
    Uvx(&'a Package),
}

impl Choice<'_> {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Choice::Binary { .. } => "binary",
            Choice::Npx(_) => "npx",
            Choice::Uvx(_) => "uvx",
        }
    }
}

impl Document {
    /// Parses an aggregate (`agents` array) or a lone agent (`id` and `distribution`).
    pub(crate) fn parse(bytes: &[u8], url: &str) -> Result<Document, CatalogError> {
        let bad = |reason: String| CatalogError::Parse {
            url: super::shown(url),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let (version, entries) = match value {
            serde_json::Value::Object(mut map) if map.contains_key("agents") => {
                let version = map
                    .get("version")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
                match map.remove("agents") {
                    Some(serde_json::Value::Array(agents)) => (version, agents),
                    _ => return Err(bad("`agents` is not an array".into())),
                }
            }
            v @ serde_json::Value::Object(_)
                if v.get("id").is_some() && v.get("distribution").is_some() =>
            {
                (None, vec![v])
            }
            _ => {
                return Err(bad(
                    "neither a registry (`agents`) nor an agent.json (`id`, `distribution`)".into(),
                ));
            }
        };
        let mut doc = Document {
            version,
            ..Default::default()
        };
        for (i, entry) in entries.into_iter().enumerate() {
            let label = entry
                .get("id")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| format!("#{i}"));
            match serde_json::from_value::<Agent>(entry)
                .map_err(|e| e.to_string())
                .and_then(|a| a.check().map(|()| a))
            {
                Ok(agent) => doc.agents.push(agent),
                Err(reason) => {
                    tracing::warn!(url = %super::shown(url), entry = %label, "registry entry skipped: {reason}");
                    doc.skipped.push(label);
                }
            }
        }
        Ok(doc)
    }

    pub(crate) fn agent(&self, id: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.id == id)
    }
}

impl Agent {
    /// The id and version name a directory under acpd's data directory: the schema's id
    /// pattern `^[a-z][a-z0-9-]*$`, and a version of `[A-Za-z0-9.+_-]` not starting with `.`.
    fn check(&self) -> Result<(), String> {
        let id_ok = self.id.starts_with(|c: char| c.is_ascii_lowercase())
            && self
                .id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && self.id.len() <= 128;
        if !id_ok {
            return Err(format!("id {:?} is not [a-z][a-z0-9-]*", self.id));
        }
        let version_ok = !self.version.is_empty()
            && self.version.len() <= 128
            && !self.version.starts_with('.')
            && self
                .version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '_' | '-'));
        if !version_ok {
            return Err(format!("version {:?} is not a plain version", self.version));
        }
        let d = &self.distribution;
        if d.binary.is_empty() && d.npx.is_none() && d.uvx.is_none() {
            return Err("no distribution".into());
        }
        Ok(())
    }

    /// The distribution this machine runs: a binary built for `platform`, else `npx`, else
    /// `uvx` — skipping a package runner that `has` says is not installed while another
    /// remains (with neither installed, the first is kept so the spawn names what is missing).
    pub(crate) fn choose(&self, platform: &str, has: impl Fn(&str) -> bool) -> Option<Choice<'_>> {
        let d = &self.distribution;
        if let Some(target) = d.binary.get(platform) {
            return Some(Choice::Binary {
                platform: platform.to_owned(),
                target,
            });
        }
        let runners: Vec<Choice<'_>> = [
            d.npx.as_ref().map(Choice::Npx),
            d.uvx.as_ref().map(Choice::Uvx),
        ]
        .into_iter()
        .flatten()
        .collect();
        runners
            .iter()
            .find(|c| has(c.kind()))
            .or(runners.first())
            .cloned()
    }

    /// The distribution kinds this entry offers, binary platforms named.
    pub(crate) fn offers(&self) -> Vec<String> {
        let d = &self.distribution;
        let mut out: Vec<String> = d.binary.keys().map(|p| format!("binary:{p}")).collect();
        if d.npx.is_some() {
            out.push("npx".into());
        }
        if d.uvx.is_some() {
            out.push("uvx".into());
        }
        out
    }
}

/// The registry's platform key for this machine (`linux-x86_64`, `darwin-aarch64`, …).
pub fn platform() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        os => os,
    };
    format!("{os}-{}", std::env::consts::ARCH)
}
