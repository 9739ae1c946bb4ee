//! The file: opened private and never through a link, its schema, and several writers on it.

use std::io::Read as _;
use std::process::{Command, Stdio};

use serde_json::json;

use super::*;
use crate::store::migrate::SCHEMA;

#[tokio::test]
async fn open_makes_private_dir_and_file_and_reopens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state/acpd");
    let path = dir.join("sessions.sqlite3");
    let store = Store::open(&path).unwrap();
    store
        .insert(row("acpd-a", "echo", "c1", "/w", "2026-12-01T10:00:00Z"))
        .await
        .unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&tmp.path().join("state")), 0o700);
    assert_eq!(mode(&path), 0o600);
    let wal = dir.join("sessions.sqlite3-wal");
    assert!(wal.exists(), "WAL mode");
    assert_eq!(mode(&wal), 0o600);
    drop(store);

    let store = Store::open(&path).unwrap();
    assert!(store.get("acpd-a").await.unwrap().is_some());
    let conn = store.conn.lock().unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA);
}

#[test]
fn newer_schema_is_refused_with_advice() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("s.sqlite3");
    Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA + 1)
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::NewerSchema { found, .. } if found == SCHEMA + 1));
    let text = err.to_string();
    assert!(
        text.contains("s.sqlite3") && text.contains("move the file aside"),
        "{text}"
    );
}

#[test]
fn unusable_path_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain");
    std::fs::write(&file, "").unwrap();
    let err = Store::open(&file.join("sessions.sqlite3")).unwrap_err();
    assert!(
        matches!(err, StoreError::Dir { .. } | StoreError::Private { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("plain"), "{err}");

    // Not a database: SQLite notices when the schema is read.
    let junk = tmp.path().join("junk.sqlite3");
    std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
    let err = Store::open(&junk).unwrap_err();
    assert!(err.to_string().contains("junk.sqlite3"), "{err}");
}

#[tokio::test]
async fn two_stores_on_one_file_see_each_others_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sessions.sqlite3");
    let (a, b) = (Store::open(&path).unwrap(), Store::open(&path).unwrap());
    a.insert(row("acpd-a", "echo", "c1", "/w", "2026-12-01T10:00:00Z"))
        .await
        .unwrap();
    assert!(b.get("acpd-a").await.unwrap().is_some());
    let id = b
        .adopt("codex", "x", Path::new("/w"), None, None)
        .await
        .unwrap();
    assert_eq!(
        a.adopt("codex", "x", Path::new("/w"), None, None)
            .await
            .unwrap(),
        id
    );
    b.probe_put("codex", "f", &json!(1)).await.unwrap();
    assert_eq!(a.probe_get("codex", "f").await.unwrap(), Some(json!(1)));
    assert!(a.remove("acpd-a").await.unwrap());
    assert_eq!(b.get("acpd-a").await.unwrap(), None);
}

/// How many rows each writer adds in the concurrency tests.
const WRITES: usize = 100;

/// Writes `WRITES` sessions tagged `tag` and adopts the shared ones, as fast as it can.
fn hammer(path: &Path, tag: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = Store::open(path).unwrap();
    rt.block_on(async {
        for i in 0..WRITES {
            let id = format!("acpd-{tag}-{i}");
            let child = format!("{tag}-{i}");
            store
                .insert(row(&id, "echo", &child, "/w", "2026-12-01T10:00:00Z"))
                .await
                .unwrap();
            store.touch(&id, me(), None).await.unwrap();
            store
                .adopt(
                    "shared",
                    &format!("s{}", i % 20),
                    Path::new("/w"),
                    None,
                    None,
                )
                .await
                .unwrap();
        }
    });
}

fn check_hammered(path: &Path, tags: &[&str]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = Store::open(path).unwrap();
    let rows = rt.block_on(store.list(None, me())).unwrap();
    for tag in tags {
        let prefix = format!("acpd-{tag}-");
        let n = rows
            .iter()
            .filter(|r| r.acpd_id.starts_with(&prefix))
            .count();
        assert_eq!(n, WRITES, "{tag}");
    }
    // Every process adopted the same 20 sessions: 20 rows, never duplicates.
    assert_eq!(rows.iter().filter(|r| r.provider == "shared").count(), 20);
}

