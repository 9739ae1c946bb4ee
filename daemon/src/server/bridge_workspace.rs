//! What a bridge session asks of acpd about its workspace (`_meta.acpd.workspace` and
//! `ref` in `session/new` or `session/load`), and the `_meta.acpd.workspace` an answer gains
//! when the session has a worktree (see `registry/bridge_child.rs` for how it is made).

use acpd_protocol::envelope::RpcError;
use acpd_protocol::subagent::WorkspaceKind;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::live_sessions::SessionWorkspace;
use super::raw;
use crate::registry::WorkspaceAsk;

/// What an editor asks of acpd itself in a session's `_meta.acpd` besides the provider: a
/// worktree (`workspace`, `ref`).
#[derive(Deserialize, Default)]
pub(super) struct WorkspaceMeta {
    #[serde(default)]
    workspace: Option<WorkspaceKind>,
    #[serde(default, rename = "ref")]
    base_ref: Option<String>,
}

impl WorkspaceMeta {
    /// Read from a request's params; a bad value is the editor's to fix.
    pub(super) fn of(params: Option<&RawValue>) -> Result<WorkspaceMeta, RpcError> {
        let value: Option<serde_json::Value> =
            params.and_then(|p| serde_json::from_str(p.get()).ok());
        let Some(acpd) = value.as_ref().and_then(|v| v.pointer("/_meta/acpd")) else {
            return Ok(WorkspaceMeta::default());
        };
        let pick = |key: &str| acpd.get(key).cloned().unwrap_or(serde_json::Value::Null);
        let meta = json!({"workspace": pick("workspace"), "ref": pick("ref")});
        serde_json::from_value(meta).map_err(|e| {
            RpcError::invalid_params(format!(
                "_meta.acpd: {e} (workspace is \"shared\" or \"worktree\", ref a string)"
            ))
        })
    }

    pub(super) fn ask<'a>(&'a self, name: &'a str, resume: bool) -> WorkspaceAsk<'a> {
        WorkspaceAsk {
            kind: self.workspace,
            base_ref: self.base_ref.as_deref(),
            name,
            resume,
        }
    }
}

/// An answer to the editor with `_meta.acpd.workspace` (`{branch, path, base}`) added beside
/// whatever `_meta` the agent gave it.
pub(super) fn with_workspace(reply: &RawValue, w: &SessionWorkspace) -> Box<RawValue> {
    let mut value: serde_json::Value =
        serde_json::from_str(reply.get()).unwrap_or_else(|_| json!({}));
    let Some(obj) = value.as_object_mut() else {
        return reply.to_owned();
    };
    let meta = obj.entry("_meta").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    let acpd = &mut meta["acpd"];
    if !acpd.is_object() {
        *acpd = json!({});
    }
    acpd["workspace"] = w.meta();
    raw(&value)
}
