//! The tools `acpd mcp` offers: their input schemas, descriptions that name the providers,
//! the arguments they take, and how results and failures read to the calling model.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use acpd_protocol::acp::ContentBlock as AcpBlock;
use acpd_protocol::subagent::{ProviderInfo, StartRequest, StopReason, SubagentResult};
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::mcp_error::Failure;

pub(super) const DELEGATE: &str = "delegate";
pub(super) const START: &str = "subagent_start";
pub(super) const WAIT: &str = "subagent_wait";
pub(super) const SEND: &str = "subagent_send";
pub(super) const CANCEL: &str = "subagent_cancel";
pub(super) const DISPOSE: &str = "subagent_dispose";
pub(super) const LIST: &str = "subagent_list";
pub(super) const PROVIDERS: &str = "providers";

pub(super) const ALL: [&str; 8] = [
    DELEGATE, START, WAIT, SEND, CANCEL, DISPOSE, LIST, PROVIDERS,
];

/// `delegate` and `subagent_start`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct StartArgs {
    #[serde(default)]
    pub provider: Option<String>,
    pub prompt: String,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub output_schema: Option<Value>,
    #[serde(default)]
    pub workspace: Option<acpd_protocol::subagent::WorkspaceKind>,
    #[serde(default, rename = "ref")]
    pub base_ref: Option<String>,
    #[serde(default)]
    pub budget: Option<acpd_protocol::subagent::Budget>,
    #[serde(default)]
    pub tool_filter: Option<acpd_protocol::tool_filter::ToolFilter>,
}

impl StartArgs {
    /// The registry's request; a relative `cwd` is taken from `base` (acpd mcp's own).
    pub(super) fn into_request(self, base: Option<&Path>) -> Result<StartRequest, Failure> {
        if self.prompt.trim().is_empty() {
            return Err(Failure::InvalidArguments(
                "`prompt` is empty: say what the subagent should do".into(),
            ));
        }
        if let Some(schema) = &self.output_schema
            && !schema.is_object()
        {
            return Err(Failure::InvalidArguments(
                "`outputSchema` must be a JSON Schema object".into(),
            ));
        }
        let cwd = match (self.cwd, base) {
            (Some(c), Some(base)) if c.is_relative() => Some(base.join(c)),
            (c, _) => c,
        };
        Ok(StartRequest {
            provider: self.provider,
            prompt: vec![AcpBlock::from(self.prompt)],
            label: self.label,
            cwd,
            output_schema: self.output_schema,
            workspace: self.workspace,
            base_ref: self.base_ref,
            budget: self.budget,
            tool_filter: self.tool_filter,
            ..Default::default()
        })
    }
}

/// `subagent_wait`, `subagent_cancel`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RunArgs {
    pub run_id: String,
}

