//! A run's budget: the tokens its agent reports and the wall time since it started, against
//! the limit of its request (never above its provider's `budget`). A nested run's spending is
//! charged to every run above it too, and a run whose budget is spent cancels the budgets of
//! every run below it (child tokens), so a subtree can never spend past its root.
//!
//! Tokens are what the agent says: within a turn, the largest `usage_update.used` seen (the
//! context one model call read: a lower bound of what the turn spent), raised to the prompt
//! result's `usage.totalTokens` when that is larger. An agent that reports nothing spends
//! nothing as far as acpd can tell; the wall budget holds regardless.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use acpd_protocol::subagent::Budget as Asked;
use tokio_util::sync::CancellationToken;

use super::RegistryError;
use crate::config::{Budget, ProviderConfig};

/// Why a budget was spent, as the result's diagnostic says it.
const TOKENS_SPENT: &str = "budget: the run's token budget is spent";
const WALL_SPENT: &str = "budget: the run's wall-time budget is spent";
const ABOVE_SPENT: &str = "budget: a run above this one spent its budget";

/// One run's meter, linked to the meter of the run it is nested under.
pub struct Spend {
    limit: Budget,
    /// Tokens charged to this run: its own turns' and every nested run's.
    tokens: AtomicU64,
    parent: Option<Arc<Spend>>,
    /// Cancelled when this run's budget, or one above it, is spent.
    spent: CancellationToken,
    why: OnceLock<&'static str>,
    /// Ends the wall budget's timer with the run.
    timer: Option<tokio::task::JoinHandle<()>>,
}

impl Spend {
    /// A meter with `limit`, under `parent`'s; the wall clock starts now.
    pub(super) fn new(limit: Budget, parent: Option<Arc<Spend>>) -> Arc<Spend> {
        let spent = match &parent {
            Some(p) => p.spent.child_token(),
            None => CancellationToken::new(),
        };
        Arc::new_cyclic(|me: &Weak<Spend>| {
            let timer = limit.wall.map(|wall| {
                let deadline = crate::durations::deadline(wall);
                let (me, spent) = (me.clone(), spent.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {
                            if let Some(me) = me.upgrade() {
                                me.exhaust(WALL_SPENT);
                            }
                        }
                        _ = spent.cancelled() => {}
                    }
                })
            });
            Spend {
                limit,
                tokens: AtomicU64::new(0),
                parent,
                spent,
                why: OnceLock::new(),
                timer,
            }
        })
    }

    /// Adds `tokens` to this run and every run above it; a run whose budget that exceeds is
    /// spent (and with it, every run below it).
    pub fn charge(&self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let mut at = Some(self);
        while let Some(spend) = at {
            // Saturating: an agent reporting absurd numbers cannot wrap the count to small.
            let add = |t: u64| Some(t.saturating_add(tokens));
            let (Ok(before) | Err(before)) =
                spend
                    .tokens
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, add);
            let now = before.saturating_add(tokens);
            if spend.limit.tokens.is_some_and(|limit| now > limit) {
                spend.exhaust(TOKENS_SPENT);
            }
            at = spend.parent.as_deref();
        }
    }

    fn exhaust(&self, why: &'static str) {
        if self.why.set(why).is_ok() {
            crate::metrics::get().limit_hit(crate::metrics::Limit::Budget)
        }
        self.spent.cancel();
    }

    /// Cancelled once this run's budget, or one above it, is spent.
    pub fn spent(&self) -> &CancellationToken {
        &self.spent
    }

    pub fn is_spent(&self) -> bool {
        self.spent.is_cancelled()
    }

    /// Tokens charged to this run, its nested runs' included.
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Acquire)
    }

    pub fn limit(&self) -> Budget {
        self.limit
    }

    /// Which budget ran out, for the result's diagnostic.
    pub(super) fn why(&self) -> &'static str {
        self.why.get().copied().unwrap_or(ABOVE_SPENT)
    }
}

impl crate::child::TokenMeter for Spend {
    fn charge(&self, tokens: u64) {
        Spend::charge(self, tokens);
    }

    fn spent(&self) -> &CancellationToken {
        &self.spent
    }
}

impl Drop for Spend {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            timer.abort();
        }
    }
}

/// The budget a start asks for, checked against its provider's: a request may lower either
/// limit, never raise it (refused, naming the provider's, so the caller can ask again).
pub(super) fn resolve(
    provider: &ProviderConfig,
    asked: Option<&Asked>,
) -> Result<Budget, RegistryError> {
    let ceiling = provider.budget;
    let Some(asked) = asked else {
        return Ok(ceiling);
    };
    let refuse = |reason: String| RegistryError::InvalidRequest { reason };
    let tokens = match (asked.tokens, ceiling.tokens) {
        (Some(0), _) => return Err(refuse("budget.tokens must be at least 1".into())),
        (Some(n), Some(max)) if n > max => {
            return Err(refuse(format!(
                "budget.tokens {n} is above provider \"{}\"'s budget of {max} tokens; ask for at \
                 most {max}, or leave it out",
                provider.name
            )));
        }
        (Some(n), _) => Some(n),
        (None, max) => max,
    };
    let wall = match (&asked.wall, ceiling.wall) {
        (Some(text), max) => {
            let d = crate::durations::parse_exact(text)
                .map_err(|e| refuse(format!("budget.wall: {e}")))?;
            if d.is_zero() {
                return Err(refuse("budget.wall must be longer than 0s".into()));
            }
            if let Some(max) = max.filter(|max| d > *max) {
                return Err(refuse(format!(
                    "budget.wall {text:?} is above provider \"{}\"'s budget of {}; ask for at \
                     most that, or leave it out",
                    provider.name,
                    humantime::format_duration(max)
                )));
            }
            Some(d)
        }
        (None, max) => max,
    };
    Ok(Budget { tokens, wall })
}
