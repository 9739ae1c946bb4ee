//! One run's or session's trace file: records appended through a buffer, rotated past its
//! bound without ever opening a name someone else could have planted.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::trace_dir::{create_in, open_dir, warn_once};
use super::{Hop, MAX_FILE};

/// One run's or session's trace file.
pub struct Trace {
    id: String,
    /// The trace directory, checked once and held open: every file is made through it.
    dir: OwnedFd,
    /// `<id>.ndjson`, in `dir`.
    name: String,
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

impl Trace {
    /// Starts `<dir>/<id>.ndjson`; `None` (logged) when it cannot be created.
    pub fn start(dir: &Path, id: &str) -> Option<Arc<Trace>> {
        Self::start_bounded(dir, id, MAX_FILE)
    }

    pub fn start_bounded(dir: &Path, id: &str, max: u64) -> Option<Arc<Trace>> {
        let fd = match open_dir(dir) {
            Ok(fd) => fd,
            Err(e) => {
                warn_once(dir, &e);
                return None;
            }
        };
        let name = format!("{id}.ndjson");
        let path = dir.join(&name);
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            tracing::warn!(trace = %path.display(), "cannot write a trace: {id:?} is not a file name");
            return None;
        }
        match create_in(&fd, &name) {
            Ok(file) => Some(Arc::new(Trace {
                id: id.to_string(),
                dir: fd,
                name,
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

    /// The current file becomes `<name>.1` (the older one goes) and a new one takes its name.
    /// The new one is created first at an unguessable name and renamed into place: `rename(2)`
    /// replaces whatever is at a name without following it, so no name another process could
    /// plant a link at is ever opened.
    fn rotate(&self, sink: &mut Sink) -> std::io::Result<()> {
        sink.out.flush()?;
        let fresh = format!(".{}.{}", self.name, uuid::Uuid::new_v4().simple());
        let file = create_in(&self.dir, &fresh)?;
        let old = format!("{}.1", self.name);
        let moved = nix::fcntl::renameat(&self.dir, self.name.as_str(), &self.dir, old.as_str())
            .and_then(|()| {
                nix::fcntl::renameat(&self.dir, fresh.as_str(), &self.dir, self.name.as_str())
            });
        if let Err(e) = moved {
            let _ = nix::unistd::unlinkat(
                &self.dir,
                fresh.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(e.into());
        }
        sink.out = BufWriter::new(file);
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
