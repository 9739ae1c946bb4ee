//! Everything a run tells its owner, on one ordered channel: the lifecycle pair, the child's
//! raw updates and the permission requests it wants answered. One channel, so an owner sees a
//! run's `started` before any of its traffic and its traffic before its `ended`.

use acpd_protocol::subagent::{Ended, Started};
use serde_json::value::RawValue;

use crate::child::PermissionAsk;

pub enum RunEvent {
    Started(Started),
    Ended(Box<Ended>),
    /// A child's `session/update` `update` object, untouched (when the owner asked for them).
    Update {
        run_id: String,
        update: Box<RawValue>,
    },
    /// A permission request for the owner to answer (policy `forward`).
    Ask {
        run_id: String,
        ask: Box<PermissionAsk>,
    },
}
