//! Network tokens: who may reach acpd over its network face, each a principal whose sessions
//! are its own. A token is 256 random bits from the OS, shown once as `acpd_` + 43 base64url
//! characters (the prefix lets acpd recognise one put where tokens must never go); the state
//! DB keeps only its SHA-256, its name and role, when it was made, used, revoked and when it
//! expires.
//!
//! - This file: [`Role`], [`mint`], and [`TokenBook`], the daemon's view of the table, read
//!   into memory so a request is checked without a query, and read again on
//!   [`TokenBook::reload`] (`acpd token create`/`revoke` ask for it over the socket).
//! - `table.rs`: the table's queries (create, list, revoke, read all, mark used).

// Until the network face (runtime/http/) lands, only tests verify a token.
#![cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "verify, is_live and changed are the network face's"
    )
)]

mod table;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use sha2::Digest as _;

pub(crate) use table::{Revoked, TokenRow};

use super::{Store, StoreError};

/// What a token's holder may do: drive sessions, or only watch them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Controller,
    Observer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Controller => "controller",
            Role::Observer => "observer",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "controller" => Some(Role::Controller),
            "observer" => Some(Role::Observer),
            _ => None,
        }
    }
}

/// What every token starts with.
pub(crate) const PREFIX: &str = "acpd_";
/// The random part, in bytes (256 bits).
const SECRET_BYTES: usize = 32;
/// A token's length: the prefix and 32 bytes in unpadded base64.
const TOKEN_LEN: usize = PREFIX.len() + SECRET_BYTES.div_ceil(3) * 4 - 1;
/// The longest token name, in bytes.
pub(crate) const MAX_NAME: usize = 64;

/// A new token's text: [`PREFIX`] and 32 bytes from the OS's random source, base64url.
pub(crate) fn mint() -> Result<String, StoreError> {
    let mut secret = [0u8; SECRET_BYTES];
    getrandom::fill(&mut secret).map_err(|e| StoreError::Random {
        reason: e.to_string(),
    })?;
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    Ok(format!("{PREFIX}{text}"))
}