#[test]
fn concurrent_writers_on_threads_never_fail_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sessions.sqlite3");
    let tags = ["t0", "t1", "t2"];
    std::thread::scope(|s| {
        for tag in tags {
            let path = &path;
            s.spawn(move || hammer(path, tag));
        }
    });
    check_hammered(&path, &tags);
}

const CHILD_FILE: &str = "ACPD_STORE_TEST_FILE";
const CHILD_TAG: &str = "ACPD_STORE_TEST_TAG";

/// The other process of `concurrent_writers_in_processes_never_fail_busy`; a no-op when the
/// test binary runs it on its own.
#[test]
fn child_writer() {
    if let (Some(path), Some(tag)) = (std::env::var_os(CHILD_FILE), std::env::var(CHILD_TAG).ok()) {
        hammer(Path::new(&path), &tag);
    }
}

#[test]
fn concurrent_writers_in_processes_never_fail_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sessions.sqlite3");
    let exe = std::env::current_exe().unwrap();
    // Several children at once: opening a new file together is a race of its own.
    let tags = ["p0", "p1", "p2", "p3", "p4"];
    let children: Vec<_> = tags[1..]
        .iter()
        .map(|tag| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "store::tests::on_disk::child_writer",
                    "--test-threads=1",
                ])
                .env(CHILD_FILE, &path)
                .env(CHILD_TAG, tag)
                .stdout(Stdio::piped())
                // libtest reports a failing test's panic on stdout.
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // This process writes too, while the children do.
    hammer(&path, tags[0]);
    for mut child in children {
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        // Judged by its report, not its status: another test of this binary starts acpd's
        // reaper, which may reap this child first (ECHILD here).
        let _ = child.wait();
        // "1 passed" also shows the filter matched: the test ran, it was not skipped.
        assert!(
            out.contains("test result: ok. 1 passed"),
            "child failed:\n{out}"
        );
    }
    check_hammered(&path, &tags);
}

/// A file of schema 1 (no owners) is brought up to date: its rows stay the file user's.
#[test]
fn schema_one_rows_become_the_file_users() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.sqlite3");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE sessions (acpd_id TEXT PRIMARY KEY NOT NULL, provider TEXT NOT NULL,
               child_session_id TEXT NOT NULL, cwd BLOB NOT NULL, title TEXT,
               updated_at TEXT NOT NULL, UNIQUE (provider, child_session_id));
             CREATE INDEX sessions_by_time ON sessions (updated_at DESC, acpd_id);
             CREATE TABLE probes (provider TEXT PRIMARY KEY NOT NULL,
               fingerprint TEXT NOT NULL, value TEXT NOT NULL, updated_at TEXT NOT NULL);
             INSERT INTO sessions VALUES ('acpd-old', 'echo', 'c', CAST('/w' AS BLOB), NULL,
               '2026-01-01T00:00:00.000Z');
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let got = rt
        .block_on(store.get_owned("acpd-old", me()))
        .unwrap()
        .unwrap();
    assert_eq!((got.owner, got.lease), (me(), None));
}

/// The session map: a 0755 state dir and a 0644 `sessions.sqlite3` from before are
/// tightened; a symlink planted at the file or at the dir is refused with an error naming
/// it, and its target is neither written nor chmodded.
#[test]
fn the_session_store_is_private_and_never_opened_through_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let db = dir.join("sessions.sqlite3");
    drop(Store::open(&db).unwrap());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(Store::open(&db).unwrap());
    assert_eq!((mode(&dir), mode(&db)), (0o700, 0o600));

    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir2 = tmp.path().join("state2");
    crate::private_fs::private_dir(&dir2).unwrap();
    let planted = dir2.join("sessions.sqlite3");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let e = Store::open(&planted).unwrap_err().to_string();
    assert!(
        e.contains(&planted.display().to_string()) && e.contains("symlink"),
        "{e}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(mode(&victim), 0o644);

    // A link planted at the WAL is refused too (SQLite would open it by name).
    let dir3 = tmp.path().join("state3");
    crate::private_fs::private_dir(&dir3).unwrap();
    std::os::unix::fs::symlink(&victim, dir3.join("sessions.sqlite3-wal")).unwrap();
    let e = Store::open(&dir3.join("sessions.sqlite3"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sessions.sqlite3-wal"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = tmp.path().join("linked-state");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let e = Store::open(&link.join("sessions.sqlite3"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&link.display().to_string()) && e.contains("symlink"),
        "{e}"
    );
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    assert_eq!(mode(&elsewhere), 0o755);
}
