//! The durable session map and probe cache: one SQLite file that every acpd process of a user
//! shares (an editor's `acpd stdio`, the daemon, a second editor), so a session created
//! through one is listed and loaded through the next, and an agent's `initialize` answer is
//! asked once per command line, not once per start.
//!
//! SQLite gives the cross-process safety: WAL lets readers run beside the one writer, a 5 s
//! busy timeout makes writers queue instead of failing, and every write that reads first runs
//! in an IMMEDIATE transaction (a deferred one could not wait for the lock it upgrades to).
//! rusqlite is synchronous, so each async method runs its query on the blocking pool.
//!
//! - `store_error.rs`: [`StoreError`], naming the file and what to do.
//! - `rows.rs`: a session row, a lease's holder, what a claim found, a listed session, and
//!   how each is read from its columns.
//! - `session_map.rs`: the session map's queries (insert, claim, touch, adopt a listing,
//!   list, forget).
//! - `probe_cache.rs`: each provider's cached `initialize` answer.
//! - `migrate.rs`: the schema version and the steps that bring a file up to it.
//! - `timestamps.rs`: the one time format rows are written and sorted in.
//! - `principal.rs`: [`Principal`], who a session belongs to (a user or a network token), and
//!   [`RowOwner`], how a row records it.
//! - `tokens/`: the network tokens' table and [`tokens::TokenBook`], the daemon's view of it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

mod migrate;
mod principal;
mod probe_cache;
mod rows;
mod session_map;
mod store_error;
#[cfg(test)]
mod tests;
mod timestamps;
pub(crate) mod tokens;

use migrate::migrate;
pub(crate) use principal::{Principal, RowOwner};
#[cfg(test)]
pub(crate) use rows::MAX_TITLE;
pub(crate) use rows::{Claim, Holder, Listed, SessionRow, cap_title};
pub(crate) use store_error::StoreError;
pub(crate) use timestamps::now;

/// How long a writer waits for another process's write before giving up.
const BUSY: Duration = Duration::from_secs(5);
const FILE_NAME: &str = "sessions.sqlite3";

/// The store's file in acpd's state directory (`crate::supervise::default_state_dir`), `None`
/// when there is no state directory.
pub(crate) fn default_path() -> Option<PathBuf> {
    crate::supervise::default_state_dir().map(|dir| dir.join(FILE_NAME))
}

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
