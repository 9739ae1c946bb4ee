//! The network connections alive now: counted against `max_network_connections` and
//! `max_connections_per_token`, and closed at once when their token is revoked or expires.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::guard::{Grant, Refused};

/// Every live network ACP connection (HTTP or WebSocket).
#[derive(Default)]
pub(crate) struct Live {
    inner: Mutex<Inner>,
    serial: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// Connection serial → its token and its cancel.
    conns: HashMap<u64, (i64, CancellationToken)>,
    per_token: HashMap<i64, usize>,
}

/// A connection's place among the live ones; given back when dropped.
pub(crate) struct Place {
    live: Arc<Live>,
    serial: u64,
    token: i64,
    /// Cancelled when the connection must end: its token was revoked or expired, acpd stops.
    pub cancel: CancellationToken,
}

impl Live {
    /// Takes a place for a connection of `grant`, unless a limit is reached.
    pub(crate) fn admit(
        self: &Arc<Self>,
        grant: &Grant,
        max_total: usize,
        max_per_token: usize,
        parent: &CancellationToken,
    ) -> Result<Place, Refused> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.conns.len() >= max_total {
            return Err(Refused::new(
                503,
                "max_network_connections",
                format!(
                    "acpd serves {max_total} network connections at once \
                     (max_network_connections); try again later"
                ),
            ));
        }
        let held = inner.per_token.get(&grant.id).copied().unwrap_or(0);
        if held >= max_per_token {
            return Err(Refused::new(
                429,
                "max_connections_per_token",
                format!(
                    "token {:?} holds {held} connections, its limit \
                     (max_connections_per_token); close one first",
                    grant.name
                ),
            ));
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let cancel = parent.child_token();
        inner.conns.insert(serial, (grant.id, cancel.clone()));
        *inner.per_token.entry(grant.id).or_insert(0) += 1;
        Ok(Place {
            live: self.clone(),
            serial,
            token: grant.id,
            cancel,
        })
    }

    /// Ends every connection whose token `still` no longer accepts.
    pub(crate) fn close_unless(&self, still: impl Fn(i64) -> bool) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut closed = 0;
        for (token, cancel) in inner.conns.values() {
            if !still(*token) {
                cancel.cancel();
                closed += 1;
            }
        }
        closed
    }
}

impl Place {
    /// The token this connection authenticated with.
    pub(crate) fn token(&self) -> i64 {
        self.token
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = self.live.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.conns.remove(&self.serial);
        if let Some(n) = inner.per_token.get_mut(&self.token) {
            *n -= 1;
            if *n == 0 {
                inner.per_token.remove(&self.token);
            }
        }
    }
}
