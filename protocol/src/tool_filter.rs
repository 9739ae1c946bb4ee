//! A run's tool filter (`toolFilter`): which of the child's tools it may use, how acpd hands
//! that to an agent that takes tool lists at session creation, and how acpd names the tool a
//! `tool_call` update or a permission request is about (its backstop, for when the agent does
//! not hold to the filter).
//!
//! Names are matched exactly (case-sensitive, as agents name their tools). `allow` is applied
//! before `deny`: a tool is permitted when `allow` is absent or lists it, and `deny` does not.
//! An MCP server-level name `mcp__SERVER` stands for every tool of that server
//! (`mcp__SERVER__TOOL`), as Claude Code reads it.

use serde::{Deserialize, Serialize};

/// Names in one list, at most: a filter is a policy, not a data channel.
pub const MAX_NAMES: usize = 256;
/// Bytes of one name, at most.
pub const MAX_NAME: usize = 128;

/// `{allow?: [name], deny?: [name]}`, the seed's `ToolRestriction`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolFilter {
    /// Only these tools; absent: every tool not denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Never these tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
}

impl ToolFilter {
    /// Why this filter cannot be enforced as written, if it cannot: an empty filter (neither
    /// list), an empty `deny`, too many names, or a name that is not a plain tool name (a
    /// permission rule such as `Bash(rm:*)` would filter at the agent and match nothing here).
    pub fn check(&self) -> Result<(), String> {
        if self.allow.is_none() && self.deny.as_ref().is_none_or(Vec::is_empty) {
            return Err("toolFilter names no tool: give `allow` or a non-empty `deny`".into());
        }
        for (list, names) in [("allow", &self.allow), ("deny", &self.deny)] {
            let Some(names) = names else { continue };
            if names.len() > MAX_NAMES {
                return Err(format!("toolFilter.{list} has more than {MAX_NAMES} names"));
            }
            if let Some(bad) = names.iter().find(|n| !plain_name(n)) {
                return Err(format!(
                    "toolFilter.{list}: {:?} is not a tool name (1 to {MAX_NAME} of \
                     A-Z a-z 0-9 _ - .)",
                    crate::utf8::head(bad, MAX_NAME)
                ));
            }
        }
        Ok(())
    }

    /// Whether the tool named `name` may run.
    pub fn permits(&self, name: &str) -> bool {
        let listed = |names: &Option<Vec<String>>| {
            names.as_ref().map(|ns| ns.iter().any(|n| matches(n, name)))
        };
        listed(&self.allow).unwrap_or(true) && !listed(&self.deny).unwrap_or(false)
    }

    /// Whether a tool call whose name acpd cannot tell may run: only where no `allow` list says
    /// "nothing else".
    pub fn permits_unnamed(&self) -> bool {
        self.allow.is_none()
    }

    /// This filter (a run's) narrowed by `inner` (what a run nested under it asks): a tool is
    /// permitted only where both permit it. The `deny` lists are joined; the `allow` lists
    /// meet, a name of one kept where the other's covers it (so `mcp__S` and `mcp__S__T`
    /// meet at `mcp__S__T`).
    pub fn narrowed_by(&self, inner: &ToolFilter) -> ToolFilter {
        let covered = |by: &[String], name: &String| by.iter().any(|b| matches(b, name));
        let allow = match (&self.allow, &inner.allow) {
            (None, None) => None,
            (Some(a), None) | (None, Some(a)) => Some(a.clone()),
            (Some(outer), Some(asked)) => {
                let mut met: Vec<String> = Vec::new();
                let both = asked
                    .iter()
                    .filter(|n| covered(outer, n))
                    .chain(outer.iter().filter(|n| covered(asked, n)));
                for name in both {
                    if !met.contains(name) {
                        met.push(name.clone());
                    }
                }
                Some(met)
            }
        };
        let deny = match (&self.deny, &inner.deny) {
            (None, None) => None,
            (a, b) => {
                let mut joined: Vec<String> = Vec::new();
                for name in a.iter().chain(b).flatten() {
                    if !joined.contains(name) {
                        joined.push(name.clone());
                    }
                }
                Some(joined)
            }
        };
        ToolFilter { allow, deny }
    }

    /// Whether an `allow` list leaves no named tool the `deny` list does not take away.
    pub fn permits_nothing(&self) -> bool {
        self.allow
            .as_ref()
            .is_some_and(|allow| allow.iter().all(|n| !self.permits(n)))
    }

    /// The filter as claude-agent-acp takes it, `session/new`'s `_meta`: it spreads
    /// `_meta.claudeCode.options` into the Claude Agent SDK's options, where `tools` is the set
    /// of built-in tools the model is offered and `disallowedTools` are removed from its
    /// context. (The SDK's `allowedTools` means "run without asking", so it is never set.)
    pub fn claude_meta(&self) -> serde_json::Value {
        let mut options = serde_json::Map::new();
        if let Some(allow) = &self.allow {
            options.insert("tools".into(), serde_json::json!(allow));
        }
        if let Some(deny) = &self.deny {
            options.insert("disallowedTools".into(), serde_json::json!(deny));
        }
        serde_json::json!({ "claudeCode": { "options": options } })
    }
}

fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `listed` names `name`: the same name, or `mcp__SERVER` for one of that server's tools.
fn matches(listed: &str, name: &str) -> bool {
    if listed == name {
        return true;
    }
    listed.starts_with("mcp__")
        && !listed["mcp__".len()..].contains("__")
        && name
            .strip_prefix(listed)
            .is_some_and(|rest| rest.starts_with("__"))
}

