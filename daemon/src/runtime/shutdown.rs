//! Shutdown from outside: the first request (SIGTERM, SIGINT, and for `acpd stdio` SIGHUP)
//! asks for a graceful stop — cancel every run and bridge, run every teardown ladder — and the
//! second for an immediate one (SIGKILL every child group). `serve` and `stdio` take a
//! [`Shutdown`] as an argument; the CLI wires it to signals, tests may request it directly.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::supervise;

/// Margin on top of the largest cancel + EOF + TERM grace before shutdown stops waiting.
pub(super) const SHUTDOWN_MARGIN: Duration = Duration::from_secs(2);

/// How long an emergency stop waits for the killed children to be reaped.
const EMERGENCY_WAIT: Duration = Duration::from_secs(5);

/// A shutdown request: graceful on the first [`Shutdown::request`], immediate on the second.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shutdown {
    requests: Arc<AtomicUsize>,
    graceful: CancellationToken,
    now: CancellationToken,
}

impl Shutdown {
    pub(crate) fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A shutdown requested by each delivery of any of `kinds`. Call it inside the runtime.
    /// SIGHUP and SIGINT stay ignored when acpd was started with them ignored (`nohup`, a
    /// background job of a script), as those callers expect; SIGTERM is always taken.
    pub(crate) fn on_signals(kinds: &[SignalKind]) -> std::io::Result<Shutdown> {
        let shutdown = Shutdown::new();
        let mut streams = Vec::with_capacity(kinds.len());
        let ignored = ignored_at_start();
        for &kind in kinds {
            let signum = kind.as_raw_value();
            let keep_ignored = signum != nix::libc::SIGTERM
                && (1..=64).contains(&signum)
                && ignored & (1u64 << (signum - 1)) != 0;
            if keep_ignored {
                tracing::debug!(
                    signal = signum,
                    "started with this signal ignored; keeping it so"
                );
                continue;
            }
            streams.push((kind, signal(kind)?));
        }
        if streams.is_empty() {
            return Ok(shutdown);
        }
        let requests = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let next = futures::future::select_all(
                    streams
                        .iter_mut()
                        .map(|(kind, s)| Box::pin(async move { s.recv().await.map(|_| *kind) })),
                );
                match next.await.0 {
                    Some(kind) => {
                        tracing::info!(signal = kind.as_raw_value(), "shutdown signal");
                        requests.request();
                    }
                    None => return,
                }
            }
        });
        Ok(shutdown)
    }

    /// The first call asks for a graceful stop, any later one for an immediate one.
    pub(crate) fn request(&self) {
        if self.requests.fetch_add(1, Ordering::AcqRel) == 0 {
            self.graceful.cancel();
        } else {
            self.now.cancel();
        }
    }

    /// Resolves once a stop was requested.
    pub(crate) async fn requested(&self) {
        self.graceful.cancelled().await
    }

    /// Resolves once an immediate stop was requested.
    pub(crate) async fn urgent(&self) {
        self.now.cancelled().await
    }
}

/// The signals this process was started with ignored (`SigIgn` in /proc/self/status; bit
/// N-1 is signal N). Read before any handler is installed; 0 when it cannot be read.
fn ignored_at_start() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .unwrap_or(0)
}

/// The largest `cancel_grace + eof_grace + term_grace` of any provider, plus the margin.
pub(crate) fn bound(config: &Config) -> Duration {
    config
        .providers
        .values()
        .map(|p| {
            p.cancel_grace
                .saturating_add(p.eof_grace)
                .saturating_add(p.term_grace)
        })
        .max()
        .unwrap_or_default()
        .saturating_add(SHUTDOWN_MARGIN)
}

/// Waits for `teardown` (every run cancelled, every ladder run) for at most `bound`; a second
/// request, or the bound passing, SIGKILLs every child group and waits briefly for the reaping.
pub(super) async fn drain(
    teardown: impl Future<Output = ()>,
    shutdown: &Shutdown,
    bound: Duration,
) {
    tokio::pin!(teardown);
    tokio::select! {
        () = &mut teardown => return,
        () = shutdown.urgent() => tracing::warn!("second shutdown request: killing every child now"),
        () = tokio::time::sleep(bound) => {
            tracing::warn!("shutdown took longer than {bound:?}; killing every child now");
        }
    }
    supervise::kill_all();
    if tokio::time::timeout(EMERGENCY_WAIT, teardown)
        .await
        .is_err()
    {
        tracing::warn!("teardown still not finished {EMERGENCY_WAIT:?} after SIGKILL; exiting");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn first_request_is_graceful_the_second_urgent() {
        let s = Shutdown::new();
        let probe = |f: std::pin::Pin<Box<dyn Future<Output = ()> + '_>>| {
            futures::FutureExt::now_or_never(f).is_some()
        };
        assert!(!probe(Box::pin(s.requested())));
        s.request();
        assert!(probe(Box::pin(s.requested())));
        assert!(!probe(Box::pin(s.urgent())));
        s.clone().request();
        assert!(probe(Box::pin(s.urgent())));
    }
}