/// `subagent_dispose`: the run, whether its worktree's branch stays (it does unless
/// `keepBranch` is `false`), and whether a worktree with work git refuses to commit goes
/// all the same (`force`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct DisposeArgs {
    pub run_id: String,
    #[serde(default)]
    pub keep_branch: Option<bool>,
    #[serde(default)]
    pub force: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SendArgs {
    pub run_id: String,
    pub prompt: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NoArgs {}

/// The tool's arguments as `T`; absent arguments read as `{}`.
pub(super) fn parse<T: DeserializeOwned>(
    tool: &str,
    args: Option<JsonObject>,
) -> Result<T, Failure> {
    let value = Value::Object(args.unwrap_or_default());
    serde_json::from_value(value).map_err(|e| Failure::InvalidArguments(format!("{tool}: {e}")))
}

/// The providers, one line each, for the tool descriptions.
fn provider_lines(providers: &[ProviderInfo]) -> String {
    if providers.is_empty() {
        return "No provider is configured.".into();
    }
    let mut text = String::from("Providers (the `provider` argument):");
    for p in providers {
        text.push_str(&format!("\n- {}", p.name));
        if p.default {
            text.push_str(" (default)");
        }
        if !p.description.is_empty() {
            text.push_str(&format!(": {}", p.description));
        }
    }
    text
}

fn object(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

fn start_schema(providers: &[ProviderInfo]) -> Arc<JsonObject> {
    let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
    let mut provider = json!({
        "type": "string",
        "description": "Which agent runs the task (see the list in the description); default: \
                        the default provider.",
    });
    if !names.is_empty() {
        provider["enum"] = json!(names);
    }
    object(json!({
        "type": "object",
        "properties": {
            "provider": provider,
            "prompt": {
                "type": "string",
                "description": "The whole task. The subagent sees nothing of this conversation: \
                                include every file, fact and constraint it needs.",
            },
            "label": {
                "type": "string",
                "description": "A short name for the run, shown in listings and `acpd status`.",
            },
            "cwd": {
                "type": "string",
                "description": "The directory the subagent works in: absolute, or relative to \
                                acpd mcp's own; default: the provider's, else acpd mcp's.",
            },
            "outputSchema": {
                "type": "object",
                "description": "A JSON Schema the final output must satisfy: the subagent is \
                                asked for JSON, acpd validates it and returns it as \
                                `structured` (a mismatch is an error with category \
                                output-schema).",
            },
            "workspace": {
                "type": "string",
                "enum": ["shared", "worktree"],
                "description": "`worktree`: the subagent works in a git worktree of its own on \
                                branch acpd/<runId>, its changes committed there and listed in \
                                the result's `workspace`; your checkout is untouched. Only for \
                                providers configured with workspace = \"worktree\" (their \
                                default then). `shared`: it edits the cwd itself.",
            },
            "ref": {
                "type": "string",
                "description": "The commit the worktree starts from (branch, tag or sha); \
                                default: the cwd's HEAD.",
            },
            "budget": {
                "type": "object",
                "properties": {
                    "tokens": { "type": "integer", "minimum": 1 },
                    "wall": { "type": "string", "description": "Like \"30m\" or \"90s\"." },
                },
                "additionalProperties": false,
                "description": "What the run may spend, the runs it starts in turn included: \
                                tokens its agent reports, and wall time from its start across \
                                turns. Past it the run is cancelled and ends error with \
                                category budget. At most the provider's budget (more is \
                                refused); default: the provider's.",
            },
            "toolFilter": {
                "type": "object",
                "properties": {
                    "allow": { "type": "array", "items": { "type": "string" } },
                    "deny": { "type": "array", "items": { "type": "string" } },
                },
                "additionalProperties": false,
                "description": "Which of the subagent's tools it may use, by the agent's own \
                                tool names (`Bash`, `Write`; `mcp__SERVER` for all of an MCP \
                                server's): only those in `allow`, never those in `deny`. \
                                Only for providers whose capabilities say toolFilter \
                                (UNSUPPORTED_CAPABILITY otherwise).",
            },
        },
        "required": ["prompt"],
        "additionalProperties": false,
    }))
}

fn run_schema(description: &str) -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": {
            "runId": { "type": "string", "description": description },
        },
        "required": ["runId"],
        "additionalProperties": false,
    }))
}

fn dispose_schema() -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": {
            "runId": { "type": "string", "description": "The run to dispose." },
            "keepBranch": {
                "type": "boolean",
                "description": "For a run in a worktree: keep its branch acpd/<runId> with the \
                                subagent's committed work (default true); false deletes it.",
            },
            "force": {
                "type": "boolean",
                "description": "For a run in a worktree whose work git refused to commit: \
                                remove the worktree and that work all the same (default \
                                false: it stays, and the answer names it as kept).",
            },
        },
        "required": ["runId"],
        "additionalProperties": false,
    }))
}

fn send_schema() -> Arc<JsonObject> {
    object(json!({
        "type": "object",
        "properties": {
            "runId": { "type": "string", "description": "The run to continue (from subagent_start)." },
            "prompt": {
                "type": "string",
                "description": "The follow-up: the subagent remembers its own earlier turns, \
                                nothing else.",
            },
        },
        "required": ["runId", "prompt"],
        "additionalProperties": false,
    }))
}

fn empty_schema() -> Arc<JsonObject> {
    object(json!({ "type": "object", "properties": {}, "additionalProperties": false }))
}

fn annotated(tool: Tool, read_only: bool, title: &str) -> Tool {
    let mut annotations = ToolAnnotations::default();
    annotations.title = Some(title.to_string());
    annotations.read_only_hint = Some(read_only);
    annotations.destructive_hint = Some(false);
    annotations.open_world_hint = Some(!read_only);
    tool.with_annotations(annotations)
}

