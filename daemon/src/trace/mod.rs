//! Traffic traces (`trace_dir`, `--trace DIR`): every message on both hops of one run or
//! bridge session, and its child's stderr, as NDJSON in one file per run or session — for the
//! operator who needs to see what an agent and an editor actually said. Off by default; a trace
//! holds prompts and file contents, so the directory is 0700 and each file 0600.
//!
//! acpd may run as root and the directory is the config's word, so a file is never opened by a
//! name someone else could have planted: the directory must be acpd's uid's own and writable by
//! nobody else (else tracing is off, with a warning), it is held open, and every file is created
//! through that descriptor with `O_CREAT|O_EXCL|O_NOFOLLOW`. A name already taken is never
//! written through: tracing stops for that file, with a warning.
//!
//! A record is `{"ts":"<RFC 3339>","dir":"<hop>","id":"<run or bridge id>","msg":<the JSON
//! message as sent, or a string when it was not JSON>}`. A file is bounded: past
//! [`MAX_FILE`] it is moved to `<name>.1` (replacing the older one) and a new one, created
//! beforehand at an unguessable name, is renamed into its place, so the oldest records are
//! dropped first and no predictable name is ever opened. Writes are buffered and never wait on the disk's answer
//! beyond a memcpy and, now and then, one `write(2)`; a failing disk turns tracing off for that
//! file with one warning, never the session.

use std::fs::File;
use std::io::{BufRead, BufWriter, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

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

/// Why a trace directory is not used.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot create or open it: {0}")]
    Open(std::io::Error),
    #[error("it is not a directory")]
    NotADir,
    #[error(
        "it is owned by uid {owner}, not acpd's uid {own}; another user could read the traces or \
         plant links in it (use a directory of acpd's own, mode 0700)"
    )]
    Owner { owner: u32, own: u32 },
    #[error(
        "it is group- or world-writable (mode {mode:04o}); another user could plant links in it \
         (chmod 0700 it)"
    )]
    Writable { mode: u32 },
    #[error("it is readable by others (mode {0:04o}) and cannot be made 0700: {1}")]
    Private(u32, std::io::Error),
}

/// Opens `dir` (created 0700 when missing) when it is fit to hold traces: a directory owned by
/// acpd's effective uid, writable by no one else; one others can read is made 0700. A link at `dir` is followed only when acpd's
/// uid made it; the directory it reaches is then checked like any other.
pub fn open_dir(dir: &Path) -> Result<OwnedFd, DirError> {
    let own = nix::unistd::geteuid().as_raw();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(DirError::Open)?;
    let link = std::fs::symlink_metadata(dir).map_err(DirError::Open)?;
    if link.file_type().is_symlink() && link.uid() != own {
        return Err(DirError::Owner {
            owner: link.uid(),
            own,
        });
    }
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ENOTDIR => DirError::NotADir,
        e => DirError::Open(e.into()),
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(|e| DirError::Open(e.into()))?;
    if st.st_uid != own {
        return Err(DirError::Owner {
            owner: st.st_uid,
            own,
        });
    }
    let mode = st.st_mode as u32 & 0o7777;
    if mode & 0o022 != 0 {
        return Err(DirError::Writable { mode });
    }
    // Readable or searchable by others (an existing 0755 dir): they would list the file names,
    // which are session and run ids. acpd's uid owns it, so it is made 0700 like the state
    // dir, through the descriptor (never a path someone could swap).
    if mode & 0o077 != 0 {
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))
            .map_err(|e| DirError::Private(mode, e.into()))?;
        tracing::info!(trace_dir = %dir.display(), "trace directory was mode {mode:04o}: made 0700");
    }
    Ok(fd)
}

/// A new file `name` in `dir`, 0600, never through a link nor over anything already there.
fn create_in(dir: &OwnedFd, name: &str) -> std::io::Result<File> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| match e {
        nix::errno::Errno::EEXIST | nix::errno::Errno::ELOOP => std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{name} already exists (not written through)"),
        ),
        e => e.into(),
    })?;
    Ok(File::from(fd))
}

