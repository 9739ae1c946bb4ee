//! The `tokens` table: one row per token ever made (a revoked one stays, so its sessions stay
//! nobody else's and its id is never given again: `AUTOINCREMENT`). Only the SHA-256 of a
//! token is written.

use std::time::{Duration, SystemTime};

use rusqlite::{TransactionBehavior, params};

use super::{Role, check_name, digest, mint};
use crate::store::timestamps::now;
use crate::store::{Store, StoreError};

/// A token as `acpd token list` shows it: never its text nor its hash.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRow {
    pub id: i64,
    pub name: String,
    pub role: Role,
    /// RFC 3339 UTC, as the map writes times.
    pub created_at: String,
    pub expires: Option<SystemTime>,
    pub revoked_at: Option<String>,
    pub last_used_at: Option<String>,
}

/// What [`Store::revoke_token`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// It was accepted until now.
    Now,
    /// Every token of that name was revoked already.
    Already,
}

const COLUMNS: &str = "id, name, role, created_at, expires_at, revoked_at, last_used_at";

fn token_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TokenRow> {
    let role: String = r.get(2)?;
    let expires: Option<i64> = r.get(4)?;
    Ok(TokenRow {
        id: r.get(0)?,
        name: r.get(1)?,
        // A role this acpd does not know (written by a newer one) grants the least.
        role: Role::parse(&role).unwrap_or(Role::Observer),
        created_at: r.get(3)?,
        expires: expires.map(from_unix),
        revoked_at: r.get(5)?,
        last_used_at: r.get(6)?,
    })
}

fn unix(t: SystemTime) -> i64 {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn from_unix(secs: i64) -> SystemTime {
    let secs = u64::try_from(secs).unwrap_or(0);
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

impl Store {
    /// Makes token `name` and returns its row and its text, the one time the text exists
    /// outside the caller. Refused, changing nothing, when `name` is not a token name or a
    /// live token (not revoked, not expired) has it.
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        expires: Option<SystemTime>,
    ) -> Result<(TokenRow, String), StoreError> {
        check_name(name)?;
        let token = mint()?;
        let hash = digest(&token).to_vec();
        let name = name.to_owned();
        let expires_at = expires.map(unix);
        let taken = name.clone();
        let created = self
            .run(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let live: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM tokens WHERE name = ?1 AND revoked_at IS NULL
                       AND (expires_at IS NULL OR expires_at > ?2)",
                    params![name, unix(SystemTime::now())],
                    |r| r.get(0),
                )?;
                if live > 0 {
                    return Ok(None);
                }
                let row = tx.query_row(
                    &format!(
                        "INSERT INTO tokens (name, role, digest, created_at, expires_at)
                         VALUES (?1, ?2, ?3, ?4, ?5) RETURNING {COLUMNS}"
                    ),
                    params![name, role.as_str(), hash, now(), expires_at],
                    token_row,
                )?;
                tx.commit()?;
                Ok(Some(row))
            })
            .await?;
        match created {
            Some(row) => Ok((row, token)),
            None => Err(StoreError::TokenNameTaken { name: taken }),
        }
    }

    /// Every token, oldest first.
    pub async fn tokens(&self) -> Result<Vec<TokenRow>, StoreError> {
        Ok(self
            .token_digests()
            .await?
            .into_iter()
            .map(|(row, _)| row)
            .collect())
    }

    /// Every token with its digest, oldest first: what the [`super::TokenBook`] holds.
    pub(super) async fn token_digests(&self) -> Result<Vec<(TokenRow, [u8; 32])>, StoreError> {
        self.run(|conn| {
            let mut stmt =
                conn.prepare_cached(&format!("SELECT {COLUMNS}, digest FROM tokens ORDER BY id"))?;
            let rows = stmt.query_map([], |r| {
                let digest: Vec<u8> = r.get(7)?;
                // A digest of another length matches no token: all zeros, which none hashes to.
                Ok((token_row(r)?, digest.try_into().unwrap_or([0; 32])))
            })?;
            rows.collect()
        })
        .await
    }

    /// Revokes every token named `name` that is not revoked yet (an expired one too, so it can
    /// never come back). Unknown names are an error.
    pub async fn revoke_token(&self, name: &str) -> Result<Revoked, StoreError> {
        check_name(name)?;
        let owned = name.to_owned();
        let (known, changed) = self
            .run(move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let known: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM tokens WHERE name = ?1",
                    [&owned],
                    |r| r.get(0),
                )?;
                let changed = tx.execute(
                    "UPDATE tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL",
                    params![owned, now()],
                )?;
                tx.commit()?;
                Ok((known, changed))
            })
            .await?;
        match (known, changed) {
            (0, _) => Err(StoreError::NoSuchToken {
                name: name.to_owned(),
            }),
            (_, 0) => Ok(Revoked::Already),
            _ => Ok(Revoked::Now),
        }
    }

    /// Token `id` was used now.
    pub(super) async fn token_used(&self, id: i64) -> Result<(), StoreError> {
        self.run(move |conn| {
            conn.execute(
                "UPDATE tokens SET last_used_at = ?2 WHERE id = ?1",
                params![id, now()],
            )
            .map(drop)
        })
        .await
    }
}
