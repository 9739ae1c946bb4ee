//! The durable session map and probe cache: one SQLite file that every acpd process of a user
//! shares (an editor's `acpd stdio`, the daemon, a second editor), so a session created
//! through one is listed and loaded through the next, and an agent's `initialize` answer is
//! asked once per command line, not once per start.
//!
//! SQLite gives the cross-process safety: WAL lets readers run beside the one writer, a 5 s
//! busy timeout makes writers queue instead of failing, and every write that reads first runs
//! in an IMMEDIATE transaction (a deferred one could not wait for the lock it upgrades to).
//! rusqlite is synchronous, so each async method runs its query on the blocking pool.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

#[cfg(test)]
mod tests;

/// Bumped with every schema change; [`migrate`] brings older files up to it.
const SCHEMA: i64 = 3;
/// How long a writer waits for another process's write before giving up.
const BUSY: Duration = Duration::from_secs(5);
const FILE_NAME: &str = "sessions.sqlite3";
/// The longest title the map keeps, in bytes (cut on a character boundary): a title is a
/// picker's label, and one agent or editor must not make every listing megabytes long.
pub const MAX_TITLE: usize = 1024;

/// A handle on the store; clones share one connection (SQLite serialises a connection's
/// statements anyway, and one acpd process writes little).
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    /// For error messages: which file to look at.
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Every error names the file and what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create {} for the session store: {source}; check its permissions or set XDG_STATE_HOME", path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the session store {} is not private: {source}", path.display())]
    Private {
        path: PathBuf,
        source: crate::private_fs::PrivateError,
    },
    #[error("cannot open the session store {}: {source}; check its permissions, or move it aside to start afresh", path.display())]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("the session store {} has schema version {found}, newer than this acpd's {SCHEMA}; run the newer acpd, or move the file aside to start afresh", path.display())]
    NewerSchema { path: PathBuf, found: i64 },
    #[error("the session store {} failed: {source}; if this persists, move the file aside to start afresh", path.display())]
    Query {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("a session store query on {} did not finish: {reason}", path.display())]
    Task { path: PathBuf, reason: String },
}

/// One acpd session: the id the parent knows and the child session it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub acpd_id: String,
    pub provider: String,
    pub child_session_id: String,
    pub cwd: PathBuf,
    pub title: Option<String>,
    /// RFC 3339 UTC with milliseconds ([`now`]): sorts as text.
    pub updated_at: String,
    /// The uid of the user whose session it is: who opened it through acpd, or acpd's own
    /// user for one an agent listed (the agent runs as acpd's user, its sessions are theirs).
    /// Nobody else sees or touches it.
    pub owner: u32,
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

/// What [`Store::claim`] found.
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
pub fn cap_title(mut title: String) -> String {
    if title.len() > MAX_TITLE {
        let mut end = MAX_TITLE;
        while !title.is_char_boundary(end) {
            end -= 1;
        }
        title.truncate(end);
    }
    title
}

