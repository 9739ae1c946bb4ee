//! Warm spares (`warm = N` on a provider): children spawned and initialized ahead, so a
//! bridge session's start pays only the agent's own `session/new`. A spare is initialized
//! with the client capabilities of the last session that took one of that provider (an agent
//! may behave differently without `fs` or `terminal`), so a session whose editor advertises
//! something else starts cold, and the pool follows it. Spares hold their claim on the limits,
//! are replaced in the background when taken, and recycled when they die or pass
//! `warm_max_age`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::ClientCapabilities;
use tokio_util::sync::CancellationToken;

use super::Ready;
use super::{Registry, lock};
use crate::config::ProviderConfig;

/// How often the pool looks for dead and old spares at most (and at least).
const CHECK_MIN: Duration = Duration::from_secs(1);
const CHECK_MAX: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct Pool {
    providers: HashMap<String, Spares>,
}

#[derive(Default)]
struct Spares {
    ready: Vec<Ready>,
    /// Spares being started now.
    starting: usize,
    /// The capabilities spares are initialized with (JSON).
    caps: Option<String>,
}

fn caps_key(caps: &ClientCapabilities) -> String {
    serde_json::to_string(caps).unwrap_or_default()
}

impl Registry {
    /// Starts keeping every provider's `warm` spares, until `stop`; spares are reaped then.
    pub fn keep_warm(&self, stop: CancellationToken) {
        let config = self.config();
        let warm: Vec<Arc<ProviderConfig>> = config
            .providers
            .values()
            .filter(|p| p.warm > 0)
            .cloned()
            .collect();
        if warm.is_empty() {
            return;
        }
        *lock(&self.inner.warm_stop) = Some(stop.clone());
        let registry = self.clone();
        tokio::spawn(async move {
            let period = warm
                .iter()
                .map(|p| p.warm_max_age / 4)
                .min()
                .unwrap_or(CHECK_MAX)
                .clamp(CHECK_MIN, CHECK_MAX);
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => registry.tend(&stop).await,
                }
            }
            registry.drain_spares().await;
        });
    }

    /// Takes a ready spare of `provider` initialized with `caps`, if there is one, and
    /// starts its replacement.
    pub(super) async fn take_spare(
        &self,
        provider: &Arc<ProviderConfig>,
        caps: &ClientCapabilities,
    ) -> Option<Ready> {
        if provider.warm == 0 {
            return None;
        }
        let key = caps_key(caps);
        let (taken, stale) = {
            let mut pool = lock(&self.inner.pool);
            let spares = pool.providers.entry(provider.name.clone()).or_default();
            if spares.caps.as_deref() != Some(&key) {
                // The pool follows the last taker's capabilities.
                spares.caps = Some(key);
                (None, std::mem::take(&mut spares.ready))
            } else {
                let fresh = |r: &Ready| {
                    r.child.alive() && r.child.ready_at.elapsed() < provider.warm_max_age
                };
                let (keep, stale): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut spares.ready)
                    .into_iter()
                    .partition(fresh);
                spares.ready = keep;
                (spares.ready.pop(), stale)
            }
        };
        for s in stale {
            s.close().await;
        }
        self.fill(provider.clone());
        taken
    }

    /// Spares per provider, for `acpd status`.
    pub fn spare_counts(&self) -> std::collections::BTreeMap<String, u64> {
        lock(&self.inner.pool)
            .providers
            .iter()
            .map(|(name, s)| (name.clone(), s.ready.len() as u64))
            .collect()
    }

    /// Recycles dead and old spares and tops every pool up.
    async fn tend(&self, stop: &CancellationToken) {
        let config = self.config();
        let mut stale = Vec::new();
        for provider in config.providers.values().filter(|p| p.warm > 0) {
            {
                let mut pool = lock(&self.inner.pool);
                let spares = pool.providers.entry(provider.name.clone()).or_default();
                let max_age = provider.warm_max_age;
                let (keep, old): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut spares.ready)
                    .into_iter()
                    .partition(|r| r.child.alive() && r.child.ready_at.elapsed() < max_age);
                spares.ready = keep;
                stale.extend(old);
            }
            if !stop.is_cancelled() {
                self.fill(provider.clone());
            }
        }
        for s in stale {
            s.close().await;
        }
    }

    /// Starts spares until `provider` has its `warm` (ready or starting).
    fn fill(&self, provider: Arc<ProviderConfig>) {
        let stop = match lock(&self.inner.warm_stop).clone() {
            Some(stop) if !stop.is_cancelled() => stop,
            _ => return,
        };
        let (missing, caps) = {
            let mut pool = lock(&self.inner.pool);
            let spares = pool.providers.entry(provider.name.clone()).or_default();
            let have = spares.ready.len() + spares.starting;
            let missing = provider.warm.saturating_sub(have);
            spares.starting += missing;
            (missing, spares.caps.clone())
        };
        let caps: ClientCapabilities = caps
            .and_then(|c| serde_json::from_str(&c).ok())
            .unwrap_or_default();
        for _ in 0..missing {
            let registry = self.clone();
            let provider = provider.clone();
            let caps = caps.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = registry
                    .ready_cold(Some(&provider.name), None, caps.clone(), None, &stop)
                    .await;
                let key = caps_key(&caps);
                let spare = {
                    let mut pool = lock(&registry.inner.pool);
                    let spares = pool.providers.entry(provider.name.clone()).or_default();
                    spares.starting = spares.starting.saturating_sub(1);
                    match started {
                        Ok(ready)
                            if spares.caps.as_deref().unwrap_or(&key) == key
                                && !stop.is_cancelled() =>
                        {
                            spares.caps.get_or_insert(key);
                            spares.ready.push(ready);
                            None
                        }
                        Ok(ready) => Some(ready),
                        Err(e @ super::RegistryError::Capacity { .. }) => {
                            tracing::debug!(provider = %provider.name, "no room for a warm spare: {e}");
                            None
                        }
                        Err(e) => {
                            tracing::warn!(provider = %provider.name, "a warm spare failed to start: {e}");
                            None
                        }
                    }
                };
                if let Some(unwanted) = spare {
                    unwanted.close().await;
                }
            });
        }
    }

    /// Reaps every spare (acpd is stopping; call after cancelling `keep_warm`'s token).
    pub async fn drain_spares(&self) {
        let all: Vec<Ready> = lock(&self.inner.pool)
            .providers
            .values_mut()
            .flat_map(|s| std::mem::take(&mut s.ready))
            .collect();
        futures::future::join_all(all.into_iter().map(|r| r.close())).await;
    }
}

