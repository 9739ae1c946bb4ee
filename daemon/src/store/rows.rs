//! What the session map holds: a session row, the acpd process holding its lease, what a
//! claim found, a session as an agent lists it, and how each is read from its columns.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};

/// The longest title the map keeps, in bytes (cut on a character boundary): a title is a
/// picker's label, and one agent or editor must not make every listing megabytes long.
pub(crate) const MAX_TITLE: usize = 1024;

/// One acpd session: the id the parent knows and the child session it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub acpd_id: String,
    pub provider: String,
    pub child_session_id: String,
    pub cwd: PathBuf,
    pub title: Option<String>,
    /// RFC 3339 UTC with milliseconds ([`now`](super::now)): sorts as text.
    pub updated_at: String,
    /// Whose session it is: the user who opened it through acpd (or the token, with acpd's
    /// own uid), or acpd's own user for one an agent listed (the agent runs as acpd's user,
    /// its sessions are theirs). Nobody else sees or touches it.
    pub owner: super::RowOwner,
    /// The acpd process in which the session is live, if any: one session is live in one
    /// acpd at a time.
    pub lease: Option<Holder>,
}

/// An acpd process, told apart from a later one with the same pid by its start time and boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    /// Clock ticks since boot (`/proc/PID/stat` field 22).
    pub start: u64,
    pub boot: String,
}

impl Holder {
    /// This process.
    pub fn me() -> Holder {
        let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        Holder {
            pid,
            start: crate::supervise::start_time(pid).unwrap_or(0),
            boot: crate::supervise::procfs::boot_id(),
        }
    }

    /// Whether that process still runs: same boot, same pid, same start time.
    pub fn alive(&self) -> bool {
        self.boot == crate::supervise::procfs::boot_id()
            && crate::supervise::start_time(self.pid) == Some(self.start)
    }
}

/// What [`Store::claim`](super::Store::claim) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The lease is this process's now (it was free, already ours, or its holder is dead).
    Held,
    /// Live in that other acpd process.
    Elsewhere(Holder),
    /// No such session of this owner.
    Unknown,
}

/// A session as an agent's listing gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub child_session_id: String,
    pub cwd: PathBuf,
    pub title: Option<String>,
    pub updated_at: Option<String>,
}

/// `title` cut to at most [`MAX_TITLE`] bytes, on a character boundary.
pub(crate) fn cap_title(mut title: String) -> String {
    let end = acpd_protocol::utf8::head(&title, MAX_TITLE).len();
    title.truncate(end);
    title
}

pub(super) const COLUMNS: &str = "acpd_id, provider, child_session_id, cwd, title, updated_at, owner_uid, \
                       lease_pid, lease_start, lease_boot, owner_token";

pub(super) fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        acpd_id: r.get(0)?,
        provider: r.get(1)?,
        child_session_id: r.get(2)?,
        cwd: PathBuf::from(OsString::from_vec(r.get(3)?)),
        title: r.get(4)?,
        updated_at: r.get(5)?,
        owner: super::RowOwner {
            uid: r.get(6)?,
            token: r.get(10)?,
        },
        lease: lease_of(r, 7)?,
    })
}

/// The lease in columns `at..at + 3` (pid, start as decimal text: a u64 does not fit SQLite's
/// i64, boot id); None when unset or unreadable (an unreadable lease holds nothing).
pub(super) fn lease_of(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Option<Holder>> {
    let pid: Option<i32> = r.get(at)?;
    let start: Option<String> = r.get(at + 1)?;
    let boot: Option<String> = r.get(at + 2)?;
    Ok(match (pid, start.and_then(|s| s.parse().ok()), boot) {
        (Some(pid), Some(start), Some(boot)) => Some(Holder { pid, start, boot }),
        _ => None,
    })
}

/// Paths are stored as their bytes: a cwd need not be UTF-8, and it must come back exact.
pub(super) fn path_bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}
