//! Config parsing, validation and discovery, by what the tests cover: a bad value refused
//! with its line (`checks.rs`), the resolved values (`resolved.rs`), where the file is found
//! and how it is read (`discovery.rs`), presets and remote hosts (`expansion.rs`).
use super::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod checks;
mod discovery;
mod expansion;
mod resolved;

const FILE: &str = "/tmp/x/config.toml";
const CODEX: &str = "[providers.codex]\ncommand = [\"codex-acp\"]\n";

fn echo_command() -> Vec<String> {
    vec!["/usr/bin/acpd".into(), "agent".into(), "echo".into()]
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(FILE), echo_command())
}

fn codex(extra: &str) -> String {
    format!("{CODEX}{extra}\n")
}

/// Asserts `text` is rejected with `FILE:line: key: …`, then the offending line under it as
/// `  line | text`, and returns the first line.
fn fails(text: &str, line: usize, key: &str) -> String {
    let err = parse(text).expect_err("should be rejected").to_string();
    let at = format!("{FILE}:{line}: {key}: ");
    assert!(err.starts_with(&at), "{err:?} is not at {at:?}");
    let (first, shown) = err.split_once('\n').unwrap_or((&err, ""));
    let source = text.lines().nth(line - 1).unwrap_or_default().trim_end();
    assert_eq!(shown, format!("  {line} | {source}"), "{err:?}");
    first.to_string()
}
