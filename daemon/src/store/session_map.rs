//! The session map: one row per acpd session, written by whichever acpd process opened,
//! listed or touched it, each write that reads first in an IMMEDIATE transaction.

use std::path::Path;

use rusqlite::{OptionalExtension as _, TransactionBehavior, params};

use super::rows::{COLUMNS, lease_of, path_bytes, session_row};
use super::timestamps::{normalize_time, now};
use super::{Claim, Holder, Listed, RowOwner, SessionRow, Store, StoreError, cap_title};

impl Store {
    /// Adds `row` (a session someone opened: `session/new`, `session/fork`), or replaces the row
    /// with its `acpd_id`. The row it takes the place of, when an agent's listing filed the same
    /// child session first (a `session/list` racing the `session/new` that made it), is only
    /// listed, so it gives way: the opener's id wins. A child session already mapped to another
    /// acpd id that someone opened is an error: one child session has one acpd id.
    pub async fn insert(&self, row: SessionRow) -> Result<(), StoreError> {
        let title = row.title.map(cap_title);
        let lease = row.lease;
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "DELETE FROM sessions WHERE provider = ?1 AND child_session_id = ?2
                   AND listed_only = 1 AND acpd_id != ?3",
                params![row.provider, row.child_session_id, row.acpd_id],
            )?;
            tx.execute(
                "INSERT INTO sessions (acpd_id, provider, child_session_id, cwd, title, updated_at,
                   owner_uid, lease_pid, lease_start, lease_boot, listed_only, owner_token)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0, ?11)
                 ON CONFLICT (acpd_id) DO UPDATE SET provider = excluded.provider,
                   child_session_id = excluded.child_session_id, cwd = excluded.cwd,
                   title = excluded.title, updated_at = excluded.updated_at,
                   owner_uid = excluded.owner_uid, owner_token = excluded.owner_token,
                   lease_pid = excluded.lease_pid,
                   lease_start = excluded.lease_start, lease_boot = excluded.lease_boot,
                   listed_only = 0",
                params![
                    row.acpd_id,
                    row.provider,
                    row.child_session_id,
                    path_bytes(&row.cwd),
                    title,
                    row.updated_at,
                    row.owner.uid,
                    lease.as_ref().map(|h| h.pid),
                    lease.as_ref().map(|h| h.start.to_string()),
                    lease.as_ref().map(|h| h.boot.clone()),
                    row.owner.token,
                ],
            )?;
            tx.commit()
        })
        .await
    }
    /// The row of `acpd_id` if it is `owner`'s: another user's or token's session is not there
    /// for them.
    pub async fn get_owned(
        &self,
        acpd_id: &str,
        owner: RowOwner,
    ) -> Result<Option<SessionRow>, StoreError> {
        Ok(self.get(acpd_id).await?.filter(|r| r.owner == owner))
    }
    /// Makes `me` the holder of `owner`'s session `acpd_id`, unless another live acpd holds it.
    /// A dead holder's lease (its process gone, or from another boot) is taken over. A row only
    /// an agent's listing brought in is now one its owner opened: no listing bounds it any more.
    pub async fn claim(
        &self,
        acpd_id: &str,
        owner: RowOwner,
        me: &Holder,
    ) -> Result<Claim, StoreError> {
        let (acpd_id, me) = (acpd_id.to_owned(), me.clone());
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let found = tx
                .query_row(
                    "SELECT owner_uid, lease_pid, lease_start, lease_boot, owner_token
                     FROM sessions WHERE acpd_id = ?1",
                    [&acpd_id],
                    |r| {
                        let owner = RowOwner {
                            uid: r.get(0)?,
                            token: r.get(4)?,
                        };
                        Ok((owner, lease_of(r, 1)?))
                    },
                )
                .optional()?;
            let claim = match found {
                None => Claim::Unknown,
                Some((o, _)) if o != owner => Claim::Unknown,
                Some((_, Some(h))) if h != me && h.alive() => Claim::Elsewhere(h),
                Some(_) => {
                    tx.execute(
                        "UPDATE sessions SET lease_pid = ?2, lease_start = ?3, lease_boot = ?4,
                           listed_only = 0
                         WHERE acpd_id = ?1",
                        params![acpd_id, me.pid, me.start.to_string(), me.boot],
                    )?;
                    Claim::Held
                }
            };
            tx.commit()?;
            Ok(claim)
        })
        .await
    }
    /// Gives up `me`'s lease on `acpd_id` (the session is no longer live here); a lease
    /// another process took meanwhile stays.
    pub async fn release(&self, acpd_id: &str, me: &Holder) -> Result<(), StoreError> {
        let (acpd_id, me) = (acpd_id.to_owned(), me.clone());
        self.run(move |conn| {
            conn.execute(
                "UPDATE sessions SET lease_pid = NULL, lease_start = NULL, lease_boot = NULL
                 WHERE acpd_id = ?1 AND lease_pid = ?2 AND lease_start = ?3 AND lease_boot = ?4",
                params![acpd_id, me.pid, me.start.to_string(), me.boot],
            )
            .map(drop)
        })
        .await
    }
    /// The row of `acpd_id`, whichever process wrote it.
    pub async fn get(&self, acpd_id: &str) -> Result<Option<SessionRow>, StoreError> {
        let acpd_id = acpd_id.to_owned();
        self.run(move |conn| {
            conn.query_row(
                &format!("SELECT {COLUMNS} FROM sessions WHERE acpd_id = ?1"),
                [acpd_id],
                session_row,
            )
            .optional()
        })
        .await
    }
    /// updated_at = now; title replaced (capped) when Some; only on `owner`'s row. An unknown
    /// id is not an error: the session may have been forgotten by another process meanwhile.
    pub async fn touch(
        &self,
        acpd_id: &str,
        owner: RowOwner,
        title: Option<String>,
    ) -> Result<(), StoreError> {
        let acpd_id = acpd_id.to_owned();
        let title = title.map(cap_title);
        self.run(move |conn| {
            conn.execute(
                "UPDATE sessions SET updated_at = ?2, title = COALESCE(?3, title)
                 WHERE acpd_id = ?1 AND owner_uid = ?4 AND owner_token IS ?5",
                params![acpd_id, now(), title, owner.uid, owner.token],
            )
            .map(drop)
        })
        .await
    }
    /// Whether there was such a row.
    pub async fn remove(&self, acpd_id: &str) -> Result<bool, StoreError> {
        let acpd_id = acpd_id.to_owned();
        self.run(move |conn| {
            conn.execute("DELETE FROM sessions WHERE acpd_id = ?1", [acpd_id])
                .map(|n| n > 0)
        })
        .await
    }
    /// A session a provider listed: its acpd id (minted `acpd-<uuid v4>` when new; unique on
    /// (provider, child_session_id)), title/updated_at/cwd refreshed from the child's listing.
    /// A title or time the listing lacks keeps the stored one; a new row without a time gets
    /// now, and belongs to acpd's own user. One statement, so two processes adopting the same
    /// session get the same id.
    pub async fn adopt(
        &self,
        provider: &str,
        child_session_id: &str,
        cwd: &Path,
        title: Option<String>,
        updated_at: Option<String>,
    ) -> Result<String, StoreError> {
        let listed = Listed {
            child_session_id: child_session_id.to_owned(),
            cwd: cwd.to_path_buf(),
            title,
            updated_at,
        };
        let ids = self
            .adopt_listing(provider, vec![listed], usize::MAX)
            .await?;
        ids.into_iter().next().ok_or_else(|| StoreError::Task {
            path: self.path.to_path_buf(),
            reason: "adopting one session returned no id".into(),
        })
    }
    /// Adopts every session of one page of `provider`'s listing (see [`Store::adopt`]) in one
    /// transaction, then keeps only the provider's `max` newest listed-only rows: an agent that
    /// lists fresh ids without end cannot grow the map past `max` rows. The bound counts and
    /// cuts only rows the listing brought in and nobody opened (`listed_only`, acpd's uid): a
    /// row someone's `session/new`, `fork` or `load` made is never pushed out by an agent
    /// listing many sessions (or ones with `updatedAt` in the future). Returns the acpd ids.
    pub async fn adopt_listing(
        &self,
        provider: &str,
        sessions: Vec<Listed>,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let provider = provider.to_owned();
        let owner = nix::unistd::Uid::effective().as_raw();
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Vec::with_capacity(sessions.len());
            {
                let mut adopt = tx.prepare_cached(
                    "INSERT INTO sessions (acpd_id, provider, child_session_id, cwd, title,
                       updated_at, owner_uid, listed_only)
                     VALUES (?1, ?2, ?3, ?4, ?5, COALESCE(?6, ?7), ?8, 1)
                     ON CONFLICT (provider, child_session_id) DO UPDATE SET cwd = excluded.cwd,
                       title = COALESCE(excluded.title, title),
                       updated_at = COALESCE(?6, updated_at)
                     RETURNING acpd_id",
                )?;
                for s in sessions {
                    let id = adopt.query_row(
                        params![
                            format!("acpd-{}", uuid::Uuid::new_v4()),
                            provider,
                            s.child_session_id,
                            path_bytes(&s.cwd),
                            s.title.map(cap_title),
                            s.updated_at.as_deref().map(normalize_time),
                            now(),
                            owner
                        ],
                        |r| r.get(0),
                    )?;
                    ids.push(id);
                }
            }
            if max < usize::MAX {
                tx.execute(
                    "DELETE FROM sessions WHERE provider = ?1 AND listed_only = 1
                     AND acpd_id NOT IN (
                       SELECT acpd_id FROM sessions WHERE provider = ?1 AND listed_only = 1
                       ORDER BY updated_at DESC, acpd_id ASC LIMIT ?2)",
                    params![provider, i64::try_from(max).unwrap_or(i64::MAX)],
                )?;
            }
            tx.commit()?;
            Ok(ids)
        })
        .await
    }
    /// `owner`'s rows, newest first (updated_at desc, acpd_id asc); only rows whose cwd
    /// equals `cwd` when given (byte for byte: the caller passes the path as the client sent
    /// it).
    pub async fn list(
        &self,
        cwd: Option<&Path>,
        owner: RowOwner,
    ) -> Result<Vec<SessionRow>, StoreError> {
        let cwd = cwd.map(|c| path_bytes(c).to_vec());
        self.run(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM sessions WHERE (?1 IS NULL OR cwd = ?1) AND owner_uid = ?2
                   AND owner_token IS ?3
                 ORDER BY updated_at DESC, acpd_id ASC"
            ))?;
            stmt.query_map(params![cwd, owner.uid, owner.token], session_row)?
                .collect()
        })
        .await
    }
    /// Rows of `provider` not in `listed` go (the agent deleted them); returns how many.
    /// `listed` is all acpd keeps of the agent's listing (every page, or the first
    /// `max_listed_sessions`): listed-only rows not in it go. A row someone opened goes only
    /// when `whole_since` is the time the listing began and the listing was whole (not cut at
    /// the bound, so the bound never forgets one), the row was last written before it (so a
    /// `session/new` racing the listing keeps its row) and no live acpd holds it.
    pub async fn forget_unlisted(
        &self,
        provider: &str,
        listed: &[String],
        whole_since: Option<&str>,
    ) -> Result<usize, StoreError> {
        let provider = provider.to_owned();
        let whole_since = whole_since.map(str::to_owned);
        let listed: std::collections::HashSet<String> = listed.iter().cloned().collect();
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let gone: Vec<String> = {
                let mut stmt = tx.prepare(
                    "SELECT child_session_id, listed_only, updated_at, lease_pid, lease_start,
                       lease_boot FROM sessions WHERE provider = ?1",
                )?;
                let rows = stmt.query_map([&provider], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, bool>(1)?,
                        r.get::<_, String>(2)?,
                        lease_of(r, 3)?,
                    ))
                })?;
                let mut gone = Vec::new();
                for row in rows {
                    let (id, listed_only, updated_at, lease) = row?;
                    if listed.contains(&id) {
                        continue;
                    }
                    let opened_may_go = whole_since.as_ref().is_some_and(|since| {
                        updated_at < *since && !lease.as_ref().is_some_and(Holder::alive)
                    });
                    if listed_only || opened_may_go {
                        gone.push(id);
                    }
                }
                gone
            };
            {
                let mut delete = tx.prepare(
                    "DELETE FROM sessions WHERE provider = ?1 AND child_session_id = ?2",
                )?;
                for id in &gone {
                    delete.execute([&provider, id])?;
                }
            }
            tx.commit()?;
            Ok(gone.len())
        })
        .await
    }
}