/// Every tool, described for these providers.
pub(super) fn list(providers: &[ProviderInfo]) -> Vec<Tool> {
    let lines = provider_lines(providers);
    let result_note = "A result whose stopReason is not `completed` (error, aborted, refusal, \
                       max-tokens) comes back as a tool error carrying the stopReason, the \
                       diagnostic and any partial output.";
    vec![
        annotated(
            Tool::new(
                DELEGATE,
                format!(
                    "Hand one self-contained task to a subagent: a separate coding agent \
                     process that acpd starts, runs to the end of its turn and tears down. \
                     Returns its final output (and `structured`, when `outputSchema` was \
                     given). {result_note} Cancelling this call cancels the subagent. For \
                     several tasks in parallel, or a conversation with one subagent, use \
                     subagent_start, subagent_wait and subagent_send.\n{lines}"
                ),
                start_schema(providers),
            ),
            false,
            "Delegate a task to a subagent",
        ),
        annotated(
            Tool::new(
                START,
                format!(
                    "Start a subagent on a task and return at once with its runId (the \
                     subagent works in the background). Start several to work in parallel, \
                     then collect each with subagent_wait; continue one with subagent_send; \
                     dispose each when done. Its agent stays up a while after a turn for \
                     follow-ups.\n{lines}"
                ),
                start_schema(providers),
            ),
            false,
            "Start a subagent",
        ),
        annotated(
            Tool::new(
                WAIT,
                format!(
                    "Wait for the current turn of a run to finish and return its output. \
                     {result_note} Cancelling this call cancels the run's turn."
                ),
                run_schema("The run (from subagent_start)."),
            ),
            true,
            "Wait for a subagent",
        ),
        annotated(
            Tool::new(
                SEND,
                "Give a run whose turn has finished a follow-up prompt; returns the new turn's \
                 number at once. Collect its output with subagent_wait. The run's agent must \
                 still be alive (RUN_ENDED otherwise).",
                send_schema(),
            ),
            false,
            "Continue a subagent",
        ),
        annotated(
            Tool::new(
                CANCEL,
                "Cancel a run's current turn (its subagent_wait then returns stopReason \
                 aborted). The run stays, for a follow-up or dispose.",
                run_schema("The run to cancel."),
            ),
            false,
            "Cancel a subagent's turn",
        ),
        annotated(
            Tool::new(
                DISPOSE,
                "End a run for good: its agent and every process it started are stopped, and \
                 the run is forgotten. Dispose runs you no longer need; they count toward the \
                 limits. A run's worktree is removed; its branch stays unless keepBranch is \
                 false. A worktree whose work could not be committed stays unless force is \
                 true; the answer names it as kept.",
                dispose_schema(),
            ),
            false,
            "Dispose a subagent",
        ),
        annotated(
            Tool::new(
                LIST,
                "List this session's runs that are not disposed: runId, provider, label, \
                 state (running or settled) and turn.",
                empty_schema(),
            ),
            true,
            "List subagents",
        ),
        annotated(
            Tool::new(
                PROVIDERS,
                format!(
                    "List the providers (agents) that can run subagents, with what each is for \
                     and what it can enforce.\n{lines}"
                ),
                empty_schema(),
            ),
            true,
            "List subagent providers",
        ),
    ]
}

/// A structured success: `value` as `structuredContent` and as JSON text.
pub(super) fn ok_json(value: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
    result.structured_content = Some(value);
    result
}

/// A failure as a tool error the model can read and act on.
pub(super) fn failed(failure: &Failure, providers: &[String]) -> CallToolResult {
    let text = format!("{failure}\n{}", failure.hint(providers));
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = Some(failure.to_json(providers));
    result
}

/// A turn's result: its output as content, the whole result as `structuredContent`; a tool
/// error unless it completed.
pub(super) fn turn_result(result: &SubagentResult) -> CallToolResult {
    let mut content = Vec::new();
    let completed = result.stop_reason == StopReason::Completed;
    if !completed {
        let mut text = format!(
            "The subagent ({} run {}, turn {}) did not complete: stopReason {}.",
            result.provider, result.run_id, result.turn, result.stop_reason
        );
        if let Some(d) = &result.diagnostic {
            text.push_str(&format!("\n{d}"));
        }
        if result.output.is_empty() {
            text.push_str("\nIt produced no output.");
        } else {
            text.push_str("\nIts partial output follows.");
        }
        content.push(ContentBlock::text(text));
    }
    for block in &result.output {
        content.push(match block {
            AcpBlock::Text(t) => ContentBlock::text(t.text.clone()),
            AcpBlock::Image(i) => ContentBlock::image(i.data.clone(), i.mime_type.clone()),
            other => ContentBlock::text(serde_json::to_string(other).unwrap_or_default()),
        });
    }
    if result.output_truncated {
        content.push(ContentBlock::text(
            "[output truncated at acpd's max_output]".to_string(),
        ));
    }
    if completed && content.is_empty() {
        content.push(ContentBlock::text(String::new()));
    }
    let mut structured = serde_json::to_value(result).unwrap_or_default();
    // The text once more, joined, for clients that read only structured content.
    structured["text"] = Value::String(result.output_text());
    let mut out = if completed {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    };
    out.structured_content = Some(structured);
    out
}
