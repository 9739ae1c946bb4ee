//! The map's rows: written and read back, touched, listed, owned, leased; and the probe cache.

use serde_json::json;

use super::*;

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

/// Another user's session is not there for them: not got, listed, touched or claimed.
#[tokio::test]
async fn rows_are_their_owners_only() {
    let store = Store::in_memory();
    let theirs = SessionRow {
        owner: RowOwner::uid(4242),
        ..row("acpd-t", "echo", "c1", "/w", "2026-12-01T10:00:00Z")
    };
    store.insert(theirs.clone()).await.unwrap();
    store
        .insert(row("acpd-m", "echo", "c2", "/w", "2026-12-01T09:00:00Z"))
        .await
        .unwrap();
    assert_eq!(store.get_owned("acpd-t", me()).await.unwrap(), None);
    assert_eq!(
        store
            .get_owned("acpd-t", RowOwner::uid(4242))
            .await
            .unwrap(),
        Some(theirs.clone())
    );
    assert_eq!(ids(&store.list(None, me()).await.unwrap()), ["acpd-m"]);
    assert_eq!(
        ids(&store.list(None, RowOwner::uid(4242)).await.unwrap()),
        ["acpd-t"]
    );
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

/// A token's session is not there for acpd's own user (whose uid its row carries), nor for
/// another token, and a user's is not there for a token: not got, listed, touched or claimed.
#[tokio::test]
async fn a_tokens_rows_are_its_own() {
    let store = Store::in_memory();
    let token = |id| RowOwner {
        token: Some(id),
        ..me()
    };
    let theirs = SessionRow {
        owner: token(1),
        ..row("acpd-t", "echo", "c1", "/w", "2026-12-01T10:00:00Z")
    };
    store.insert(theirs.clone()).await.unwrap();
    store
        .insert(row("acpd-m", "echo", "c2", "/w", "2026-12-01T09:00:00Z"))
        .await
        .unwrap();
    assert_eq!(store.get_owned("acpd-t", me()).await.unwrap(), None);
    assert_eq!(store.get_owned("acpd-t", token(2)).await.unwrap(), None);
    assert_eq!(store.get_owned("acpd-m", token(1)).await.unwrap(), None);
    assert_eq!(
        store.get_owned("acpd-t", token(1)).await.unwrap(),
        Some(theirs.clone())
    );
    assert_eq!(ids(&store.list(None, me()).await.unwrap()), ["acpd-m"]);
    assert_eq!(ids(&store.list(None, token(1)).await.unwrap()), ["acpd-t"]);
    assert!(store.list(None, token(2)).await.unwrap().is_empty());
    for owner in [me(), token(2)] {
        store
            .touch("acpd-t", owner, Some("mine now".into()))
            .await
            .unwrap();
        assert_eq!(
            store.claim("acpd-t", owner, &Holder::me()).await.unwrap(),
            Claim::Unknown
        );
    }
    assert_eq!(store.get("acpd-t").await.unwrap(), Some(theirs));
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
