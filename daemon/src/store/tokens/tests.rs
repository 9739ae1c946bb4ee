//! The tokens' table and book: what is made, what is accepted and refused, and what reaches
//! the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime};

use super::*;

#[tokio::test]
async fn a_created_token_is_accepted_and_names_its_grant() {
    let store = Store::in_memory();
    let (row, token) = store
        .create_token("laptop", Role::Observer, None)
        .await
        .unwrap();
    assert!(token.starts_with("acpd_"), "{token}");
    assert_eq!(token.len(), PREFIX.len() + 43, "{token}");
    assert!(
        token[PREFIX.len()..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "{token}"
    );
    let book = TokenBook::open(store.clone()).await.unwrap();
    let grant = book.verify(&token).unwrap();
    assert_eq!(
        grant,
        TokenGrant {
            id: row.id,
            name: "laptop".into(),
            role: Role::Observer,
            expires: None
        }
    );
    assert!(book.is_live(row.id));
    // Anything else is unknown: another token, the token cut or extended, its hash.
    let (_, other) = store
        .create_token("phone", Role::Controller, None)
        .await
        .unwrap();
    assert_eq!(
        book.verify(&other),
        Err(TokenRefusal::Unknown),
        "not reloaded yet"
    );
    for wrong in [
        &token[..token.len() - 1],
        &format!("{token}x"),
        &token[PREFIX.len()..],
        "",
    ] {
        assert_eq!(book.verify(wrong), Err(TokenRefusal::Unknown), "{wrong:?}");
    }
    book.reload().await.unwrap();
    assert_eq!(book.verify(&other).unwrap().role, Role::Controller);
}

#[tokio::test]
async fn two_tokens_are_never_the_same() {
    let store = Store::in_memory();
    let (_, a) = store
        .create_token("a", Role::Controller, None)
        .await
        .unwrap();
    let (_, b) = store
        .create_token("b", Role::Controller, None)
        .await
        .unwrap();
    assert_ne!(a, b);
}

#[tokio::test]
async fn a_revoked_token_is_refused_after_the_reload_that_tells_watchers() {
    let store = Store::in_memory();
    let (row, token) = store
        .create_token("ci", Role::Controller, None)
        .await
        .unwrap();
    let book = TokenBook::open(store.clone()).await.unwrap();
    let mut changed = book.changed();
    let seen = *changed.borrow_and_update();
    assert_eq!(store.revoke_token("ci").await.unwrap(), Revoked::Now);
    assert_eq!(store.revoke_token("ci").await.unwrap(), Revoked::Already);
    book.reload().await.unwrap();
    assert!(changed.has_changed().unwrap());
    assert_ne!(*changed.borrow_and_update(), seen);
    assert_eq!(book.verify(&token), Err(TokenRefusal::Revoked));
    assert!(!book.is_live(row.id));
    // Its name is free again, for a new token with a new id; the old one stays revoked.
    let (again, fresh) = store
        .create_token("ci", Role::Controller, None)
        .await
        .unwrap();
    assert_ne!(again.id, row.id);
    book.reload().await.unwrap();
    assert_eq!(book.verify(&token), Err(TokenRefusal::Revoked));
    assert_eq!(book.verify(&fresh).unwrap().id, again.id);
    let err = store.revoke_token("nobody").await.unwrap_err();
    assert!(err.to_string().contains("no token named nobody"), "{err}");
}

#[tokio::test]
async fn an_expired_token_is_refused_by_the_clock_and_frees_its_name() {
    let store = Store::in_memory();
    let soon = SystemTime::now() + Duration::from_secs(3600);
    let (row, token) = store
        .create_token("short", Role::Controller, Some(soon))
        .await
        .unwrap();
    let past = SystemTime::now() - Duration::from_secs(1);
    let (gone, old) = store
        .create_token("old", Role::Controller, Some(past))
        .await
        .unwrap();
    let book = TokenBook::open(store.clone()).await.unwrap();
    let grant = book.verify(&token).unwrap();
    // Kept to the second.
    let off = grant
        .expires
        .unwrap()
        .duration_since(soon)
        .unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(1), "{off:?}");
    assert!(book.is_live(row.id));
    assert_eq!(book.verify(&old), Err(TokenRefusal::Expired));
    assert!(!book.is_live(gone.id));
    store
        .create_token("old", Role::Observer, None)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_live_name_is_taken_and_bad_names_are_refused() {
    let store = Store::in_memory();
    store
        .create_token("dev.box-1_a", Role::Controller, None)
        .await
        .unwrap();
    let err = store
        .create_token("dev.box-1_a", Role::Controller, None)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("a token named dev.box-1_a exists already")
            && err.to_string().contains("acpd token revoke dev.box-1_a"),
        "{err}"
    );
    let long = "a".repeat(MAX_NAME + 1);
    for bad in ["", "-x", ".x", "a b", "a/b", "é", "a\nb", long.as_str()] {
        let err = store
            .create_token(bad, Role::Controller, None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::TokenName { .. }),
            "{bad:?}: {err}"
        );
    }
    store
        .create_token(&"a".repeat(MAX_NAME), Role::Controller, None)
        .await
        .unwrap();
    assert_eq!(store.tokens().await.unwrap().len(), 2);
}

/// Only the SHA-256 reaches the disk: the file (and its WAL) holds neither the token nor its
/// random part, in any form a grep finds, but does hold the digest.
#[tokio::test]
async fn only_the_hash_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state").join("sessions.sqlite3");
    let store = Store::open(&path).unwrap();
    let (_, token) = store
        .create_token("laptop", Role::Controller, None)
        .await
        .unwrap();
    let book = TokenBook::open(store.clone()).await.unwrap();
    book.verify(&token).unwrap();
    drop((book, store));
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(path.parent().unwrap()).unwrap() {
        bytes.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    let found = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(found(b"laptop"), "the test reads the right files");
    assert!(found(&digest(&token)), "the digest is what is kept");
    assert!(!found(token.as_bytes()), "the token is on disk");
    assert!(
        !found(&token.as_bytes()[PREFIX.len()..]),
        "its secret is on disk"
    );
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&token[PREFIX.len()..])
        .unwrap();
    assert!(!found(&raw), "its random bytes are on disk");
}

/// A verify writes the token's last use (off the caller's task, at most once a minute).
#[tokio::test]
async fn a_use_is_recorded() {
    let store = Store::in_memory();
    let (_, token) = store
        .create_token("laptop", Role::Controller, None)
        .await
        .unwrap();
    let book = TokenBook::open(store.clone()).await.unwrap();
    assert_eq!(store.tokens().await.unwrap()[0].last_used_at, None);
    book.verify(&token).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.tokens().await.unwrap()[0].last_used_at.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no last use written"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
