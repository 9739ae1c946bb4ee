//! Traffic traces (`trace_dir`, `--trace DIR`): every message on both hops of one run or
//! bridge session, and its child's stderr, as NDJSON in one file per run or session — for the
//! operator who needs to see what an agent and an editor actually said. Off by default; a trace
//! holds prompts and file contents, so the directory is 0700 and each file 0600.
//!
//! A record is `{"ts":"<RFC 3339>","dir":"<hop>","id":"<run or bridge id>","msg":<the JSON
//! message as sent, or a string when it was not JSON>}`. A file is bounded: past
//! [`MAX_FILE`] it is moved to `<name>.1` (replacing the older one) and a new one begun, so the
//! oldest records are dropped first. Writes are buffered and never wait on the disk's answer
//! beyond a memcpy and, now and then, one `write(2)`; a failing disk turns tracing off for that
//! file with one warning, never the session.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How large one trace file grows before it is rotated.
pub const MAX_FILE: u64 = 16 * 1024 * 1024;

/// Which hop a record was seen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    ParentToAcpd,
    AcpdToParent,
    AcpdToChild,
    ChildToAcpd,
    Stderr,
    /// acpd's own note (the session id it minted, how the session ended).
    Acpd,
}

impl Hop {
    pub const fn as_str(self) -> &'static str {
        match self {
            Hop::ParentToAcpd => "parent->acpd",
            Hop::AcpdToParent => "acpd->parent",
            Hop::AcpdToChild => "acpd->child",
            Hop::ChildToAcpd => "child->acpd",
            Hop::Stderr => "stderr",
            Hop::Acpd => "acpd",
        }
    }
}

/// One run's or session's trace file.
pub struct Trace {
    id: String,
    path: PathBuf,
    max: u64,
    file: Mutex<Option<Sink>>,
}

struct Sink {
    out: BufWriter<File>,
    written: u64,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace").field("path", &self.path).finish()
    }
}

fn create(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
}

impl Trace {
    /// Starts `<dir>/<id>.ndjson`; `None` (logged) when it cannot be created.
    pub fn start(dir: &Path, id: &str) -> Option<Arc<Trace>> {
        Self::start_bounded(dir, id, MAX_FILE)
    }

    pub fn start_bounded(dir: &Path, id: &str, max: u64) -> Option<Arc<Trace>> {
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
        let path = dir.join(format!("{id}.ndjson"));
        match made.and_then(|()| create(&path)) {
            Ok(file) => Some(Arc::new(Trace {
                id: id.to_string(),
                path,
                max,
                file: Mutex::new(Some(Sink {
                    out: BufWriter::new(file),
                    written: 0,
                })),
            })),
            Err(e) => {
                tracing::warn!(trace = %path.display(), "cannot write a trace: {e}");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one message: `line` is the JSON text as it went over the wire (without its
    /// newline); a line that is not JSON is kept as a string.
    pub fn record(&self, hop: Hop, line: &[u8]) {
        let msg = match std::str::from_utf8(line) {
            Ok(text) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
                text.to_string()
            }
            Ok(text) => serde_json::Value::String(text.to_string()).to_string(),
            Err(_) => {
                serde_json::Value::String(String::from_utf8_lossy(line).into_owned()).to_string()
            }
        };
        self.write(hop, &msg);
    }

    /// Records a line of the child's stderr, or acpd's own note.
    pub fn note(&self, hop: Hop, text: &str) {
        self.write(
            hop,
            &serde_json::Value::String(text.to_string()).to_string(),
        );
    }

    /// Records a value acpd built (a result, an event).
    pub fn value(&self, hop: Hop, value: &serde_json::Value) {
        self.write(hop, &value.to_string());
    }

    fn write(&self, hop: Hop, msg: &str) {
        let ts = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        let record = format!(
            "{{\"ts\":\"{ts}\",\"dir\":\"{}\",\"id\":{},\"msg\":{msg}}}\n",
            hop.as_str(),
            serde_json::Value::String(self.id.clone())
        );
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sink) = guard.as_mut() else { return };
        if sink.written + record.len() as u64 > self.max
            && let Err(e) = self.rotate(sink)
        {
            tracing::warn!(trace = %self.path.display(), "trace stopped: {e}");
            *guard = None;
            return;
        }
        if let Err(e) = sink.out.write_all(record.as_bytes()) {
            tracing::warn!(trace = %self.path.display(), "trace stopped: {e}");
            *guard = None;
            return;
        }
        sink.written += record.len() as u64;
    }

    /// The current file becomes `<name>.1` (the older one goes) and a new one begins.
    fn rotate(&self, sink: &mut Sink) -> std::io::Result<()> {
        sink.out.flush()?;
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        sink.out = BufWriter::new(create(&self.path)?);
        sink.written = 0;
        Ok(())
    }

    /// Writes what is buffered (also done when the last handle drops).
    pub fn flush(&self) {
        let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sink) = guard.as_mut() {
            let _ = sink.out.flush();
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        self.flush();
    }
}

/// `acpd trace show FILE`: one line per record — time, hop, then the method and id (or a
/// result/error summary) and the message itself, compacted.
pub fn show(path: &Path, out: &mut impl Write) -> std::io::Result<()> {
    let mut rotated = path.as_os_str().to_owned();
    rotated.push(".1");
    let rotated = PathBuf::from(rotated);
    for file in [rotated.as_path(), path] {
        let Ok(text) = std::fs::read_to_string(file) else {
            if file == path {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{}: no such trace", path.display()),
                ));
            }
            continue;
        };
        for line in text.lines() {
            writeln!(out, "{}", readable(line))?;
        }
    }
    Ok(())
}

