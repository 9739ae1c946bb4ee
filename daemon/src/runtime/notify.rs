//! sd_notify: READY, STATUS, WATCHDOG, RELOADING and STOPPING. Every call is a no-op outside
//! systemd (no `NOTIFY_SOCKET`).

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("sd_notify failed: {e}");
    }
}

pub fn ready() {
    send(&[NotifyState::Ready]);
}

pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// RELOADING=1 with the monotonic timestamp systemd 253+ wants; READY=1 must follow.
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// Pings WATCHDOG=1 at half the interval systemd asked for, until `stop`.
pub fn spawn_watchdog(stop: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let period = (interval / 2).max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => send(&[NotifyState::Watchdog]),
                _ = stop.cancelled() => return,
            }
        }
    });
}
