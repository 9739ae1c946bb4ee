//! The limits a start must fit: the delegation depth (this acpd's, an outer acpd's, the
//! request's and a nesting child's), and a slot under `max_children` and the provider's
//! `max_concurrent`, waited for up to `queue_timeout`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Inner, Registry, RegistryError, lock};
use crate::config::{Config, ProviderConfig};
use crate::supervise;

/// Where this acpd sits in a delegation chain, read from its own environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct DepthContext {
    /// `ACPD_DEPTH` of this process (0 at the top).
    pub depth: u32,
    /// `ACPD_MAX_DEPTH` an outer acpd imposed, if any.
    pub inherited_max: Option<u32>,
}

impl DepthContext {
    pub fn from_env() -> Self {
        let read = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        DepthContext {
            depth: read(supervise::DEPTH_VAR).unwrap_or(0),
            inherited_max: read(supervise::MAX_DEPTH_VAR),
        }
    }
}

/// A start counted as waiting for a slot while it lives.
pub(super) struct Queued<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Queued<'a> {
    pub(super) fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Queued(count)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One live child's claim on the limits; released when dropped.
pub struct Slot {
    inner: Arc<Inner>,
    provider: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = lock(&self.inner.table);
        table.live_total = table.live_total.saturating_sub(1);
        if let Some(n) = table.live_by_provider.get_mut(&self.provider) {
            *n = n.saturating_sub(1);
        }
        drop(table);
        self.inner.freed.notify_waiters();
    }
}

fn max_depth_of(config: &Config, outer: &DepthContext, requested: Option<u32>) -> u32 {
    [Some(config.max_depth), outer.inherited_max, requested]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(config.max_depth)
}

impl Registry {
    /// The depth of a new child one level below `nested_in` (a child of this acpd that asked
    /// for it), else below this acpd, and the limit that applies to it.
    pub(super) fn check_depth(
        &self,
        config: &Config,
        requested: Option<u32>,
        nested_in: Option<(u32, u32)>,
    ) -> Result<(u32, u32), RegistryError> {
        let (base, limit) = nested_in.unwrap_or((self.inner.depth.depth, u32::MAX));
        let depth = base.saturating_add(1);
        let max = max_depth_of(config, &self.inner.depth, requested).min(limit);
        if depth > max {
            crate::metrics::get().limit_hit(crate::metrics::Limit::MaxDepth);
            return Err(RegistryError::DepthExceeded { depth, max });
        }
        Ok((depth, max))
    }

    /// The depth limit in force (the config's, an outer acpd's, the request's: the least).
    pub(super) fn max_depth(&self, requested: Option<u32>) -> u32 {
        max_depth_of(&self.config(), &self.inner.depth, requested)
    }

    /// The depth of a bridge session's child (one below this acpd).
    pub fn bridge_depth(&self) -> u32 {
        self.inner.depth.depth.saturating_add(1)
    }

    /// Claims a slot, waiting up to `queue_timeout` for one to free up when configured.
    pub(super) async fn claim(
        &self,
        config: &Config,
        provider: &ProviderConfig,
        cancel: &CancellationToken,
    ) -> Result<Slot, RegistryError> {
        let deadline = config.queue_timeout.map(crate::config::durations::deadline);
        let mut waiting: Option<Queued<'_>> = None;
        loop {
            let freed = self.inner.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let err = match self.try_claim(config, provider) {
                Ok(slot) => return Ok(slot),
                Err(e) => e,
            };
            if waiting.is_none() {
                let max_children = matches!(&err, RegistryError::Capacity { scope, .. } if scope == "max_children");
                crate::metrics::get().limit_hit(if max_children {
                    crate::metrics::Limit::MaxChildren
                } else {
                    crate::metrics::Limit::MaxConcurrent
                });
            }
            let Some(deadline) = deadline else {
                return Err(err);
            };
            waiting.get_or_insert_with(|| Queued::new(&self.inner.queued));
            tokio::select! {
                _ = &mut freed => {}
                _ = tokio::time::sleep_until(deadline) => {
                    crate::metrics::get().limit_hit(crate::metrics::Limit::QueueTimeout);
                    return Err(err);
                }
                _ = cancel.cancelled() => return Err(err),
            }
        }
    }

    fn try_claim(&self, config: &Config, provider: &ProviderConfig) -> Result<Slot, RegistryError> {
        let mut table = lock(&self.inner.table);
        if table.live_total >= config.max_children {
            return Err(RegistryError::Capacity {
                scope: "max_children".into(),
                limit: config.max_children,
            });
        }
        let live = table
            .live_by_provider
            .entry(provider.name.clone())
            .or_default();
        if *live >= provider.max_concurrent {
            return Err(RegistryError::Capacity {
                scope: format!("providers.{}.max_concurrent", provider.name),
                limit: provider.max_concurrent,
            });
        }
        *live += 1;
        table.live_total += 1;
        Ok(Slot {
            inner: self.inner.clone(),
            provider: provider.name.clone(),
        })
    }

    /// Live children of one provider.
    pub fn live_children_of(&self, provider: &str) -> usize {
        lock(&self.inner.table)
            .live_by_provider
            .get(provider)
            .copied()
            .unwrap_or(0)
    }

    /// Starts waiting for a free slot (`queue_timeout`).
    pub fn queued(&self) -> usize {
        self.inner.queued.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Live children across all providers.
    pub fn live_children(&self) -> usize {
        lock(&self.inner.table).live_total
    }
}
