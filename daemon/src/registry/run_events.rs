//! What a run reports to its owner, in order, on one bounded channel: the lifecycle pair of
//! each turn, and — when asked for — the child's raw updates and permission requests, mapped
//! from the child's own events.

use acpd_protocol::subagent::{Ended, Started};
use serde_json::value::RawValue;

use crate::child::{ChildEvent, PermissionAsk};

pub enum RunEvent {
    Started(Started),
    Ended(Box<Ended>),
    /// A `session/update`'s `update` object, as the child sent it.
    Update {
        run_id: String,
        update: Box<RawValue>,
    },
    /// A permission request for the owner to answer (policy `forward`).
    Ask {
        run_id: String,
        ask: Box<PermissionAsk>,
    },
    /// `session/update` params about a run nested under this one (its child delegated), for
    /// an owner that shows this run as a Subagent Session.
    Nested {
        run_id: String,
        params: Box<RawValue>,
    },
}

impl RunEvent {
    pub(super) fn from_child(run_id: &str, event: ChildEvent) -> RunEvent {
        let run_id = run_id.to_string();
        match event {
            ChildEvent::Update(update) => RunEvent::Update { run_id, update },
            ChildEvent::Ask(ask) => RunEvent::Ask { run_id, ask },
        }
    }
}
