//! Why the session store failed: every error names the file and what the user can do.

use std::path::PathBuf;

use super::migrate::SCHEMA;

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
    #[error(
        "{name:?} is not a token name: {why}; use 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit"
    )]
    TokenName { name: String, why: String },
    #[error(
        "a token named {name} exists already and is still accepted; choose another name, or revoke it first with `acpd token revoke {name}`"
    )]
    TokenNameTaken { name: String },
    #[error("there is no token named {name}; `acpd token list` shows the tokens there are")]
    NoSuchToken { name: String },
    #[error(
        "cannot read random bytes from the operating system for a token: {reason}; nothing was created, try again"
    )]
    Random { reason: String },
}
