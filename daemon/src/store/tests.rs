#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::json;

use super::*;

fn row(id: &str, provider: &str, child: &str, cwd: &str, updated_at: &str) -> SessionRow {
    SessionRow {
        acpd_id: id.into(),
        provider: provider.into(),
        child_session_id: child.into(),
        cwd: PathBuf::from(cwd),
        title: Some(format!("title of {id}")),
        updated_at: updated_at.into(),
        owner: me(),
        lease: None,
    }
}

/// The owner of rows this process adopts.
fn me() -> u32 {
    nix::unistd::Uid::effective().as_raw()
}

fn ids(rows: &[SessionRow]) -> Vec<&str> {
    rows.iter().map(|r| r.acpd_id.as_str()).collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn rows_round_trip() {
    let store = Store::in_memory();
    let a = row("acpd-a", "echo", "c1", "/w", "2026-12-01T10:00:00Z");
    store.insert(a.clone()).await.unwrap();
    assert_eq!(store.get("acpd-a").await.unwrap(), Some(a.clone()));
    assert_eq!(store.get("acpd-b").await.unwrap(), None);

    // Insert again replaces by acpd id.
    let a2 = SessionRow {
        title: None,
        ..a.clone()
    };
    store.insert(a2.clone()).await.unwrap();
    assert_eq!(store.get("acpd-a").await.unwrap(), Some(a2));

    // One child session, one acpd id.
    let clash = row("acpd-other", "echo", "c1", "/w", "2026-12-01T10:00:00Z");
    let err = store.insert(clash).await.unwrap_err();
    assert!(matches!(err, StoreError::Query { .. }), "{err}");
    assert!(err.to_string().contains(":memory:"), "{err}");

    assert!(store.remove("acpd-a").await.unwrap());
    assert!(!store.remove("acpd-a").await.unwrap());
    assert_eq!(store.get("acpd-a").await.unwrap(), None);
}

#[tokio::test]
async fn non_utf8_cwd_comes_back_exact() {
    use std::os::unix::ffi::OsStrExt as _;
    let store = Store::in_memory();
    let cwd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xffbad"));
    let r = SessionRow {
        cwd: cwd.clone(),
        ..row("acpd-a", "echo", "c1", "/", "2026-12-01T10:00:00Z")
    };
    store.insert(r.clone()).await.unwrap();
    assert_eq!(store.list(Some(&cwd), me()).await.unwrap(), vec![r]);
}

#[tokio::test]
async fn touch_bumps_time_and_keeps_or_replaces_title() {
    let store = Store::in_memory();
    store
        .insert(row("acpd-a", "echo", "c1", "/w", "2000-01-01T00:00:00Z"))
        .await
        .unwrap();
    store.touch("acpd-a", me(), None).await.unwrap();
    let got = store.get("acpd-a").await.unwrap().unwrap();
    assert_eq!(got.title.as_deref(), Some("title of acpd-a"));
    assert!(
        got.updated_at.as_str() > "2000-01-01T00:00:00Z",
        "{}",
        got.updated_at
    );
    assert!(humantime::parse_rfc3339(&got.updated_at).is_ok());
    assert_eq!(got.updated_at.len(), "2026-12-01T10:00:00.000Z".len());

    store
        .touch("acpd-a", me(), Some("new".into()))
        .await
        .unwrap();
    let got = store.get("acpd-a").await.unwrap().unwrap();
    assert_eq!(got.title.as_deref(), Some("new"));

    // Unknown ids are fine.
    store
        .touch("acpd-nope", me(), Some("x".into()))
        .await
        .unwrap();
    assert_eq!(store.get("acpd-nope").await.unwrap(), None);
}

#[tokio::test]
async fn list_is_newest_first_then_by_id_and_filters_on_cwd() {
    let store = Store::in_memory();
    for r in [
        row("acpd-b", "echo", "c1", "/w", "2026-12-01T10:00:00Z"),
        row("acpd-a", "echo", "c2", "/w", "2026-12-01T10:00:00Z"),
        row("acpd-c", "echo", "c3", "/other", "2026-12-01T11:00:00Z"),
        row("acpd-d", "codex", "c1", "/w/sub", "2026-11-30T09:00:00Z"),
    ] {
        store.insert(r).await.unwrap();
    }
    let all = store.list(None, me()).await.unwrap();
    assert_eq!(ids(&all), ["acpd-c", "acpd-a", "acpd-b", "acpd-d"]);
    let w = store.list(Some(Path::new("/w")), me()).await.unwrap();
    assert_eq!(ids(&w), ["acpd-a", "acpd-b"]);
    assert!(
        store
            .list(Some(Path::new("/none")), me())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn adopt_is_idempotent_and_refreshes() {
    let store = Store::in_memory();
    let id = store
        .adopt(
            "codex",
            "child-1",
            Path::new("/w"),
            Some("first".into()),
            Some("2026-12-01T10:00:00.250Z".into()),
        )
        .await
        .unwrap();
    assert!(id.starts_with("acpd-"), "{id}");
    assert!(uuid::Uuid::parse_str(&id["acpd-".len()..]).is_ok(), "{id}");
    let got = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        got,
        SessionRow {
            acpd_id: id.clone(),
            provider: "codex".into(),
            child_session_id: "child-1".into(),
            cwd: "/w".into(),
            title: Some("first".into()),
            updated_at: "2026-12-01T10:00:00.250Z".into(),
            owner: me(),
            lease: None,
        }
    );

    // Same session listed again: same id; no title or time keeps the stored ones.
    let again = store
        .adopt("codex", "child-1", Path::new("/w2"), None, None)
        .await
        .unwrap();
    assert_eq!(again, id);
    let got = store.get(&id).await.unwrap().unwrap();
    assert_eq!(got.title.as_deref(), Some("first"));
    assert_eq!(got.updated_at, "2026-12-01T10:00:00.250Z");
    assert_eq!(got.cwd, Path::new("/w2"));

    // A newer listing replaces both.
    store
        .adopt(
            "codex",
            "child-1",
            Path::new("/w2"),
            Some("renamed".into()),
            Some("2026-12-01T12:30:00+01:00".into()),
        )
        .await
        .unwrap();
    let got = store.get(&id).await.unwrap().unwrap();
    assert_eq!(got.title.as_deref(), Some("renamed"));
    assert_eq!(got.updated_at, "2026-12-01T11:30:00.000Z");

    // Another provider's session of the same child id is another session.
    let other = store
        .adopt("claude", "child-1", Path::new("/w"), None, None)
        .await
        .unwrap();
    assert_ne!(other, id);
    let got = store.get(&other).await.unwrap().unwrap();
    assert!(humantime::parse_rfc3339(&got.updated_at).is_ok());
    assert_eq!(store.list(None, me()).await.unwrap().len(), 2);
}

#[test]
fn child_times_are_normalised() {
    let cases = [
        ("2026-12-01T10:00:00Z", "2026-12-01T10:00:00.000Z"),
        ("2026-12-01T10:00:00.999999Z", "2026-12-01T10:00:00.999Z"),
        ("2026-12-01T10:00:00+00:00", "2026-12-01T10:00:00.000Z"),
        ("2026-12-01T10:00:00.5+05:30", "2026-12-01T04:30:00.500Z"),
        ("2026-12-01T10:00:00.5+00:00", "2026-12-01T10:00:00.500Z"),
        ("2026-12-01T10:00:00-00:00", "2026-12-01T10:00:00.000Z"),
        ("2026-12-01T23:00:00-02:00", "2026-12-02T01:00:00.000Z"),
        ("2026-12-01 10:00:00", "2026-12-01T10:00:00.000Z"),
    ];
    for (text, want) in cases {
        assert_eq!(normalize_time(text), want, "{text}");
    }
    for bad in [
        "yesterday",
        "",
        "2026-12-01T10:00:00+1:000",
        "2026-12-01T10:00:00+24:00",
    ] {
        let got = normalize_time(bad);
        assert!(humantime::parse_rfc3339(&got).is_ok(), "{bad} -> {got}");
        assert!(got.as_str() > "2020", "{bad} -> {got}");
    }
}

#[tokio::test]
async fn forget_unlisted_removes_only_that_providers_missing_rows() {
    let store = Store::in_memory();
    for (p, c) in [
        ("codex", "a"),
        ("codex", "b"),
        ("codex", "c"),
        ("claude", "a"),
    ] {
        store
            .adopt(p, c, Path::new("/w"), None, None)
            .await
            .unwrap();
    }
    let gone = store
        .forget_unlisted("codex", &["b".into(), "zzz".into()], None)
        .await
        .unwrap();
    assert_eq!(gone, 2);
    let mut left: Vec<(String, String)> = store
        .list(None, me())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.provider, r.child_session_id))
        .collect();
    left.sort();
    assert_eq!(
        left,
        [("claude".into(), "a".into()), ("codex".into(), "b".into())]
    );
    assert_eq!(
        store
            .forget_unlisted("codex", &["b".into()], None)
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.forget_unlisted("nobody", &[], None).await.unwrap(), 0);
    assert_eq!(store.forget_unlisted("claude", &[], None).await.unwrap(), 1);
}

