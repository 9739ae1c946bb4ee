//! `--sessions DIR`: the echo agent's persisted sessions, one JSON file per session.
//!
//! Files rather than memory so that a second echo process (a respawned child, or the next
//! `acpd stdio`) can list, load, resume, fork and delete what an earlier one created: the
//! behaviour acpd's durable session map is tested against. Every write goes to a temporary
//! file in the same directory and is renamed over the target, so a reader in another process
//! never sees half a session.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One persisted session, exactly as its file holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SessionFile {
    pub session_id: String,
    pub cwd: String,
    /// The first line of the first prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// RFC 3339 UTC with milliseconds, so sessions made in the same second still sort.
    pub updated_at: String,
    #[serde(default)]
    pub history: Vec<Entry>,
}

/// One message of a session's history, replayed by `session/load`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Entry {
    pub role: Role,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Role {
    User,
    Agent,
}

impl Role {
    /// The `sessionUpdate` kind that replays an entry of this role.
    pub(super) fn update_kind(self) -> &'static str {
        match self {
            Role::User => "user_message_chunk",
            Role::Agent => "agent_message_chunk",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum SessionsError {
    #[error("cannot create the sessions directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write session file {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read session file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("session file {} is not a session: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot list the sessions directory {}: {source}", path.display())]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid cursor {0:?}")]
    Cursor(String),
}

/// The sessions directory.
#[derive(Debug, Clone)]
pub(super) struct Store {
    dir: PathBuf,
}

/// The current time as the files store it.
pub(super) fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// A fresh session id, unique across processes sharing a directory.
pub(super) fn new_id() -> String {
    format!("echo-{}", uuid::Uuid::new_v4())
}

/// The title a prompt gives a session: its first non-empty line.
pub(super) fn title_of(prompt: &str) -> Option<String> {
    prompt
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .map(str::to_string)
}

impl Store {
    pub(super) fn open(dir: &Path) -> Result<Store, SessionsError> {
        std::fs::create_dir_all(dir).map_err(|source| SessionsError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    /// The file of `session_id`, or None when the id could not name a file of ours (a path
    /// separator, a leading dot): such a session simply does not exist.
    fn path(&self, session_id: &str) -> Option<PathBuf> {
        let plain = !session_id.is_empty()
            && !session_id.starts_with('.')
            && !session_id.contains(['/', '\\', '\0']);
        plain.then(|| self.dir.join(format!("{session_id}.json")))
    }

    /// Writes `session` through a temporary file renamed into place.
    pub(super) fn save(&self, session: &SessionFile) -> Result<(), SessionsError> {
        let path = self
            .path(&session.session_id)
            .ok_or_else(|| SessionsError::Write {
                path: self.dir.join(&session.session_id),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "unsafe session id"),
            })?;
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            session.session_id,
            uuid::Uuid::new_v4()
        ));
        let write_err = |source| SessionsError::Write {
            path: path.clone(),
            source,
        };
        let text = serde_json::to_vec_pretty(session).map_err(std::io::Error::other);
        let written = text.and_then(|text| std::fs::write(&tmp, text));
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(write_err(e));
        }
        Ok(())
    }

    /// The session, or None when there is no such file.
    pub(super) fn load(&self, session_id: &str) -> Result<Option<SessionFile>, SessionsError> {
        let Some(path) = self.path(session_id) else {
            return Ok(None);
        };
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SessionsError::Read { path, source }),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| SessionsError::Parse { path, source })
    }

    /// Removes the session's file; false when there was none.
    pub(super) fn delete(&self, session_id: &str) -> Result<bool, SessionsError> {
        let Some(path) = self.path(session_id) else {
            return Ok(false);
        };
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(SessionsError::Write { path, source }),
        }
    }

    /// Every session whose cwd is `cwd` (all when None), newest first, ties by id. Files that
    /// vanish or do not parse while listing are skipped: another process may be deleting.
    pub(super) fn list(&self, cwd: Option<&str>) -> Result<Vec<SessionFile>, SessionsError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| SessionsError::List {
            path: self.dir.clone(),
            source,
        })?;
        let mut sessions: Vec<SessionFile> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let id = name.strip_suffix(".json")?;
                self.load(id).ok().flatten()
            })
            .filter(|s| cwd.is_none_or(|cwd| s.cwd == cwd))
            .collect();
        sessions.sort_by(|a, b| {
            b.updated_at
                .cmp(&a.updated_at)
                .then_with(|| a.session_id.cmp(&b.session_id))
        });
        Ok(sessions)
    }
}