/// What is stored of a token: the SHA-256 of its whole text.
pub(crate) fn digest(token: &str) -> [u8; 32] {
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// `Err` saying why when `name` is not a token name: 1 to [`MAX_NAME`] ASCII letters, digits,
/// `-`, `_` and `.`, starting with a letter or digit (a name is typed on command lines and
/// shown in tables and logs, so nothing there may be a control, a space or look like a flag).
pub(crate) fn check_name(name: &str) -> Result<(), StoreError> {
    let bad = |why: &str| {
        Err(StoreError::TokenName {
            name: name.to_owned(),
            why: why.to_owned(),
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME {
        return bad(&format!("it is longer than {MAX_NAME} bytes"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return bad("it must start with a letter or a digit");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return bad(&format!("{c:?} is not a letter, a digit, '-', '_' or '.'"));
    }
    Ok(())
}

/// A token that was accepted: the principal a connection authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGrant {
    pub id: i64,
    pub name: Arc<str>,
    pub role: Role,
    /// When it stops being accepted (a connection using it should end then too).
    pub expires: Option<SystemTime>,
}

/// Why a bearer token was refused. The face answers each with 401 alike; the kind is for the
/// log and the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenRefusal {
    #[error("unknown token")]
    Unknown,
    #[error("revoked token")]
    Revoked,
    #[error("expired token")]
    Expired,
}

/// How often a token's last use is written to the DB, at most: the list shows it to the
/// minute, and a busy token must not write on every request.
const USED_EVERY: Duration = Duration::from_secs(60);

/// The daemon's tokens, in memory: every token of the table (revoked and expired ones too, so
/// a refusal says which), read at start and on [`TokenBook::reload`]. Clones share it.
#[derive(Clone)]
pub(crate) struct TokenBook {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    known: RwLock<Arc<Known>>,
    changed: tokio::sync::watch::Sender<u64>,
    /// Held from a reload's read to its swap: two reloads at once (a create's and a revoke's)
    /// swap in the order they read, so an older read never puts a revoked token back.
    reloading: tokio::sync::Mutex<()>,
    /// When each token's use was last written.
    used: Mutex<HashMap<i64, Instant>>,
}

#[derive(Default)]
struct Known {
    by_digest: HashMap<[u8; 32], Arc<Entry>>,
    by_id: HashMap<i64, Arc<Entry>>,
}

struct Entry {
    grant: TokenGrant,
    revoked: bool,
}

impl Entry {
    fn refusal(&self, now: SystemTime) -> Option<TokenRefusal> {
        if self.revoked {
            Some(TokenRefusal::Revoked)
        } else if self.grant.expires.is_some_and(|at| at <= now) {
            Some(TokenRefusal::Expired)
        } else {
            None
        }
    }
}

impl std::fmt::Debug for TokenBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known = self.known();
        f.debug_struct("TokenBook")
            .field("tokens", &known.by_id.len())
            .finish()
    }
}

impl TokenBook {
    /// A book of `store`'s tokens, empty until [`TokenBook::reload`] reads them.
    pub(crate) fn new(store: Store) -> TokenBook {
        TokenBook {
            inner: Arc::new(Inner {
                store,
                known: RwLock::default(),
                changed: tokio::sync::watch::channel(0).0,
                reloading: tokio::sync::Mutex::new(()),
                used: Mutex::default(),
            }),
        }
    }

    /// A book of `store`'s tokens, read now.
    pub(crate) async fn open(store: Store) -> Result<TokenBook, StoreError> {
        let book = TokenBook::new(store);
        book.reload().await?;
        Ok(book)
    }

    fn known(&self) -> Arc<Known> {
        self.inner
            .known
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The grant of `bearer` (the whole `acpd_…` text), when it is a live token: known, not
    /// revoked, not expired by the clock now. No query: the table was read by the last reload.
    pub(crate) fn verify(&self, bearer: &str) -> Result<TokenGrant, TokenRefusal> {
        // Nothing else is worth hashing (a header may be long).
        if bearer.len() != TOKEN_LEN || !bearer.starts_with(PREFIX) {
            return Err(TokenRefusal::Unknown);
        }
        let known = self.known();
        let entry = known
            .by_digest
            .get(&digest(bearer))
            .ok_or(TokenRefusal::Unknown)?;
        if let Some(refusal) = entry.refusal(SystemTime::now()) {
            return Err(refusal);
        }
        self.note_used(entry.grant.id);
        Ok(entry.grant.clone())
    }

    /// Whether token `id` is still accepted (not revoked since, not expired by now): what a
    /// live connection checks when [`TokenBook::changed`] fires.
    pub(crate) fn is_live(&self, id: i64) -> bool {
        self.known()
            .by_id
            .get(&id)
            .is_some_and(|e| e.refusal(SystemTime::now()).is_none())
    }

    /// Bumped after each reload: a connection holding a token watches it to end itself when
    /// its token is revoked.
    pub(crate) fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Reads the table again and tells the watchers. On an error the book keeps what it had.
    pub(crate) async fn reload(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.inner.reloading.lock().await;
        let rows = self.inner.store.token_digests().await?;
        let mut known = Known::default();
        for (row, digest) in rows {
            let entry = Arc::new(Entry {
                revoked: row.revoked_at.is_some(),
                grant: TokenGrant {
                    id: row.id,
                    name: row.name.into(),
                    role: row.role,
                    expires: row.expires,
                },
            });
            known.by_id.insert(entry.grant.id, entry.clone());
            known.by_digest.insert(digest, entry);
        }
        *self
            .inner
            .known
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(known);
        self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    /// Writes token `id`'s last use, at most once per [`USED_EVERY`], off the caller's task.
    fn note_used(&self, id: i64) {
        let now = Instant::now();
        {
            let mut used = self
                .inner
                .used
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if used
                .get(&id)
                .is_some_and(|at| now.duration_since(*at) < USED_EVERY)
            {
                return;
            }
            used.insert(id, now);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.inner.store.clone();
        runtime.spawn(async move {
            if let Err(e) = store.token_used(id).await {
                tracing::warn!(token = id, "cannot record the token's last use: {e}");
            }
        });
    }
}
