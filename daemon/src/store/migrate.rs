//! The schema: its version, and the steps that bring an older file up to it.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// Bumped with every schema change; [`migrate`] brings older files up to it.
pub(super) const SCHEMA: i64 = 4;

/// Brings the schema up to [`SCHEMA`] in one IMMEDIATE transaction, so two processes opening a
/// new file at once create it once.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
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
    if found < 4 {
        // Network tokens (store/tokens/): only each one's SHA-256 is kept. A session opened
        // with a token carries its id; every row from before is a user's (NULL).
        tx.execute_batch(
            "CREATE TABLE tokens (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                name TEXT NOT NULL,
                role TEXT NOT NULL,
                digest BLOB NOT NULL UNIQUE,
                created_at TEXT NOT NULL,
                expires_at INTEGER,
                revoked_at TEXT,
                last_used_at TEXT
            );
            CREATE INDEX tokens_by_name ON tokens (name);
            ALTER TABLE sessions ADD COLUMN owner_token INTEGER;",
        )
        .map_err(query)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA)
        .map_err(query)?;
    tx.commit().map_err(query)
}