#[tokio::test]
async fn probe_cache_is_keyed_by_fingerprint() {
    let store = Store::in_memory();
    assert_eq!(store.probe_get("codex", "f1").await.unwrap(), None);
    let v1 = json!({"agentCapabilities": {"loadSession": true}, "authMethods": []});
    store.probe_put("codex", "f1", &v1).await.unwrap();
    assert_eq!(
        store.probe_get("codex", "f1").await.unwrap(),
        Some(v1.clone())
    );
    assert_eq!(store.probe_get("codex", "f2").await.unwrap(), None);
    assert_eq!(store.probe_get("claude", "f1").await.unwrap(), None);

    let v2 = json!({"agentCapabilities": {}});
    store.probe_put("codex", "f2", &v2).await.unwrap();
    assert_eq!(store.probe_get("codex", "f2").await.unwrap(), Some(v2));
    assert_eq!(store.probe_get("codex", "f1").await.unwrap(), None);
}

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
                .args(["--exact", "store::tests::child_writer", "--test-threads=1"])
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

/// Another user's session is not there for them: not got, listed, touched or claimed.
#[tokio::test]
async fn rows_are_their_owners_only() {
    let store = Store::in_memory();
    let theirs = SessionRow {
        owner: 4242,
        ..row("acpd-t", "echo", "c1", "/w", "2026-12-01T10:00:00Z")
    };
    store.insert(theirs.clone()).await.unwrap();
    store
        .insert(row("acpd-m", "echo", "c2", "/w", "2026-12-01T09:00:00Z"))
        .await
        .unwrap();
    assert_eq!(store.get_owned("acpd-t", me()).await.unwrap(), None);
    assert_eq!(
        store.get_owned("acpd-t", 4242).await.unwrap(),
        Some(theirs.clone())
    );
    assert_eq!(ids(&store.list(None, me()).await.unwrap()), ["acpd-m"]);
    assert_eq!(ids(&store.list(None, 4242).await.unwrap()), ["acpd-t"]);
    store
        .touch("acpd-t", me(), Some("mine now".into()))
        .await
        .unwrap();
    assert_eq!(store.get("acpd-t").await.unwrap(), Some(theirs));
    let holder = Holder::me();
    assert_eq!(
        store.claim("acpd-t", me(), &holder).await.unwrap(),
        Claim::Unknown
    );
    assert_eq!(store.get("acpd-t").await.unwrap().unwrap().lease, None);
}

