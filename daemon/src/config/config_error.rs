//! [`ConfigError`], and how an error is pointed at its dotted key and 1-based line.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::validate::only;

/// Everything that can go wrong finding, reading or validating the config.
///
/// Each variant carries the file path so the operator knows which file to fix
/// even when several candidate locations exist.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file was named explicitly (flag or `ACPD_CONFIG`) but is absent;
    /// silently falling back to defaults would hide a typo.
    #[error("{}: config file named by {origin} does not exist; create it (`acpd init` writes one) or name another", path.display())]
    Missing { path: PathBuf, origin: &'static str },
    #[error("{}: cannot read config file: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// Another user could replace the file, and acpd would run the commands it names.
    #[error("{}: refused: {reason}", path.display())]
    Untrusted { path: PathBuf, reason: String },
    /// `line` is 1-based; `None` only if TOML reported no position at all. `text` is that
    /// line as the file has it, shown under the error.
    #[error("{}:{}: {key}: {message}{}", path.display(), line.map_or_else(|| "?".to_owned(), |l| l.to_string()), shown_line(*line, text.as_deref()))]
    Invalid {
        path: PathBuf,
        line: Option<usize>,
        key: String,
        message: String,
        text: Option<String>,
    },
}

impl ConfigError {
    /// The config file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Missing { path, .. }
            | ConfigError::Read { path, .. }
            | ConfigError::Untrusted { path, .. }
            | ConfigError::Invalid { path, .. } => path,
        }
    }

    /// With `text` set to the offending line of `source`, the file's text.
    pub(super) fn with_line_of(mut self, source: &str) -> ConfigError {
        if let ConfigError::Invalid {
            line: Some(line),
            text,
            ..
        } = &mut self
            && text.is_none()
        {
            *text = source.lines().nth(*line - 1).map(str::to_owned);
        }
        self
    }
}

/// The most of the offending line shown.
const SHOWN_LINE: usize = 120;

/// `\n  3 | preest = "claude"`: the line under its error, cut and with control characters
/// escaped (a config is the operator's, but a stray one would still reach a terminal).
fn shown_line(line: Option<usize>, text: Option<&str>) -> String {
    let (Some(line), Some(text)) = (line, text) else {
        return String::new();
    };
    let mut shown: String = text
        .trim_end()
        .chars()
        .take(SHOWN_LINE)
        .flat_map(|c| match c {
            '\t' => vec![' '],
            c if c.is_control() => c.escape_default().collect(),
            c => vec![c],
        })
        .collect();
    if text.trim_end().chars().count() > SHOWN_LINE {
        shown.push('…');
    }
    format!("\n  {line} | {shown}")
}

/// Renders one key of a dotted path, quoting it when TOML would need quotes.
pub(super) fn key_segment(key: &str) -> String {
    let bare = only(key, "_-");
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// 1-based line number of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Converts a TOML syntax or deserialization error, recovering the dotted key.
///
/// `toml` keeps the key path private but prints it as "in `a.b`" when no input
/// is attached, so it is read back from that rendering. Unknown-field errors
/// name the offending field only in the message. Syntax errors carry no path,
/// so the key is reconstructed from the source line as a best effort.
pub(super) fn toml_error(path: &Path, text: &str, err: &toml::de::Error) -> ConfigError {
    let mut bare = err.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    let table = shown
        .strip_prefix(err.message())
        .and_then(|rest| rest.trim().strip_prefix("in `"))
        .and_then(|rest| rest.strip_suffix('`'))
        .map(str::to_owned);
    let unknown = err
        .message()
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next());
    let offset = err.span().map(|s| s.start);
    let key = match (table, unknown) {
        (Some(table), Some(field)) => format!("{table}.{field}"),
        (Some(table), None) => table,
        (None, Some(field)) => field.to_owned(),
        (None, None) => offset.map_or_else(|| "(document)".to_owned(), |o| key_near(text, o)),
    };
    let message = match unknown {
        Some(field) => unknown_key(field, err.message()),
        None => err.message().replace('\n', " "),
    };
    ConfigError::Invalid {
        path: path.to_path_buf(),
        line: offset.map(|o| line_of(text, o)),
        key,
        message,
        text: None,
    }
}

/// serde's "unknown field `preest`, expected one of `command`, …" as one suggestion instead
/// of every name.
fn unknown_key(field: &str, serde_message: &str) -> String {
    let known: Vec<&str> = serde_message
        .split_once("expected")
        .map(|(_, list)| list.split('`').skip(1).step_by(2).collect())
        .unwrap_or_default();
    match super::suggest::did_you_mean(field, known) {
        Some(hint) => format!("unknown key {field:?}; {hint}"),
        None => format!(
            "unknown key {field:?}: acpd reads no such key here (remove it, or check its \
             spelling against the configuration reference)"
        ),
    }
}

/// Best-effort dotted key for a syntax error at `offset`: a table header on
/// that line, else the key left of `=` inside the enclosing table.
fn key_near(text: &str, offset: usize) -> String {
    let line_index = line_of(text, offset) - 1;
    let lines: Vec<&str> = text.lines().collect();
    let Some(line) = lines.get(line_index) else {
        return "(document)".to_owned();
    };
    if let Some(header) = table_header(line) {
        return header.to_owned();
    }
    let enclosing = lines[..line_index]
        .iter()
        .rev()
        .find_map(|l| table_header(l));
    let local = line
        .split('=')
        .next()
        .map(str::trim)
        .filter(|k| looks_like_key(k));
    match (enclosing, local) {
        (Some(table), Some(k)) => format!("{table}.{k}"),
        (None, Some(k)) => k.to_owned(),
        (Some(table), None) => table.to_owned(),
        (None, None) => "(document)".to_owned(),
    }
}

fn table_header(line: &str) -> Option<&str> {
    let line = line.split('#').next()?.trim();
    let inner = line.strip_prefix('[')?.strip_suffix(']')?;
    let inner = inner
        .strip_prefix('[')
        .and_then(|i| i.strip_suffix(']'))
        .unwrap_or(inner);
    let inner = inner.trim();
    looks_like_key(inner).then_some(inner)
}

fn looks_like_key(key: &str) -> bool {
    only(key, "_-.\"' ")
}
