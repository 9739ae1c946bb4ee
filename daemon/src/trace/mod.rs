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
//!
//! - `trace_dir.rs`: the trace directory, checked and held open, and each file created in it.
//! - `trace_file.rs`: [`Trace`], one run's or session's file: records, the bound, rotation.
//! - `show.rs`: `acpd trace show`, a trace read back with every control character escaped.

mod show;
#[cfg(test)]
mod tests;
mod trace_dir;
mod trace_file;

#[cfg(test)]
pub(crate) use show::readable;
pub(crate) use show::{ShowError, escape_controls, escape_controls_keeping_lines, show};
#[cfg(test)]
pub(crate) use trace_dir::{DirError, open_dir};
pub(crate) use trace_file::Trace;

/// How large one trace file grows before it is rotated.
pub(crate) const MAX_FILE: u64 = 16 * 1024 * 1024;

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