/// A lease is taken when free, kept by its live holder against others, taken over from a
/// dead one, and released only by its holder.
#[tokio::test]
async fn leases_hold_one_live_process_and_pass_from_the_dead() {
    let store = Store::in_memory();
    store
        .insert(row("acpd-a", "echo", "c1", "/w", "2026-12-01T10:00:00Z"))
        .await
        .unwrap();
    let me_now = Holder::me();
    // Another live process: this test's parent (cargo) is alive and is not us.
    let ppid = nix::unistd::getppid().as_raw();
    let other = Holder {
        pid: ppid,
        start: crate::supervise::start_time(ppid).unwrap(),
        boot: me_now.boot.clone(),
    };
    assert!(other.alive());
    assert_eq!(
        store.claim("acpd-a", me(), &other).await.unwrap(),
        Claim::Held
    );
    assert_eq!(
        store.claim("acpd-a", me(), &me_now).await.unwrap(),
        Claim::Elsewhere(other.clone())
    );
    // Not ours to release.
    store.release("acpd-a", &me_now).await.unwrap();
    assert_eq!(
        store.get("acpd-a").await.unwrap().unwrap().lease,
        Some(other.clone())
    );
    // Its holder re-claims (idempotent), then releases: free for us.
    assert_eq!(
        store.claim("acpd-a", me(), &other).await.unwrap(),
        Claim::Held
    );
    store.release("acpd-a", &other).await.unwrap();
    assert_eq!(
        store.claim("acpd-a", me(), &me_now).await.unwrap(),
        Claim::Held
    );
    // A dead holder (a start time that pid never had, or another boot) is taken over.
    for dead in [
        Holder {
            start: other.start + 1,
            ..other.clone()
        },
        Holder {
            boot: "another-boot".into(),
            ..other.clone()
        },
    ] {
        assert!(!dead.alive());
        store.release("acpd-a", &me_now).await.unwrap();
        assert_eq!(
            store.claim("acpd-a", me(), &dead).await.unwrap(),
            Claim::Held
        );
        assert_eq!(
            store.claim("acpd-a", me(), &me_now).await.unwrap(),
            Claim::Held
        );
    }
}