impl Store {
    /// Opens (creating) the store at `path`: its directory is made private (0700, created or
    /// tightened) and the file 0600 (created or tightened; SQLite gives its `-wal`/`-shm`
    /// files the same mode), since titles and working directories are the user's business.
    /// Neither is opened through a symlink: one planted at the directory, the file, or its
    /// `-wal`/`-shm` is refused with an error naming it ([`crate::private_fs`]), and SQLite
    /// opens the file with `SQLITE_OPEN_NOFOLLOW`. Blocking: it may wait up to 5 s for other
    /// processes opening or writing the same file.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let private = |source| match source {
            crate::private_fs::PrivateError::Io { path, source, .. } => {
                StoreError::Dir { path, source }
            }
            source => StoreError::Private {
                path: path.to_path_buf(),
                source,
            },
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::private_fs::private_dir(dir).map_err(private)?;
        }
        // Created here, not by SQLite, to choose the mode (SQLite would use 0644).
        crate::private_fs::private_file(path).map_err(private)?;
        for suffix in ["-wal", "-shm", "-journal"] {
            let mut companion = path.as_os_str().to_owned();
            companion.push(suffix);
            crate::private_fs::check_absent_or_private(Path::new(&companion)).map_err(private)?;
        }
        let open = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        let flags = rusqlite::OpenFlags::default() | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let mut conn = Connection::open_with_flags(path, flags).map_err(open)?;
        // The timeout first: switching to WAL and migrating may wait on another process.
        conn.busy_timeout(BUSY).map_err(open)?;
        let mode = use_wal(&conn).map_err(open)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(
                "session store {} runs in journal mode {mode}, not WAL: writers may wait longer",
                path.display()
            );
        }
        // In WAL mode NORMAL never corrupts the file; a power cut may lose the last commits,
        // which the next listing of the agents relearns, and commits skip an fsync each.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open)?;
        migrate(&mut conn, path)?;
        Ok(Store::wrap(conn, path.to_path_buf()))
    }

    /// `<state dir>/sessions.sqlite3` (state dir =
    /// `crate::supervise::default_state_dir`); None (logged) when there is no state
    /// dir or the store cannot be opened, so acpd still runs, remembering nothing.
    pub fn open_default() -> Option<Store> {
        let Some(dir) = crate::supervise::default_state_dir() else {
            tracing::warn!(
                "no state directory (no STATE_DIRECTORY, XDG_STATE_HOME or HOME): sessions are not kept across restarts"
            );
            return None;
        };
        match Store::open(&dir.join(FILE_NAME)) {
            Ok(store) => Some(store),
            Err(e) => {
                tracing::warn!("{e}; sessions are not kept across restarts");
                None
            }
        }
    }

    /// A private store that lives as long as its clones: for tests and for running without a
    /// state directory.
    ///
    /// # Panics
    /// Only if SQLite cannot allocate an empty in-memory database, where the process is out of
    /// memory anyway.
    pub fn in_memory() -> Store {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory()
            .map_err(|e| StoreError::Open {
                path: path.clone(),
                source: e,
            })
            .and_then(|mut c| migrate(&mut c, &path).map(|()| c));
        match conn {
            Ok(conn) => Store::wrap(conn, path),
            Err(e) => panic!("{e}"),
        }
    }

    fn wrap(conn: Connection, path: PathBuf) -> Store {
        Store {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::new(path),
        }
    }

    /// Adds `row` (a session someone opened: `session/new`, `session/fork`), or replaces the row
    /// with its `acpd_id`. The row it takes the place of, when an agent's listing filed the same
    /// child session first (a `session/list` racing the `session/new` that made it), is only
    /// listed, so it gives way: the opener's id wins. A child session already mapped to another
    /// acpd id that someone opened is an error: one child session has one acpd id.
    pub async fn insert(&self, row: SessionRow) -> Result<(), StoreError> {
        let title = row.title.map(cap_title);
        let lease = row.lease;
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "DELETE FROM sessions WHERE provider = ?1 AND child_session_id = ?2
                   AND listed_only = 1 AND acpd_id != ?3",
                params![row.provider, row.child_session_id, row.acpd_id],
            )?;
            tx.execute(
                "INSERT INTO sessions (acpd_id, provider, child_session_id, cwd, title, updated_at,
                   owner_uid, lease_pid, lease_start, lease_boot, listed_only)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0)
                 ON CONFLICT (acpd_id) DO UPDATE SET provider = excluded.provider,
                   child_session_id = excluded.child_session_id, cwd = excluded.cwd,
                   title = excluded.title, updated_at = excluded.updated_at,
                   owner_uid = excluded.owner_uid, lease_pid = excluded.lease_pid,
                   lease_start = excluded.lease_start, lease_boot = excluded.lease_boot,
                   listed_only = 0",
                params![
                    row.acpd_id,
                    row.provider,
                    row.child_session_id,
                    path_bytes(&row.cwd),
                    title,
                    row.updated_at,
                    row.owner,
                    lease.as_ref().map(|h| h.pid),
                    lease.as_ref().map(|h| h.start.to_string()),
                    lease.as_ref().map(|h| h.boot.clone()),
                ],
            )?;
            tx.commit()
        })
        .await
    }

    /// The row of `acpd_id` if it is `owner`'s: another user's session is not there for them.
    pub async fn get_owned(
        &self,
        acpd_id: &str,
        owner: u32,
    ) -> Result<Option<SessionRow>, StoreError> {
        Ok(self.get(acpd_id).await?.filter(|r| r.owner == owner))
    }

    /// Makes `me` the holder of `owner`'s session `acpd_id`, unless another live acpd holds it.
    /// A dead holder's lease (its process gone, or from another boot) is taken over. A row only
    /// an agent's listing brought in is now one its owner opened: no listing bounds it any more.
    pub async fn claim(&self, acpd_id: &str, owner: u32, me: &Holder) -> Result<Claim, StoreError> {
        let (acpd_id, me) = (acpd_id.to_owned(), me.clone());
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let found = tx
                .query_row(
                    "SELECT owner_uid, lease_pid, lease_start, lease_boot FROM sessions
                     WHERE acpd_id = ?1",
                    [&acpd_id],
                    |r| Ok((r.get::<_, u32>(0)?, lease_of(r, 1)?)),
                )
                .optional()?;
            let claim = match found {
                None => Claim::Unknown,
                Some((o, _)) if o != owner => Claim::Unknown,
                Some((_, Some(h))) if h != me && h.alive() => Claim::Elsewhere(h),
                Some(_) => {
                    tx.execute(
                        "UPDATE sessions SET lease_pid = ?2, lease_start = ?3, lease_boot = ?4,
                           listed_only = 0
                         WHERE acpd_id = ?1",
                        params![acpd_id, me.pid, me.start.to_string(), me.boot],
                    )?;
                    Claim::Held
                }
            };
            tx.commit()?;
            Ok(claim)
        })
        .await
    }

    /// Gives up `me`'s lease on `acpd_id` (the session is no longer live here); a lease
    /// another process took meanwhile stays.
    pub async fn release(&self, acpd_id: &str, me: &Holder) -> Result<(), StoreError> {
        let (acpd_id, me) = (acpd_id.to_owned(), me.clone());
        self.run(move |conn| {
            conn.execute(
                "UPDATE sessions SET lease_pid = NULL, lease_start = NULL, lease_boot = NULL
                 WHERE acpd_id = ?1 AND lease_pid = ?2 AND lease_start = ?3 AND lease_boot = ?4",
                params![acpd_id, me.pid, me.start.to_string(), me.boot],
            )
            .map(drop)
        })
        .await
    }

    /// The row of `acpd_id`, whichever process wrote it.
    pub async fn get(&self, acpd_id: &str) -> Result<Option<SessionRow>, StoreError> {
        let acpd_id = acpd_id.to_owned();
        self.run(move |conn| {
            conn.query_row(
                &format!("SELECT {COLUMNS} FROM sessions WHERE acpd_id = ?1"),
                [acpd_id],
                session_row,
            )
            .optional()
        })
        .await
    }

    /// updated_at = now; title replaced (capped) when Some; only on `owner`'s row. An unknown
    /// id is not an error: the session may have been forgotten by another process meanwhile.
    pub async fn touch(
        &self,
        acpd_id: &str,
        owner: u32,
        title: Option<String>,
    ) -> Result<(), StoreError> {
        let acpd_id = acpd_id.to_owned();
        let title = title.map(cap_title);
        self.run(move |conn| {
            conn.execute(
                "UPDATE sessions SET updated_at = ?2, title = COALESCE(?3, title)
                 WHERE acpd_id = ?1 AND owner_uid = ?4",
                params![acpd_id, now(), title, owner],
            )
            .map(drop)
        })
        .await
    }

    /// Whether there was such a row.
    pub async fn remove(&self, acpd_id: &str) -> Result<bool, StoreError> {
        let acpd_id = acpd_id.to_owned();
        self.run(move |conn| {
            conn.execute("DELETE FROM sessions WHERE acpd_id = ?1", [acpd_id])
                .map(|n| n > 0)
        })
        .await
    }

    /// A session a provider listed: its acpd id (minted `acpd-<uuid v4>` when new; unique on
    /// (provider, child_session_id)), title/updated_at/cwd refreshed from the child's listing.
    /// A title or time the listing lacks keeps the stored one; a new row without a time gets
    /// now, and belongs to acpd's own user. One statement, so two processes adopting the same
    /// session get the same id.
    pub async fn adopt(
        &self,
        provider: &str,
        child_session_id: &str,
        cwd: &Path,
        title: Option<String>,
        updated_at: Option<String>,
    ) -> Result<String, StoreError> {
        let listed = Listed {
            child_session_id: child_session_id.to_owned(),
            cwd: cwd.to_path_buf(),
            title,
            updated_at,
        };
        let ids = self
            .adopt_listing(provider, vec![listed], usize::MAX)
            .await?;
        ids.into_iter().next().ok_or_else(|| StoreError::Task {
            path: self.path.to_path_buf(),
            reason: "adopting one session returned no id".into(),
        })
    }

    /// Adopts every session of one page of `provider`'s listing (see [`Store::adopt`]) in one
    /// transaction, then keeps only the provider's `max` newest listed-only rows: an agent that
    /// lists fresh ids without end cannot grow the map past `max` rows. The bound counts and
    /// cuts only rows the listing brought in and nobody opened (`listed_only`, acpd's uid): a
    /// row someone's `session/new`, `fork` or `load` made is never pushed out by an agent
    /// listing many sessions (or ones with `updatedAt` in the future). Returns the acpd ids.
    pub async fn adopt_listing(
        &self,
        provider: &str,
        sessions: Vec<Listed>,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let provider = provider.to_owned();
        let owner = nix::unistd::Uid::effective().as_raw();
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Vec::with_capacity(sessions.len());
            {
                let mut adopt = tx.prepare_cached(
                    "INSERT INTO sessions (acpd_id, provider, child_session_id, cwd, title,
                       updated_at, owner_uid, listed_only)
                     VALUES (?1, ?2, ?3, ?4, ?5, COALESCE(?6, ?7), ?8, 1)
                     ON CONFLICT (provider, child_session_id) DO UPDATE SET cwd = excluded.cwd,
                       title = COALESCE(excluded.title, title),
                       updated_at = COALESCE(?6, updated_at)
                     RETURNING acpd_id",
                )?;
                for s in sessions {
                    let id = adopt.query_row(
                        params![
                            format!("acpd-{}", uuid::Uuid::new_v4()),
                            provider,
                            s.child_session_id,
                            path_bytes(&s.cwd),
                            s.title.map(cap_title),
                            s.updated_at.as_deref().map(normalize_time),
                            now(),
                            owner
                        ],
                        |r| r.get(0),
                    )?;
                    ids.push(id);
                }
            }
            if max < usize::MAX {
                tx.execute(
                    "DELETE FROM sessions WHERE provider = ?1 AND listed_only = 1
                     AND acpd_id NOT IN (
                       SELECT acpd_id FROM sessions WHERE provider = ?1 AND listed_only = 1
                       ORDER BY updated_at DESC, acpd_id ASC LIMIT ?2)",
                    params![provider, i64::try_from(max).unwrap_or(i64::MAX)],
                )?;
            }
            tx.commit()?;
            Ok(ids)
        })
        .await
    }

    /// `owner`'s rows, newest first (updated_at desc, acpd_id asc); only rows whose cwd
    /// equals `cwd` when given (byte for byte: the caller passes the path as the client sent
    /// it).
    pub async fn list(
        &self,
        cwd: Option<&Path>,
        owner: u32,
    ) -> Result<Vec<SessionRow>, StoreError> {
        let cwd = cwd.map(|c| path_bytes(c).to_vec());
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM sessions WHERE (?1 IS NULL OR cwd = ?1) AND owner_uid = ?2
                 ORDER BY updated_at DESC, acpd_id ASC"
            ))?;
            stmt.query_map(params![cwd, owner], session_row)?.collect()
        })
        .await
    }

    /// Rows of `provider` not in `listed` go (the agent deleted them); returns how many.
    /// `listed` is all acpd keeps of the agent's listing (every page, or the first
    /// `max_listed_sessions`): listed-only rows not in it go. A row someone opened goes only
    /// when `whole_since` is the time the listing began and the listing was whole (not cut at
    /// the bound, so the bound never forgets one), the row was last written before it (so a
    /// `session/new` racing the listing keeps its row) and no live acpd holds it.
    pub async fn forget_unlisted(
        &self,
        provider: &str,
        listed: &[String],
        whole_since: Option<&str>,
    ) -> Result<usize, StoreError> {
        let provider = provider.to_owned();
        let whole_since = whole_since.map(str::to_owned);
        let listed: std::collections::HashSet<String> = listed.iter().cloned().collect();
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let gone: Vec<String> = {
                let mut stmt = tx.prepare(
                    "SELECT child_session_id, listed_only, updated_at, lease_pid, lease_start,
                       lease_boot FROM sessions WHERE provider = ?1",
                )?;
                let rows = stmt.query_map([&provider], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, bool>(1)?,
                        r.get::<_, String>(2)?,
                        lease_of(r, 3)?,
                    ))
                })?;
                let mut gone = Vec::new();
                for row in rows {
                    let (id, listed_only, updated_at, lease) = row?;
                    if listed.contains(&id) {
                        continue;
                    }
                    let opened_may_go = whole_since.as_ref().is_some_and(|since| {
                        updated_at < *since && !lease.as_ref().is_some_and(Holder::alive)
                    });
                    if listed_only || opened_may_go {
                        gone.push(id);
                    }
                }
                gone
            };
            {
                let mut delete = tx.prepare(
                    "DELETE FROM sessions WHERE provider = ?1 AND child_session_id = ?2",
                )?;
                for id in &gone {
                    delete.execute([&provider, id])?;
                }
            }
            tx.commit()?;
            Ok(gone.len())
        })
        .await
    }

    /// What a provider's agent said in `initialize` (a JSON value), keyed by provider name and
    /// a fingerprint of its command+env; None when absent or the fingerprint changed (the
    /// provider now runs something else). An unreadable value counts as absent: it is only a
    /// cache, and the next `probe_put` replaces it.
    pub async fn probe_get(
        &self,
        provider: &str,
        fingerprint: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let (provider, fingerprint) = (provider.to_owned(), fingerprint.to_owned());
        let text: Option<String> = self
            .run(move |conn| {
                conn.query_row(
                    "SELECT value FROM probes WHERE provider = ?1 AND fingerprint = ?2",
                    [provider, fingerprint],
                    |r| r.get(0),
                )
                .optional()
            })
            .await?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }

    /// Replaces the provider's cached probe (one per provider: an older fingerprint's answer
    /// is never asked for again).
    pub async fn probe_put(
        &self,
        provider: &str,
        fingerprint: &str,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let (provider, fingerprint) = (provider.to_owned(), fingerprint.to_owned());
        let value = value.to_string();
        self.run(move |conn| {
            conn.execute(
                "INSERT INTO probes (provider, fingerprint, value, updated_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (provider) DO UPDATE SET fingerprint = excluded.fingerprint,
                   value = excluded.value, updated_at = excluded.updated_at",
                params![provider, fingerprint, value, now()],
            )
            .map(drop)
        })
        .await
    }

    /// Runs `query` on the blocking pool: SQLite may wait up to [`BUSY`] for another process,
    /// which must not stall a runtime worker.
    async fn run<T: Send + 'static>(
        &self,
        query: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = Arc::clone(&self.conn);
        let done = tokio::task::spawn_blocking(move || {
            // A panic inside a query leaves no half-done transaction (it rolls back on drop).
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            query(&mut conn)
        })
        .await;
        let path = self.path.to_path_buf();
        match done {
            Ok(result) => result.map_err(|source| StoreError::Query { path, source }),
            Err(e) => Err(StoreError::Task {
                path,
                reason: e.to_string(),
            }),
        }
    }
}