/// Prefix of the cursors [`page`] makes; anything else is refused.
const CURSOR_PREFIX: &str = "echo-page-";

/// The page of `items` starting at `cursor` (one this function made) and the next page's
/// cursor, absent on the last page.
pub(super) fn page<T>(
    items: Vec<T>,
    cursor: Option<&str>,
    size: usize,
) -> Result<(Vec<T>, Option<String>), SessionsError> {
    let start = match cursor {
        None => 0,
        Some(c) => c
            .strip_prefix(CURSOR_PREFIX)
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| SessionsError::Cursor(c.to_string()))?,
    };
    let size = size.max(1);
    let total = items.len();
    let end = start.saturating_add(size).min(total);
    let next = (end < total).then(|| format!("{CURSOR_PREFIX}{end}"));
    let page = items.into_iter().skip(start).take(size).collect();
    Ok((page, next))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn session(id: &str, cwd: &str, at: &str) -> SessionFile {
        SessionFile {
            session_id: id.into(),
            cwd: cwd.into(),
            title: Some("t".into()),
            updated_at: at.into(),
            history: vec![Entry {
                role: Role::User,
                text: "hi\n".into(),
            }],
        }
    }

    #[test]
    fn saved_sessions_load_list_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s")).unwrap();
        let a = session("echo-a", "/w", "2026-12-01T00:00:00.000Z");
        let b = session("echo-b", "/w", "2026-12-01T00:00:01.000Z");
        let c = session("echo-c", "/other", "2026-12-01T00:00:02.000Z");
        for s in [&a, &b, &c] {
            store.save(s).unwrap();
        }
        // A second store on the same directory sees them: another process would.
        let other = Store::open(&dir.path().join("s")).unwrap();
        assert_eq!(other.load("echo-a").unwrap(), Some(a.clone()));
        assert_eq!(other.load("echo-nope").unwrap(), None);
        assert_eq!(other.load("../s/echo-a").unwrap(), None);
        let ids = |v: Vec<SessionFile>| v.into_iter().map(|s| s.session_id).collect::<Vec<_>>();
        assert_eq!(
            ids(other.list(None).unwrap()),
            ["echo-c", "echo-b", "echo-a"]
        );
        assert_eq!(ids(other.list(Some("/w")).unwrap()), ["echo-b", "echo-a"]);
        assert!(other.delete("echo-b").unwrap());
        assert!(!other.delete("echo-b").unwrap());
        assert_eq!(ids(store.list(Some("/w")).unwrap()), ["echo-a"]);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("s"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names
                .iter()
                .all(|n| n.ends_with(".json") && !n.starts_with('.'))
        );
    }

    #[test]
    fn pages_follow_their_cursors_to_the_end() {
        let (first, next) = page((0..5).collect(), None, 2).unwrap();
        assert_eq!(first, [0, 1]);
        let (second, next) = page((0..5).collect(), next.as_deref(), 2).unwrap();
        assert_eq!(second, [2, 3]);
        let (last, next) = page((0..5).collect(), next.as_deref(), 2).unwrap();
        assert_eq!((last, next), (vec![4], None));
        let (all, next) = page((0..5).collect::<Vec<_>>(), None, 50).unwrap();
        assert_eq!((all.len(), next), (5, None));
        let (empty, _) = page((0..2).collect::<Vec<_>>(), Some("echo-page-9"), 2).unwrap();
        assert!(empty.is_empty());
        assert!(page((0..2).collect::<Vec<_>>(), Some("bogus"), 2).is_err());
    }

    #[test]
    fn titles_are_the_first_line() {
        assert_eq!(title_of("\n  hello \nworld"), Some("hello".into()));
        assert_eq!(title_of(""), None);
        assert!(new_id().starts_with("echo-"));
        assert_ne!(new_id(), new_id());
    }
}
