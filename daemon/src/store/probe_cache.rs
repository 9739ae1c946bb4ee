//! The probe cache: what each provider's agent answered to `initialize`, so it is asked once
//! per command line, not once per start.

use rusqlite::{OptionalExtension as _, params};

use super::timestamps::now;
use super::{Store, StoreError};

impl Store {
    /// What a provider's agent said in `initialize` (a JSON value), keyed by provider name and
    /// a fingerprint of its command+env; None when absent or the fingerprint changed (the
    /// provider now runs something else). An unreadable value counts as absent: it is only a
    /// cache, and the next `probe_put` replaces it.
    pub async fn probe_get(
        &self,
        provider: &str,
        fingerprint: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let (provider, fingerprint) = (provider.to_owned(), fingerprint.to_owned());
        let text: Option<String> = self
            .run(move |conn| {
                conn.query_row(
                    "SELECT value FROM probes WHERE provider = ?1 AND fingerprint = ?2",
                    [provider, fingerprint],
                    |r| r.get(0),
                )
                .optional()
            })
            .await?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }
    /// Replaces the provider's cached probe (one per provider: an older fingerprint's answer
    /// is never asked for again).
    pub async fn probe_put(
        &self,
        provider: &str,
        fingerprint: &str,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let (provider, fingerprint) = (provider.to_owned(), fingerprint.to_owned());
        let value = value.to_string();
        self.run(move |conn| {
            conn.execute(
                "INSERT INTO probes (provider, fingerprint, value, updated_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (provider) DO UPDATE SET fingerprint = excluded.fingerprint,
                   value = excluded.value, updated_at = excluded.updated_at",
                params![provider, fingerprint, value, now()],
            )
            .map(drop)
        })
        .await
    }
}