const COLUMNS: &str = "acpd_id, provider, child_session_id, cwd, title, updated_at, owner_uid, \
                       lease_pid, lease_start, lease_boot";

fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
    Ok(SessionRow {
        acpd_id: r.get(0)?,
        provider: r.get(1)?,
        child_session_id: r.get(2)?,
        cwd: PathBuf::from(OsString::from_vec(r.get(3)?)),
        title: r.get(4)?,
        updated_at: r.get(5)?,
        owner: r.get(6)?,
        lease: lease_of(r, 7)?,
    })
}

/// The lease in columns `at..at + 3` (pid, start as decimal text: a u64 does not fit SQLite's
/// i64, boot id); None when unset or unreadable (an unreadable lease holds nothing).
fn lease_of(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Option<Holder>> {
    let pid: Option<i32> = r.get(at)?;
    let start: Option<String> = r.get(at + 1)?;
    let boot: Option<String> = r.get(at + 2)?;
    Ok(match (pid, start.and_then(|s| s.parse().ok()), boot) {
        (Some(pid), Some(start), Some(boot)) => Some(Holder { pid, start, boot }),
        _ => None,
    })
}

/// Paths are stored as their bytes: a cwd need not be UTF-8, and it must come back exact.
fn path_bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// Switches `conn`'s file to WAL (a no-op when it is already). The switch is the one step for
/// which SQLite answers SQLITE_BUSY at once instead of calling the busy handler (seen when
/// several processes open a new file together), so it is retried here for as long as
/// [`BUSY`].
fn use_wal(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = Instant::now() + BUSY;
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "wal", |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            done => return done,
        }
    }
}

