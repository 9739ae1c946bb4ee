//! The subagent vocabulary: providers, start requests, results, stop reasons and the per-turn
//! lifecycle events. JSON bodies are camelCase, as ACP's own are.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::acp::ContentBlock;

/// The environment variable that tells a child how deep it runs below the top acpd (0 at the
/// top): every acpd sets it for its children, and a nested acpd refuses a run past the limit.
pub const DEPTH_VAR: &str = "ACPD_DEPTH";
/// The depth limit an outer acpd imposes on every acpd below it.
pub const MAX_DEPTH_VAR: &str = "ACPD_MAX_DEPTH";

/// Start-time features a provider can enforce. A request that sets a field whose flag is false
/// is refused before anything is spawned (never accepted-then-ignored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub output_schema: bool,
    /// Gates the request field `maxDepth`.
    pub depth_limit: bool,
    pub tool_filter: bool,
    pub persona: bool,
}

/// A provider as `acpd providers` and `_acpd/providers` describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInfo {
    pub name: String,
    pub description: String,
    pub capabilities: Capabilities,
    /// Whether the child sees the parent's earlier turns (never, for an ACP child).
    pub inherits_parent_context: bool,
    pub default: bool,
    /// `shared` or `worktree`: the provider's workspace (a request may ask for a worktree only
    /// where it is `worktree`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceKind>,
    /// The sandbox really enforced for its children: `landlock (ABI 7)`, `none`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// A request to start one delegation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    pub prompt: Vec<ContentBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<String>,
    /// Absolute cap on delegation depth for this run and everything it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_filter: Option<crate::tool_filter::ToolFilter>,
    /// `shared` or `worktree` (only where the provider allows it); absent: the provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceKind>,
    /// The commit a worktree starts from (a branch, tag or sha); absent: the cwd's `HEAD`.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub base_ref: Option<String>,
    /// What the run (and every run nested under it) may spend; never above the provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// ACP's `_meta`: W3C trace context here (`traceparent`, `tracestate`) is what the run's
    /// spans continue when acpd exports them.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A run's budget: tokens the agent reports (`usage_update`, the prompt result's `usage`) and
/// wall-clock time from its start, across turns. Runs nested under it spend from it too.
///
/// Read only from a JSON object: serde's derive would also take an array by position
/// (`[5000, "30m"]`), a shape no document shows and no caller means.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// A duration such as `"30m"` or `"90s"` (bare digits are seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BudgetFields {
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    wall: Option<String>,
}

impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Budget, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = Budget;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"`budget` as an object, e.g. {"tokens": 5000, "wall": "30m"}"#)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Budget, A::Error> {
                let fields =
                    BudgetFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                        .map_err(|e| serde::de::Error::custom(format!("budget: {e}")))?;
                Ok(Budget {
                    tokens: fields.tokens,
                    wall: fields.wall,
                })
            }
        }
        d.deserialize_map(Object)
    }
}

/// Where a child works: the cwd it is given, or a git worktree of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceKind {
    Shared,
    Worktree,
}

/// What a run did in its worktree, as of the end of its last turn: its work is committed on
/// `branch`, and `changed`/`diffstat` compare that branch with `base`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceReport {
    pub branch: String,
    pub path: PathBuf,
    /// The commit the worktree started from (a full sha).
    pub base: String,
    /// Paths (relative to the repository) that differ from `base`.
    pub changed: Vec<String>,
    /// `git diff --stat` of `base` against the branch.
    pub diffstat: String,
    /// Untracked paths left out of the commit because a `.gitignore` (the repository's or
    /// one the child wrote) ignores them; a directory is one entry ending in `/`. At most
    /// [`IGNORED_LISTED`]; `ignoredMore` counts the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ignored_more: u64,
    /// Set when this turn's work could not be committed: it is still only in the worktree
    /// at `path`, which dispose keeps (unless forced) so it is not lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<WorkspaceFailure>,
}

/// How many ignored paths a [`WorkspaceReport`] names.
pub const IGNORED_LISTED: usize = 100;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why a turn's work in its worktree is not (all) on its branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFailure {
    pub kind: WorkspaceFailureKind,
    /// The worktree that holds the uncommitted work.
    pub path: PathBuf,
    /// What failed, in git's own words where git refused.
    pub message: String,
}

/// The step of committing a turn's work that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkspaceFailureKind {
    /// `git add` refused (a locked index, an empty nested repository, an unreadable file, a
    /// path git will not track, a timeout).
    Stage,
    /// git left paths off the branch: a directory holding a `.git` of its own (a nested
    /// repository, committed in or empty, or a `.git` file), whose files and commits would
    /// not be on the branch.
    NotAdded,
    /// `git commit` refused.
    Commit,
    /// The work is committed, but listing what changed failed (`changed` and `diffstat`
    /// are empty).
    Report,
}

/// The outcome vocabulary of a subagent turn. Consumers must treat a value they do not know as
/// a failure, never as success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StopReason {
    Completed,
    Aborted,
    Error,
    MaxTokens,
    Refusal,
}

impl StopReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::Aborted => "aborted",
            StopReason::Error => "error",
            StopReason::MaxTokens => "max-tokens",
            StopReason::Refusal => "refusal",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in a run's life a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    Spawn,
    Initialize,
    SessionNew,
    Prompt,
}

impl Stage {
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Spawn => "spawn",
            Stage::Initialize => "initialize",
            Stage::SessionNew => "session-new",
            Stage::Prompt => "prompt",
        }
    }
}