/// `warm_max_age` on paused time: a spare whose agent is the driver tests' `Fake`, filed in
/// the pool the way `fill` files one.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use acpd_protocol::acp::ClientCapabilities;
    use tokio_util::sync::CancellationToken;

    use super::caps_key;
    use crate::child::tests::{provider, spare};
    use crate::config::{Config, ProviderConfig};
    use crate::registry::{DepthContext, Ready, Registry, lock};

    /// A registry with `p` (warm = 1, warm_max_age = 60 s) and one ready spare of it; the
    /// handle resolves when the spare's wire is closed.
    async fn pooled() -> (
        Registry,
        Arc<ProviderConfig>,
        tokio::task::JoinHandle<impl Sized>,
    ) {
        let p = provider(|p| {
            p.warm = 1;
            p.warm_max_age = Duration::from_secs(60);
        });
        let (child, agent) = spare(p.clone()).await;
        let p = Arc::new(p);
        let mut config = Config::builtin(vec!["true".into()]);
        config.providers.insert(p.name.clone(), p.clone());
        let registry = Registry::new(config, DepthContext::default());
        let slot = registry
            .claim(&registry.config(), &p, &CancellationToken::new())
            .await
            .unwrap();
        {
            let mut pool = lock(&registry.inner.pool);
            let spares = pool.providers.entry(p.name.clone()).or_default();
            spares.caps = Some(caps_key(&ClientCapabilities::default()));
            spares.ready.push(Ready { child, slot });
        }
        (registry, p, agent)
    }

    #[tokio::test]
    async fn the_pool_recycles_a_spare_once_it_reaches_warm_max_age() {
        let (registry, _, agent) = pooled().await;
        // No `keep_warm` token: tending recycles but starts no replacement.
        let stop = CancellationToken::new();
        tokio::time::sleep(Duration::from_secs(59)).await;
        registry.tend(&stop).await;
        assert_eq!(registry.spare_counts().get("fake"), Some(&1), "young: kept");
        assert_eq!(registry.live_children(), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        registry.tend(&stop).await;
        assert_eq!(
            registry.spare_counts().get("fake"),
            Some(&0),
            "old: recycled"
        );
        assert_eq!(registry.live_children(), 0, "its slot is released");
        tokio::time::timeout(Duration::from_secs(3600), agent)
            .await
            .expect("the spare's agent sees its input close")
            .unwrap();
    }

    #[tokio::test]
    async fn a_session_is_never_handed_a_spare_past_warm_max_age() {
        let (registry, p, agent) = pooled().await;
        let caps = ClientCapabilities::default();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(registry.take_spare(&p, &caps).await.is_none(), "too old");
        assert_eq!(registry.live_children(), 0, "recycled, its slot released");
        tokio::time::timeout(Duration::from_secs(3600), agent)
            .await
            .expect("the spare's agent sees its input close")
            .unwrap();
    }

    #[tokio::test]
    async fn a_spare_younger_than_warm_max_age_is_handed_out() {
        let (registry, p, _agent) = pooled().await;
        let caps = ClientCapabilities::default();
        tokio::time::sleep(Duration::from_secs(59)).await;
        let taken = registry.take_spare(&p, &caps).await.expect("young enough");
        assert!(taken.child.alive());
        taken.close().await;
    }
}