/// Brings the schema up to [`SCHEMA`] in one IMMEDIATE transaction, so two processes opening a
/// new file at once create it once.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let query = |source| StoreError::Query {
        path: path.to_path_buf(),
        source,
    };
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(query)?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(query)?;
    if found > SCHEMA {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found,
        });
    }
    if found < 1 {
        tx.execute_batch(
            "CREATE TABLE sessions (
                acpd_id TEXT PRIMARY KEY NOT NULL,
                provider TEXT NOT NULL,
                child_session_id TEXT NOT NULL,
                cwd BLOB NOT NULL,
                title TEXT,
                updated_at TEXT NOT NULL,
                UNIQUE (provider, child_session_id)
            );
            CREATE INDEX sessions_by_time ON sessions (updated_at DESC, acpd_id);
            CREATE TABLE probes (
                provider TEXT PRIMARY KEY NOT NULL,
                fingerprint TEXT NOT NULL,
                value TEXT NOT NULL,
                updated_at TEXT NOT NULL
            );",
        )
        .map_err(query)?;
    }
    if found < 2 {
        // Rows from before owners were kept were written by this file's user (the state dir
        // is theirs): they stay that user's. A uid is an integer, so formatting it is safe.
        let own = nix::unistd::Uid::effective().as_raw();
        tx.execute_batch(&format!(
            "ALTER TABLE sessions ADD COLUMN owner_uid INTEGER NOT NULL DEFAULT {own};
             ALTER TABLE sessions ADD COLUMN lease_pid INTEGER;
             ALTER TABLE sessions ADD COLUMN lease_start TEXT;
             ALTER TABLE sessions ADD COLUMN lease_boot TEXT;
             CREATE INDEX sessions_by_provider ON sessions (provider, updated_at DESC, acpd_id);"
        ))
        .map_err(query)?;
    }
    if found < 3 {
        // Rows from before are taken as opened by someone (0): no listing's bound cuts them;
        // rows an agent lists from now on are marked when they come in.
        tx.execute_batch("ALTER TABLE sessions ADD COLUMN listed_only INTEGER NOT NULL DEFAULT 0;")
            .map_err(query)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA)
        .map_err(query)?;
    tx.commit().map_err(query)
}