/// The name of the tool a `tool_call`/`tool_call_update` (or a permission request's
/// `toolCall`) is about, when the agent says it: claude-agent-acp puts it in
/// `_meta.claudeCode.toolName` (every tool report) and in a `name` field beside ACP's own
/// (`title` is for people: a Bash call's title is its command line).
pub fn tool_name(tool_call: &serde_json::Value) -> Option<&str> {
    tool_call
        .pointer("/_meta/claudeCode/toolName")
        .and_then(serde_json::Value::as_str)
        .or_else(|| tool_call.get("name").and_then(serde_json::Value::as_str))
}

/// Whether a tool call with this status ran or runs: `in_progress` and `completed` say so.
/// `pending` has not started, and `failed` is also what an agent reports for a call it
/// refused (Claude Code answers a tool it was not offered "No such tool available"), so
/// neither counts.
pub fn ran(status: &str) -> bool {
    matches!(status, "in_progress" | "completed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(v: serde_json::Value) -> ToolFilter {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn allow_is_applied_before_deny_and_names_match_exactly() {
        let f = filter(json!({"allow": ["Read", "Bash"], "deny": ["Bash"]}));
        assert!(f.permits("Read"));
        assert!(!f.permits("Bash"));
        assert!(!f.permits("bash") && !f.permits("Write"));
        assert!(!f.permits_unnamed());
        let deny = filter(json!({"deny": ["Bash"]}));
        assert!(deny.permits("Write") && !deny.permits("Bash") && deny.permits_unnamed());
    }

    #[test]
    fn a_server_level_mcp_name_covers_that_servers_tools_only() {
        let f = filter(json!({"deny": ["mcp__acpd"]}));
        assert!(!f.permits("mcp__acpd__delegate"));
        assert!(f.permits("mcp__acpd2__delegate"));
        assert!(f.permits("mcp__acpdx"));
        let tool = filter(json!({"deny": ["mcp__acpd__delegate"]}));
        assert!(!tool.permits("mcp__acpd__delegate"));
        assert!(tool.permits("mcp__acpd__delegate__x"));
    }

    #[test]
    fn empty_unknown_or_rule_shaped_filters_are_refused() {
        assert!(filter(json!({})).check().is_err());
        assert!(filter(json!({"deny": []})).check().is_err());
        assert!(
            filter(json!({"allow": []})).check().is_ok(),
            "allow nothing"
        );
        assert!(filter(json!({"deny": ["Bash(rm:*)"]})).check().is_err());
        assert!(filter(json!({"deny": [""]})).check().is_err());
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| format!("t{i}")).collect();
        assert!(filter(json!({ "allow": many })).check().is_err());
        assert!(serde_json::from_value::<ToolFilter>(json!({"block": ["x"]})).is_err());
        assert!(serde_json::from_value::<ToolFilter>(json!({"deny": "Bash"})).is_err());
    }

    #[test]
    fn a_nested_filter_only_narrows_its_ancestor_s() {
        let above = filter(json!({"allow": ["Read", "Bash", "mcp__srv"], "deny": ["Write"]}));
        // Nothing asked: the ancestor's filter as it is.
        assert_eq!(above.narrowed_by(&ToolFilter::default()), above);
        // Denies are joined; allows meet (a tool of a server-level name included).
        let asked = filter(json!({"allow": ["Bash", "Grep", "mcp__srv__run"], "deny": ["Bash"]}));
        let n = above.narrowed_by(&asked);
        assert_eq!(
            n,
            filter(json!({"allow": ["Bash", "mcp__srv__run"], "deny": ["Write", "Bash"]}))
        );
        assert!(!n.permits("Bash") && !n.permits("Grep") && !n.permits("Read"));
        assert!(n.permits("mcp__srv__run") && !n.permits("mcp__srv__other"));
        assert!(!n.permits_nothing());
        // Allowing only what the ancestor forbids permits nothing.
        let denied =
            filter(json!({"deny": ["Bash"]})).narrowed_by(&filter(json!({"allow": ["Bash"]})));
        assert!(denied.permits_nothing());
        let apart =
            filter(json!({"allow": ["Read"]})).narrowed_by(&filter(json!({"allow": ["Write"]})));
        assert_eq!(apart.allow, Some(vec![]));
        assert!(apart.permits_nothing());
        // A deny-only ancestor and a deny-only request: every tool but both lists.
        let d = filter(json!({"deny": ["Bash"]})).narrowed_by(&filter(json!({"deny": ["Write"]})));
        assert!(!d.permits("Bash") && !d.permits("Write") && d.permits("Read"));
    }

    #[test]
    fn claude_gets_tools_and_disallowed_tools_never_allowed_tools() {
        let m = filter(json!({"allow": ["Read"], "deny": ["Bash"]})).claude_meta();
        assert_eq!(
            m,
            json!({"claudeCode": {"options": {"tools": ["Read"], "disallowedTools": ["Bash"]}}})
        );
        assert!(m.pointer("/claudeCode/options/allowedTools").is_none());
    }

    #[test]
    fn the_tool_name_comes_from_claude_meta_then_name_never_the_title() {
        let update = json!({"toolCallId": "t", "title": "Read", "name": "Bash",
            "_meta": {"claudeCode": {"toolName": "Edit"}}});
        assert_eq!(tool_name(&update), Some("Edit"));
        assert_eq!(
            tool_name(&json!({"title": "touch x", "name": "Bash"})),
            Some("Bash")
        );
        assert_eq!(tool_name(&json!({"title": "Bash"})), None);
        assert!(ran("in_progress") && ran("completed") && !ran("pending") && !ran("failed"));
    }
}