/// One record, readably.
pub fn readable(line: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_rotate_and_show() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trace::start_bounded(&dir.path().join("traces"), "run-1", 400).unwrap();
        t.record(
            Hop::AcpdToChild,
            br#"{"jsonrpc":"2.0","id":0,"method":"initialize"}"#,
        );
        t.record(Hop::ChildToAcpd, b"this is not json");
        t.note(Hop::Stderr, "warming up");
        t.flush();
        let text = std::fs::read_to_string(t.path()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["dir"], "acpd->child");
        assert_eq!(lines[0]["id"], "run-1");
        assert_eq!(lines[0]["msg"]["method"], "initialize");
        assert_eq!(lines[1]["msg"], "this is not json");
        assert_eq!(lines[2]["dir"], "stderr");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(t.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(dir.path().join("traces"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        // Past the bound the file rotates: the newest records stay, both files are bounded.
        for i in 0..40 {
            t.note(Hop::Acpd, &format!("note {i}"));
        }
        t.flush();
        let cur = std::fs::metadata(t.path()).unwrap().len();
        let old = std::fs::metadata(dir.path().join("traces/run-1.ndjson.1"))
            .unwrap()
            .len();
        assert!(cur <= 400 && old <= 400, "{cur} {old}");
        let mut shown = Vec::new();
        show(t.path(), &mut shown).unwrap();
        let shown = String::from_utf8(shown).unwrap();
        assert!(shown.contains("note 39"), "{shown}");
        assert!(
            !shown.contains("initialize"),
            "the oldest records are dropped: {shown}"
        );
        assert!(
            shown
                .lines()
                .all(|l| l.contains("acpd ") || l.contains("stderr"))
        );
    }

    #[test]
    fn readable_names_the_method_and_id() {
        let line = r#"{"ts":"2026-12-01T10:00:00.000001Z","dir":"parent->acpd","id":"s","msg":{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{}}}"#;
        let r = readable(line);
        assert!(
            r.starts_with("10:00:00.000001 parent->acpd session/prompt #3"),
            "{r}"
        );
        let line = r#"{"ts":"2026-12-01T10:00:00Z","dir":"child->acpd","id":"s","msg":{"jsonrpc":"2.0","id":3,"error":{"code":-32000}}}"#;
        assert!(readable(line).contains("error #3"));
        assert!(readable("garbage").starts_with("? garbage"));
    }
}
