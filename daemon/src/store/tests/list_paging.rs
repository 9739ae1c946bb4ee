//! What an agent's listing brings into the map and takes out of it.

use super::*;
use crate::store::timestamps::normalize_time;

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
    let opener = RowOwner::uid(me().uid.wrapping_add(1));
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
    let other = RowOwner::uid(me().uid.wrapping_add(1));
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