/// Titles are capped on a character boundary; a listing keeps a provider's newest `max` rows.
#[tokio::test]
async fn titles_are_capped_and_listings_bounded() {
    let store = Store::in_memory();
    let long = "é".repeat(MAX_TITLE); // 2 bytes each
    store
        .insert(SessionRow {
            title: Some(long.clone()),
            ..row("acpd-a", "echo", "c1", "/w", "2026-12-01T10:00:00Z")
        })
        .await
        .unwrap();
    let got = store.get("acpd-a").await.unwrap().unwrap().title.unwrap();
    assert_eq!(got.len(), MAX_TITLE);
    assert_eq!(cap_title(format!("a{long}")).len(), MAX_TITLE - 1);
    store.touch("acpd-a", me(), Some(long)).await.unwrap();
    assert_eq!(
        store
            .get("acpd-a")
            .await
            .unwrap()
            .unwrap()
            .title
            .unwrap()
            .len(),
        MAX_TITLE
    );

    let page = |from: usize| -> Vec<Listed> {
        (from..from + 10)
            .map(|i| Listed {
                child_session_id: format!("c{i}"),
                cwd: "/w".into(),
                title: Some("x".repeat(3 * MAX_TITLE)),
                updated_at: Some(format!("2026-12-01T10:00:{:02}Z", i % 60)),
            })
            .collect()
    };
    for round in 0..5 {
        let ids = store
            .adopt_listing("flood", page(100 + round * 10), 7)
            .await
            .unwrap();
        assert_eq!(ids.len(), 10);
        let rows: Vec<SessionRow> = store
            .list(None, me())
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.provider == "flood")
            .collect();
        assert_eq!(rows.len(), 7, "round {round}");
        assert!(
            rows.iter()
                .all(|r| r.title.as_ref().unwrap().len() == MAX_TITLE)
        );
    }
    // Other providers' rows are not touched by one's bound.
    assert!(store.get("acpd-a").await.unwrap().is_some());
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

/// Hostile review of issue 18: a `session/list` refresh that filed a child session before the
/// `session/new` that made it inserted its row (the agent lists it already) took the child
/// session's one acpd id, and the opener's insert failed on the unique key: they lost their
/// own id. The opener's insert wins over a row only a listing brought in, and takes it over.
#[tokio::test]
async fn a_listed_row_gives_way_to_the_session_its_opener_files() {
    let store = Store::in_memory();
    let listed = store
        .adopt("echo", "c1", Path::new("/w"), None, None)
        .await
        .unwrap();
    let opener = me().wrapping_add(1);
    store
        .insert(SessionRow {
            owner: opener,
            lease: Some(Holder::me()),
            ..row("acpd-mine", "echo", "c1", "/w", "2026-12-01T10:00:00Z")
        })
        .await
        .expect("the opener's insert failed on the listed row");
    let got = store.get_owned("acpd-mine", opener).await.unwrap().unwrap();
    assert_eq!(got.child_session_id, "c1");
    assert_eq!(
        store.get(&listed).await.unwrap(),
        None,
        "two ids for one child session"
    );
    // The next listing files the child session under the opener's id, still theirs.
    let again = store
        .adopt("echo", "c1", Path::new("/w"), Some("t".into()), None)
        .await
        .unwrap();
    assert_eq!(again, "acpd-mine");
    assert_eq!(store.get("acpd-mine").await.unwrap().unwrap().owner, opener);
    // A row someone opened never gives way to another opener's claim on its child session.
    let err = store
        .insert(row(
            "acpd-thief",
            "echo",
            "c1",
            "/w",
            "2026-12-01T10:00:00Z",
        ))
        .await;
    assert!(err.is_err());
    assert_eq!(store.get("acpd-mine").await.unwrap().unwrap().owner, opener);
}