/// Trace directories already warned about: one warning per directory, not one per run.
static WARNED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn warn_once(dir: &Path, e: &DirError) {
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if warned.iter().any(|d| d == dir) {
        return;
    }
    if warned.len() < 64 {
        warned.push(dir.to_path_buf());
    }
    tracing::warn!(trace_dir = %dir.display(), "tracing is off: the trace directory is refused: {e}");
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

/// Why `acpd trace show` printed nothing (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
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
pub fn show(path: &Path, out: &mut impl Write) -> Result<(), ShowError> {
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
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// `text` with every control character (C0, DEL, C1) and bidirectional-override character
/// escaped, so a peer's text cannot move the cursor, retitle the window, ring, erase or
/// reorder what the terminal shows.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    fn unsafe_char(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
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
pub fn readable(line: &str) -> String {
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

    /// A file outside the trace dir that a planted link points at.
    fn victim(dir: &Path) -> PathBuf {
        let v = dir.join("victim");
        std::fs::write(&v, b"precious").unwrap();
        v
    }

    #[test]
    fn a_planted_link_at_a_trace_name_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let traces = tmp.path().join("traces");
        std::fs::create_dir(&traces).unwrap();
        let victim = victim(tmp.path());
        // At the first name, to a file and to nothing: refused, nothing written or created.
        std::os::unix::fs::symlink(&victim, traces.join("run-1.ndjson")).unwrap();
        assert!(Trace::start_bounded(&traces, "run-1", 400).is_none());
        let nothing = tmp.path().join("created-through-a-link");
        std::os::unix::fs::symlink(&nothing, traces.join("run-2.ndjson")).unwrap();
        assert!(Trace::start_bounded(&traces, "run-2", 400).is_none());
        assert!(!nothing.exists());
        // At the rotated name: replaced by the rotation, never followed.
        std::os::unix::fs::symlink(&victim, traces.join("run-3.ndjson.1")).unwrap();
        let t = Trace::start_bounded(&traces, "run-3", 400).unwrap();
        for i in 0..40 {
            t.note(Hop::Acpd, &format!("note {i}"));
            // Planted again after every rotation.
            let next = traces.join("run-3.ndjson.1");
            if !next.exists() {
                let _ = std::os::unix::fs::symlink(&victim, &next);
            }
        }
        t.flush();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let rotated = std::fs::symlink_metadata(traces.join("run-3.ndjson.1")).unwrap();
        assert!(
            rotated.is_file(),
            "the rotated file is a file of acpd's own"
        );
        use std::os::unix::fs::PermissionsExt;
        for name in ["run-3.ndjson", "run-3.ndjson.1"] {
            let mode = std::fs::metadata(traces.join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        // Nothing but the trace and its older half is left in the directory.
        let mut names: Vec<String> = std::fs::read_dir(&traces)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "run-1.ndjson",
                "run-2.ndjson",
                "run-3.ndjson",
                "run-3.ndjson.1"
            ]
        );
    }

    #[test]
    fn a_trace_dir_others_can_write_or_own_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let traces = tmp.path().join("traces");
        std::fs::create_dir(&traces).unwrap();
        for mode in [0o777, 0o770, 0o1777, 0o703] {
            std::fs::set_permissions(&traces, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = open_dir(&traces).unwrap_err();
            assert!(matches!(err, DirError::Writable { .. }), "{mode:o}: {err}");
            assert!(Trace::start(&traces, "run-1").is_none());
        }
        assert_eq!(std::fs::read_dir(&traces).unwrap().count(), 0);
        std::fs::set_permissions(&traces, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            Trace::start(&traces, "run-1").is_some(),
            "read-only for others is used (made private)"
        );
        // A link of acpd's own uid to a fit directory is followed.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&traces, &link).unwrap();
        assert!(Trace::start(&link, "run-2").is_some());
        if nix::unistd::geteuid().is_root() {
            let other = nix::unistd::Uid::from_raw(65534);
            nix::unistd::chown(&traces, Some(other), None).unwrap();
            let err = open_dir(&traces).unwrap_err();
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
            assert!(Trace::start(&link, "run-3").is_none());
        } else {
            eprintln!("SKIPPED: the other-owner case needs root to chown");
        }
    }

    /// Hostile review of issue 18: an existing trace dir of acpd's uid that others can read
    /// (0755, 0750, 0701) let them list the file names, which are session and run ids; it is
    /// made 0700 when acpd opens it.
    #[test]
    fn a_trace_dir_others_can_read_is_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let traces = tmp.path().join("traces");
        std::fs::create_dir(&traces).unwrap();
        for mode in [0o755, 0o750, 0o701, 0o705] {
            std::fs::set_permissions(&traces, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(Trace::start(&traces, "run-1").is_some(), "{mode:o}");
            let now = std::fs::metadata(&traces).unwrap().permissions().mode() & 0o7777;
            assert_eq!(now, 0o700, "a {mode:o} trace dir was left {now:o}");
            std::fs::remove_file(traces.join("run-1.ndjson")).unwrap();
        }
    }

    #[test]
    fn show_reads_bytes_lossily_and_escapes_control_characters() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t.ndjson");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(
            br#"{"ts":"2026-12-01T10:00:00Z","dir":"stderr","id":"r","msg":"\u001b]0;pwned\u0007\r\u001b[2Jgone"}"#,
        );
        bytes.push(b'\n');
        bytes.extend_from_slice(b"\xff\xfe not utf-8 \x1b[31m red\n");
        bytes.extend_from_slice(
            "{\"ts\":\"2026-12-01T10:00:01Z\",\"dir\":\"child->acpd\",\"id\":\"r\",\"msg\":{\"method\":\"x\\u009b\u{202e}y\"}}\n"
                .as_bytes(),
        );
        std::fs::write(&path, &bytes).unwrap();
        let mut out = Vec::new();
        show(&path, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(
            lines[0].ends_with("\\u{1b}]0;pwned\\u{7}\\r\\u{1b}[2Jgone"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("? \u{fffd}\u{fffd} not utf-8 \\u{1b}[31m red"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("x\\u{9b}\\u{202e}y"), "{}", lines[2]);
        // A missing trace is still named as such; a directory is not a trace.
        let missing = show(&tmp.path().join("nope.ndjson"), &mut Vec::new()).unwrap_err();
        assert!(
            missing.to_string().ends_with("nope.ndjson: no such trace"),
            "{missing}"
        );
        let dir = show(tmp.path(), &mut Vec::new()).unwrap_err();
        assert!(dir.to_string().contains("not a regular file"), "{dir}");
    }
}