/// Now, as the map writes times: RFC 3339 UTC with milliseconds, so sessions updated within
/// one second still sort newest first.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// A child's timestamp in our one format, so rows sort as text. Agents write RFC 3339 with
/// fractions or offsets (`2026-12-01T11:00:00.5+01:00`); what cannot be read becomes now,
/// which keeps the row listed rather than losing it.
fn normalize_time(text: &str) -> String {
    parse_time(text.trim()).map_or_else(now, |t| humantime::format_rfc3339_millis(t).to_string())
}

fn parse_time(text: &str) -> Option<SystemTime> {
    // humantime reads UTC only (and after a fraction takes any `+HH:MM` for `+00:00`), so a
    // `±HH:MM` suffix is split off and applied here.
    let split = text
        .len()
        .checked_sub(6)
        .and_then(|at| text.split_at_checked(at));
    let Some((local, &[sign @ (b'+' | b'-'), h1, h2, b':', m1, m2])) =
        split.map(|(local, offset)| (local, offset.as_bytes()))
    else {
        return humantime::parse_rfc3339_weak(text).ok();
    };
    let digit = |b: u8| b.is_ascii_digit().then(|| u64::from(b - b'0'));
    let (hh, mm) = (digit(h1)? * 10 + digit(h2)?, digit(m1)? * 10 + digit(m2)?);
    if hh > 23 || mm > 59 {
        return None;
    }
    let shift = Duration::from_secs(hh * 3600 + mm * 60);
    let local = humantime::parse_rfc3339_weak(local).ok()?;
    if sign == b'+' {
        local.checked_sub(shift)
    } else {
        local.checked_add(shift)
    }
}