/// What kind of failure it was (DESIGN.md's outcome table, plus the start-time kinds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    RemoteLimit,
    RemoteCancel,
    UnknownStopReason,
    Rpc,
    Auth,
    ProcessExit,
    Timeout,
    Hung,
    Protocol,
    /// The executable could not be started (missing, not executable, …).
    Spawn,
    /// The child speaks another ACP protocol version.
    ProtocolVersion,
    /// The final output is not JSON that validates against the run's `outputSchema`.
    OutputSchema,
    /// The child's tree hit its cgroup memory limit (`memory_max`): the kernel's OOM killer
    /// ended a process of it (`memory.events` `oom_kill`).
    Oom,
    /// The child's tree hit its cgroup process limit (`pids_max`): a fork failed
    /// (`pids.events` `max`).
    Pids,
    /// A remote provider's host could not be reached (name, refused, timeout, ssh failure).
    Unreachable,
    /// A remote provider's far side has no `acpd` to run `acpd supervise`.
    NoRemoteAcpd,
    /// The run, or a run above it, spent its `budget` (tokens or wall time).
    Budget,
    /// A tool the run's `toolFilter` forbids ran anyway (the agent reported it in progress or
    /// completed): acpd cancelled the turn and ended the child.
    ToolFilter,
    /// A category named by the child's own typed failure record (`_meta.acpd.failure`),
    /// restricted to `[a-z0-9-]`.
    #[serde(untagged)]
    Reported(String),
}

impl Category {
    pub fn as_str(&self) -> &str {
        match self {
            Category::RemoteLimit => "remote-limit",
            Category::RemoteCancel => "remote-cancel",
            Category::UnknownStopReason => "unknown-stop-reason",
            Category::Rpc => "rpc",
            Category::Auth => "auth",
            Category::ProcessExit => "process-exit",
            Category::Timeout => "timeout",
            Category::Hung => "hung",
            Category::Protocol => "protocol",
            Category::Spawn => "spawn",
            Category::ProtocolVersion => "protocol-version",
            Category::OutputSchema => "output-schema",
            Category::Oom => "oom",
            Category::Pids => "pids",
            Category::Unreachable => "unreachable",
            Category::NoRemoteAcpd => "no-remote-acpd",
            Category::Budget => "budget",
            Category::ToolFilter => "tool-filter",
            Category::Reported(s) => s,
        }
    }
}

/// The fixed facts of a non-completed result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub stage: Stage,
    pub category: Category,
    /// The JSON-RPC error code, when the child answered with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal name, such as `SIGKILL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// The result of one turn of a published run. After publication a turn never fails: every
/// outcome is one of these.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentResult {
    pub run_id: String,
    pub provider: String,
    pub turn: u32,
    pub stop_reason: StopReason,
    pub output: Vec<ContentBlock>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The run's worktree, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceReport>,
}

impl SubagentResult {
    /// The output's text blocks joined, for terminals and logs.
    pub fn output_text(&self) -> String {
        self.output
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Sent when a turn starts: the first at publication, later ones for each follow-up.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Started {
    pub run_id: String,
    pub provider: String,
    pub turn: u32,
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Sent when that turn settles, carrying its result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ended {
    pub run_id: String,
    pub provider: String,
    pub turn: u32,
    pub result: SubagentResult,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_serialises_camel_case_and_omits_absent_fields() {
        let r = SubagentResult {
            run_id: "r1".into(),
            provider: "echo".into(),
            turn: 1,
            stop_reason: StopReason::MaxTokens,
            output: vec![ContentBlock::from("hi".to_string())],
            output_truncated: false,
            structured: None,
            diagnostic: None,
            failure: None,
            workspace: None,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["runId"], "r1");
        assert_eq!(v["stopReason"], "max-tokens");
        assert_eq!(v["output"][0]["type"], "text");
        assert!(v.get("outputTruncated").is_none());
        assert!(v.get("failure").is_none());
    }

    #[test]
    fn start_request_rejects_unknown_fields_and_negative_depth() {
        assert!(serde_json::from_str::<StartRequest>(r#"{"prompt":[],"bogus":1}"#).is_err());
        assert!(serde_json::from_str::<StartRequest>(r#"{"prompt":[],"maxDepth":-1}"#).is_err());
        let r: StartRequest = serde_json::from_str(
            r#"{"prompt":[{"type":"text","text":"x"}],"maxDepth":1,"parentSessionId":"p"}"#,
        )
        .unwrap();
        assert_eq!(r.max_depth, Some(1));
        assert_eq!(r.parent_session_id.as_deref(), Some("p"));
        let r: StartRequest =
            serde_json::from_str(r#"{"prompt":[],"budget":{"tokens":100,"wall":"30m"}}"#).unwrap();
        let budget = r.budget.unwrap();
        assert_eq!(
            (budget.tokens, budget.wall.as_deref()),
            (Some(100), Some("30m"))
        );
        assert!(
            serde_json::from_str::<StartRequest>(r#"{"prompt":[],"budget":{"dollars":1}}"#)
                .is_err()
        );
        assert!(
            serde_json::from_str::<StartRequest>(r#"{"prompt":[],"budget":{"tokens":-1}}"#)
                .is_err()
        );
        let e = serde_json::from_str::<StartRequest>(r#"{"prompt":[],"budget":[100,"30m"]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`budget` as an object"), "{e}");
    }

    #[test]
    fn categories_serialise_as_kebab_strings() {
        let f = Failure {
            stage: Stage::SessionNew,
            category: Category::UnknownStopReason,
            code: None,
            exit_code: Some(3),
            signal: None,
        };
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["stage"], "session-new");
        assert_eq!(v["category"], "unknown-stop-reason");
        assert_eq!(v["exitCode"], 3);
        let reported = serde_json::to_value(Category::Reported("quota".into())).unwrap();
        assert_eq!(reported, "quota");
    }
}
