//! `acpd trace show`: a trace (and its rotated older half) read back one line per record,
//! with whatever a peer wrote escaped so it cannot drive the terminal.

use std::fs::File;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use crate::private_fs::Links;

/// Why `acpd trace show` printed nothing (or stopped).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShowError {
    #[error("{}: no such trace", .0.display())]
    NoSuchTrace(PathBuf),
    #[error("cannot read the trace {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

/// `acpd trace show FILE`: one line per record — time, hop, then the method and id (or a
/// result/error summary) and the message itself, compacted. A line that is not UTF-8 is read
/// lossily, and what a child or a parent wrote is printed with its control characters escaped:
/// the terminal gets one printable line per record, never an escape sequence from a peer.
pub(crate) fn show(path: &Path, out: &mut impl Write) -> Result<(), ShowError> {
    let mut rotated = path.as_os_str().to_owned();
    rotated.push(".1");
    let rotated = PathBuf::from(rotated);
    for file in [rotated.as_path(), path] {
        let reader = match open_trace(file) {
            Ok(reader) => reader,
            Err(e) if file != path => {
                // No older half: only the current file.
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(ShowError::Read {
                        path: file.to_path_buf(),
                        source: e,
                    });
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ShowError::NoSuchTrace(path.to_path_buf()));
            }
            Err(source) => {
                return Err(ShowError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let mut reader = std::io::BufReader::new(reader);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(|source| ShowError::Read {
                    path: file.to_path_buf(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            }
            let text = String::from_utf8_lossy(&line);
            writeln!(out, "{}", readable(&text)).map_err(ShowError::Stdout)?;
        }
    }
    Ok(())
}

/// A trace file for reading: a regular file only (a FIFO would block the read, a device
/// never end); `O_NONBLOCK` keeps the open itself from waiting on a FIFO.
fn open_trace(path: &Path) -> std::io::Result<File> {
    crate::private_fs::open_regular(path, Links::Follow).map_err(std::io::Error::from)
}

/// `text` with every control character (C0, DEL, C1) and bidirectional-override character
/// escaped, so a peer's text cannot move the cursor, retitle the window, ring, erase or
/// reorder what the terminal shows.
pub(crate) fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    escape_unless(text, |_| false)
}

/// [`escape_controls`] keeping line breaks and tabs: an agent's text as a terminal may show
/// it, its lines kept, and no escape sequence of the agent's (a title, the clipboard through
/// OSC 52, a cleared screen) reaching the terminal.
pub(crate) fn escape_controls_keeping_lines(text: &str) -> std::borrow::Cow<'_, str> {
    escape_unless(text, |c| matches!(c, '\n' | '\t'))
}

fn escape_unless(text: &str, keep: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        !keep(c)
            && (c.is_control()
                || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if !unsafe_char(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// One record, readably, with its control characters escaped ([`escape_controls`]).
pub(crate) fn readable(line: &str) -> String {
    escape_controls(&readable_raw(line)).into_owned()
}

fn readable_raw(line: &str) -> String {
    let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
        return format!("? {line}");
    };
    let ts = r["ts"].as_str().unwrap_or("?");
    // The time of day is enough to read a trace; the date is in the first record.
    let time = ts.split('T').nth(1).unwrap_or(ts).trim_end_matches('Z');
    let dir = r["dir"].as_str().unwrap_or("?");
    let msg = &r["msg"];
    let what = match (msg.get("method"), msg.get("id")) {
        (Some(m), Some(id)) => format!("{} #{id}", m.as_str().unwrap_or("?")),
        (Some(m), None) => m.as_str().unwrap_or("?").to_string(),
        (None, Some(id)) if msg.get("error").is_some() => format!("error #{id}"),
        (None, Some(id)) => format!("result #{id}"),
        _ => String::new(),
    };
    let body = match msg {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!("{time} {dir:<12} {what:<28} {body}")
}
