//! The budget for unfinished messages, shared by every parent connection of the process.
//!
//! A message that has begun but not ended (a line without its newline, an HTTP body or a
//! WebSocket message still arriving) is held in memory until it ends or its deadline passes.
//! `max_line` bounds one such message, `line_timeout` how long it lives; without a bound
//! across connections, 100 silent parents each holding 16 MiB cost acpd 1.6 GiB. So each
//! connection's unfinished message is free up to [`ALLOWANCE`] (ordinary messages, which never
//! touch the budget), and the bytes past that are taken from one process-wide [`BUDGET`]
//! before they are read. When it is all taken, a reader that needs more stops reading (its
//! peer is slowed by its own socket) until others give some back or its message's deadline
//! passes, and then the message is refused: [`Exhausted`], the LIMIT
//! `unfinished_message_budget`, counted in /metrics.
//!
//! Use: one [`Held`] per connection ([`HalfBudget::held`]); before reading more of a message,
//! [`Held::grow`] to the size it will have; once it ended (or was dropped), [`Held::fit`] to
//! what is still buffered (0 when nothing is). Dropping the `Held` gives everything back.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Bytes that unfinished messages of all parent connections together may hold past their
/// [`ALLOWANCE`]: four messages of the default `max_line` (16 MiB). A fixed size, not a config
/// key: a message larger than the whole budget (a `max_line` raised past it) takes all of it.
pub(crate) const BUDGET: usize = 64 << 20;
/// Bytes of one connection's unfinished message that are free of the budget: a stream's read
/// buffer, so a line that fits in one read never touches the budget.
pub(crate) const ALLOWANCE: usize = 64 << 10;
/// The budget is taken in steps of this many bytes: one atomic operation per 256 KiB of a large
/// message, not per read.
const GRAIN: usize = 256 << 10;

/// The name the LIMIT error and /metrics give this budget.
pub(crate) const LIMIT_NAME: &str = "unfinished_message_budget";

/// A budget of bytes for unfinished messages.
#[derive(Debug)]
pub(crate) struct HalfBudget {
    /// One permit per byte past each connection's allowance.
    permits: Semaphore,
    total: usize,
}

/// The whole budget was held by others until a message's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "unfinished messages on all connections held the whole {total}-byte budget \
     (unfinished_message_budget) until this message's deadline"
)]
pub struct Exhausted {
    pub total: usize,
}

impl HalfBudget {
    /// The process's budget ([`BUDGET`] bytes), shared by every parent connection.
    pub(crate) fn global() -> &'static Arc<HalfBudget> {
        static GLOBAL: OnceLock<Arc<HalfBudget>> = OnceLock::new();
        GLOBAL.get_or_init(|| HalfBudget::new(BUDGET))
    }

    /// A budget of `total` bytes (at most `u32::MAX`, the semaphore's count).
    pub(crate) fn new(total: usize) -> Arc<HalfBudget> {
        let total = total.min(u32::MAX as usize);
        Arc::new(HalfBudget {
            permits: Semaphore::new(total),
            total,
        })
    }

    /// Bytes not held by any message now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// A connection's share: nothing past its allowance yet.
    pub(crate) fn held(self: &Arc<Self>) -> Held {
        Held {
            budget: self.clone(),
            taken: 0,
        }
    }
}

/// What one connection's unfinished message holds of a [`HalfBudget`]; given back on drop.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<HalfBudget>,
    /// Bytes taken from the budget, a multiple of [`GRAIN`] or the whole budget.
    taken: usize,
}

impl Held {
    /// How many bytes the unfinished message may hold now without growing: its allowance and
    /// what it took; unbounded once it holds the whole budget.
    pub(crate) fn room(&self) -> usize {
        if self.taken >= self.budget.total {
            usize::MAX
        } else {
            ALLOWANCE + self.taken
        }
    }

    /// Makes room for the unfinished message to hold `to` bytes: at once when the budget has
    /// them, else waits for them in turn (first come, first served) until `deadline`, and then
    /// is [`Exhausted`] (counted in /metrics), holding what it held before. Cancel-safe:
    /// nothing is taken unless it returns `Ok`.
    pub(crate) async fn grow(&mut self, to: usize, deadline: Instant) -> Result<(), Exhausted> {
        if to <= self.room() {
            return Ok(());
        }
        let want = self.share_of(to);
        let more = u32::try_from(want - self.taken).unwrap_or(u32::MAX);
        let permit = match self.budget.permits.try_acquire_many(more) {
            Ok(permit) => Some(permit),
            Err(_) => {
                let wait = self.budget.permits.acquire_many(more);
                tokio::time::timeout_at(deadline, wait)
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        let Some(permit) = permit else {
            crate::metrics::get().limit_hit(crate::metrics::Limit::UnfinishedMessageBudget);
            return Err(Exhausted {
                total: self.budget.total,
            });
        };
        permit.forget();
        self.taken = want;
        Ok(())
    }

    /// Gives back what a message of `len` bytes does not need: call it when a message ended
    /// (`len` is what is buffered of the next one) or was dropped (0). Costs nothing while
    /// nothing is taken.
    pub(crate) fn fit(&mut self, len: usize) {
        if self.taken == 0 {
            return;
        }
        let keep = if len <= ALLOWANCE {
            0
        } else {
            self.share_of(len)
        };
        if keep < self.taken {
            self.budget.permits.add_permits(self.taken - keep);
            self.taken = keep;
        }
    }

    /// The share of the budget a message of `len` bytes (past the allowance) takes: whole
    /// grains, at most the whole budget.
    fn share_of(&self, len: usize) -> usize {
        len.saturating_sub(ALLOWANCE)
            .div_ceil(GRAIN)
            .saturating_mul(GRAIN)
            .min(self.budget.total)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.fit(0);
    }
}

/// The LIMIT error a peer gets for a message refused for the budget, saying what to do.
pub(crate) fn refusal(e: &Exhausted) -> acpd_protocol::envelope::RpcError {
    let mut error = acpd_protocol::envelope::RpcError::limit(LIMIT_NAME, e.total as u64);
    error.message = format!(
        "Limit reached: {e}; the message was dropped: send it again once fewer large messages \
         are arriving at acpd"
    );
    error
}
