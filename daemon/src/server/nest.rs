//! A connection from inside a child's process tree (nested delegation): where it stands —
//! outside acpd, in a run's or bridge session's tree, or below acpd where no child is filed —
//! what it may not do, and cancelling the runs nested under this connection's sessions.

use acpd_protocol::envelope::RpcError;

use super::{Conn, SessionRef, lock};

/// How long a start from inside a child that is still starting waits for it to be filed.
const UNFILED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What a child's own connection may not do: a bridge session it opened would start at the top
/// of the depth count, and one it loaded, closed, deleted or renamed could be its own
/// ancestor's (the prompts and settings of a session pass only to those this connection holds,
/// and it holds none).
pub(super) const BRIDGE_ONLY: &[&str] = &[
    "session/new",
    "session/load",
    "session/resume",
    "session/fork",
    "session/list",
    "session/delete",
    "session/close",
    "session/set_title",
    "authenticate",
    "logout",
];

impl Conn {
    /// `session/cancel` of a run nested under one of this connection's bridge sessions (as
    /// announced to it): the run's turn is cancelled, and what it started.
    pub(super) fn cancel_nested_session(&self, sid: &str) {
        let registry = &self.ctx.registry;
        let Some(run) = registry.runs().into_iter().find(|r| r.session_id == sid) else {
            return;
        };
        // Under one of this connection's bridge sessions, however many runs down.
        let mine = run
            .parent
            .as_ref()
            .and_then(|p| registry.top_session(p))
            .is_some_and(|s| matches!(lock(&self.sessions).get(&s), Some(SessionRef::Bridge(_))));
        if mine {
            registry.cancel_run(&run);
        }
    }

    /// Where the connected process stands: outside this acpd, or in the tree of one of its
    /// children (whose runs it starts nest there). Settled once known; a child still being
    /// started is asked again.
    pub(super) fn lineage(&self) -> crate::registry::Lineage {
        use crate::registry::Lineage;
        if let Some(known) = self.lineage.get() {
            return known.clone();
        }
        let Some(origin) = &self.ctx.origin else {
            return self.lineage.get_or_init(|| Lineage::Outside).clone();
        };
        let sessions = &self.ctx.sessions;
        match self.ctx.registry.lineage_of(origin, |p| sessions.by_pid(p)) {
            Lineage::Unfiled => Lineage::Unfiled,
            settled => self.lineage.get_or_init(|| settled).clone(),
        }
    }

    /// The run or bridge session this connection's runs nest under; waits (a little) for a
    /// child that is still starting to be filed. `Err` when it never is.
    pub(super) async fn nest(&self) -> Result<Option<crate::registry::Nest>, RpcError> {
        use crate::registry::Lineage;
        let deadline = tokio::time::Instant::now() + UNFILED_WAIT;
        loop {
            match self.lineage() {
                Lineage::Outside => return Ok(None),
                Lineage::Nested(nest) => return Ok(Some(nest)),
                Lineage::Unfiled if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Lineage::Unfiled => {
                    return Err(RpcError::invalid_request(
                        "this connection comes from inside a child of this acpd that belongs to \
                         no run or session (yet); try again once it is started",
                    ));
                }
            }
        }
    }
}
