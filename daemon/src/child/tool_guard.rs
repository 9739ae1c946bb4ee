//! acpd's backstop behind a run's tool filter: the agent was given the filter at
//! `session/new`, and this holds the child to it from the outside. A permission request for a
//! filtered tool is refused without asking anyone; a filtered tool the child reports running
//! or done ends the turn (`tool-filter`). A tool the agent reports and then refuses (`pending`,
//! then `failed`) is not a breach: Claude Code reports a tool it was not offered that way.

use std::collections::HashSet;
use std::sync::Arc;

use acpd_protocol::tool_filter::{self, ToolFilter};
use serde_json::Value;
use serde_json::value::RawValue;

/// Filtered tool calls remembered per turn, at most (an update may name only its id).
const MAX_FILTERED: usize = 1024;

pub(super) const NOTE_REFUSED: &str =
    "tool filter: a permission request for a filtered tool was refused";
pub(super) const NOTE_RAN: &str =
    "tool filter: a filtered tool ran anyway; the turn was cancelled and the child ended";

pub(super) struct ToolGuard {
    filter: Arc<ToolFilter>,
    /// The ids of the tool calls of this turn that name a filtered tool.
    filtered: HashSet<String>,
}

impl ToolGuard {
    pub(super) fn new(filter: Arc<ToolFilter>) -> ToolGuard {
        ToolGuard {
            filter,
            filtered: HashSet::new(),
        }
    }

    /// Whether the tool call `tool_call` (a `tool_call`/`tool_call_update`, or a permission
    /// request's `toolCall`) is about a filtered tool: by its name when it has one, else by an
    /// earlier report of the same id; a new call without a name is judged by
    /// [`ToolFilter::permits_unnamed`].
    fn filtered(&mut self, tool_call: &Value, new: bool) -> bool {
        let id = tool_call.get("toolCallId").and_then(Value::as_str);
        let filtered = match tool_filter::tool_name(tool_call) {
            Some(name) => !self.filter.permits(name),
            None => {
                id.is_some_and(|id| self.filtered.contains(id))
                    || new && !self.filter.permits_unnamed()
            }
        };
        if filtered
            && let Some(id) = id
            && self.filtered.len() < MAX_FILTERED
        {
            self.filtered.insert(id.to_owned());
        }
        filtered
    }

    /// A `tool_call` or `tool_call_update`: true when it reports a filtered tool running or
    /// done.
    pub(super) fn ran(&mut self, update: &RawValue) -> bool {
        let Ok(update) = serde_json::from_str::<Value>(update.get()) else {
            return false;
        };
        let new = update.get("sessionUpdate").and_then(Value::as_str) == Some("tool_call");
        if !self.filtered(&update, new) {
            return false;
        }
        update
            .get("status")
            .and_then(Value::as_str)
            .is_some_and(tool_filter::ran)
    }

    /// A `session/request_permission`'s params: true when it asks for a filtered tool.
    pub(super) fn refuses(&mut self, params: Option<&RawValue>) -> bool {
        let Some(params) = params.and_then(|p| serde_json::from_str::<Value>(p.get()).ok()) else {
            return false;
        };
        params
            .get("toolCall")
            .is_some_and(|call| self.filtered(call, true))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn guard(filter: Value) -> ToolGuard {
        ToolGuard::new(Arc::new(serde_json::from_value(filter).unwrap()))
    }

    fn raw(v: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    #[test]
    fn a_filtered_tool_breaks_the_filter_only_once_it_runs() {
        let mut g = guard(json!({"deny": ["Bash"]}));
        let bash = |status: &str| {
            raw(
                json!({"sessionUpdate": "tool_call", "toolCallId": "t1", "status": status,
                "_meta": {"claudeCode": {"toolName": "Bash"}}}),
            )
        };
        assert!(!g.ran(&bash("pending")));
        // The refusal Claude Code reports for a tool it was not offered.
        let failed = raw(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
            "status": "failed"}),
        );
        assert!(!g.ran(&failed));
        // A later update of the same id names only the id.
        let done = raw(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
            "status": "completed"}),
        );
        assert!(g.ran(&done));
        assert!(g.ran(&bash("in_progress")));
        let read = raw(json!({"sessionUpdate": "tool_call", "toolCallId": "t2",
            "status": "completed", "name": "Read", "title": "Bash"}));
        assert!(!g.ran(&read));
    }

    #[test]
    fn an_allow_list_refuses_what_it_does_not_name_and_unnamed_calls() {
        let mut g = guard(json!({"allow": ["Read"]}));
        let ask = |call: Value| raw(json!({"sessionId": "s", "toolCall": call, "options": []}));
        assert!(g.refuses(Some(&ask(json!({"toolCallId": "a", "name": "Write"})))));
        assert!(!g.refuses(Some(&ask(json!({"toolCallId": "b", "name": "Read"})))));
        assert!(g.refuses(Some(&ask(json!({"toolCallId": "c", "title": "Read"})))));
        let unnamed = raw(json!({"sessionUpdate": "tool_call", "toolCallId": "d",
            "status": "completed"}));
        assert!(g.ran(&unnamed));
        let mut deny = guard(json!({"deny": ["Bash"]}));
        assert!(!deny.refuses(Some(&ask(json!({"toolCallId": "c", "title": "Bash"})))));
        assert!(!deny.refuses(None));
    }
}
