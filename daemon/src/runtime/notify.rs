//! sd_notify: READY, STATUS, WATCHDOG, RELOADING and STOPPING. Every call is a no-op outside
//! systemd (no `NOTIFY_SOCKET`).

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("sd_notify failed: {e}");
    }
}

pub(super) fn ready() {
    send(&[NotifyState::Ready]);
}

pub(super) fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

pub(super) fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// RELOADING=1 with the monotonic timestamp systemd 253+ wants; READY=1 must follow.
pub(super) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// The interval at which to ping WATCHDOG=1 (half what systemd asked for), if it asked.
pub(super) fn watchdog_period() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|interval| (interval / 2).max(Duration::from_millis(10)))
}

pub(super) fn watchdog() {
    send(&[NotifyState::Watchdog]);
}