/// Hostile review of issue 18: the bound on what an agent lists (`max_listed_sessions`) cut the
/// provider's rows of every owner, newest first, so an agent listing many sessions with a
/// future `updatedAt` pushed out the rows users had opened. The bound counts and cuts only
/// rows the listing brought in; a cut listing forgets none that someone opened.
#[tokio::test]
async fn the_bound_never_forgets_a_row_someone_opened() {
    let store = Store::in_memory();
    let other = me().wrapping_add(1);
    store
        .insert(SessionRow {
            owner: other,
            ..row(
                "acpd-theirs",
                "flood",
                "t",
                "/w",
                "2026-01-01T00:00:00.000Z",
            )
        })
        .await
        .unwrap();
    store
        .insert(row(
            "acpd-mine",
            "flood",
            "m",
            "/w",
            "2026-01-01T00:00:00.000Z",
        ))
        .await
        .unwrap();
    // A listed row loaded by its owner is theirs now: out of the bound too.
    let loaded = store
        .adopt(
            "flood",
            "l",
            Path::new("/w"),
            None,
            Some("2026-01-01T00:00:00Z".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        store.claim(&loaded, me(), &Holder::me()).await.unwrap(),
        Claim::Held
    );
    store.release(&loaded, &Holder::me()).await.unwrap();
    let future: Vec<Listed> = (0..20)
        .map(|i| Listed {
            child_session_id: format!("f{i}"),
            cwd: "/w".into(),
            title: None,
            updated_at: Some("2999-01-01T00:00:00Z".into()),
        })
        .collect();
    store.adopt_listing("flood", future, 5).await.unwrap();
    let listed: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
    store.forget_unlisted("flood", &listed, None).await.unwrap();
    for id in ["acpd-theirs", "acpd-mine", loaded.as_str()] {
        assert!(store.get(id).await.unwrap().is_some(), "{id} was forgotten");
    }
    let listed_rows = store.list(None, me()).await.unwrap().len() - 2;
    assert!(
        listed_rows <= 5,
        "{listed_rows} listed rows kept past the bound of 5"
    );
}

/// Opened rows follow "ids the agent stops listing are forgotten" only on a whole listing, and
/// only when written before the listing began and not live in any acpd: a `session/new`
/// racing the listing keeps its row.
#[tokio::test]
async fn a_whole_listing_forgets_an_opened_row_only_when_older_and_not_held() {
    let store = Store::in_memory();
    store
        .insert(row(
            "acpd-old",
            "p",
            "old",
            "/w",
            "2026-01-01T00:00:00.000Z",
        ))
        .await
        .unwrap();
    store
        .insert(SessionRow {
            lease: Some(Holder::me()),
            ..row("acpd-live", "p", "live", "/w", "2026-01-01T00:00:00.000Z")
        })
        .await
        .unwrap();
    store
        .insert(row(
            "acpd-new",
            "p",
            "new",
            "/w",
            "2026-06-01T00:00:00.000Z",
        ))
        .await
        .unwrap();
    let since = "2026-03-01T00:00:00.000Z";
    assert_eq!(
        store.forget_unlisted("p", &[], None).await.unwrap(),
        0,
        "a cut listing forgot an opened row"
    );
    assert_eq!(
        store.forget_unlisted("p", &[], Some(since)).await.unwrap(),
        1
    );
    assert_eq!(store.get("acpd-old").await.unwrap(), None);
    assert!(store.get("acpd-live").await.unwrap().is_some());
    assert!(store.get("acpd-new").await.unwrap().is_some());
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
