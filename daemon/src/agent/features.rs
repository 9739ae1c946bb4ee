//! Turn steps for the ACP v1 additions acpd bridges: prompt content blocks, auth, `_`
//! extensions and subagent sessions. Each reports what it saw as plain text, so a test through
//! acpd can check what reached the agent and what came back.

use std::sync::atomic::Ordering;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::echo::lock;
use super::turn::{Turn, TurnEnd, stop, text_update};
use crate::wire::CallError;

/// What `:blocks` names a block by: its uri, its resource's uri, or its mime type.
fn block_line(block: &serde_json::Value) -> String {
    let kind = block["type"].as_str().unwrap_or("-");
    let what = block["uri"]
        .as_str()
        .or_else(|| block.pointer("/resource/uri").and_then(|u| u.as_str()))
        .or_else(|| block["mimeType"].as_str())
        .unwrap_or("-");
    format!("block {kind} {what}\n")
}

impl Turn<'_> {
    pub(super) async fn blocks(&self) {
        let blocks = self
            .prompt
            .iter()
            .filter(|b| b.get("type").and_then(|t| t.as_str()) != Some("text"));
        for block in blocks {
            self.text(&block_line(block)).await;
        }
    }

    pub(super) async fn auth(&self) {
        let line = match lock(&self.agent.authenticated).as_deref() {
            Some(id) => format!("auth {id}\n"),
            None => "auth none\n".to_string(),
        };
        self.text(&line).await
    }

    pub(super) async fn ext(&self) {
        let seen = lock(&self.agent.ext_seen).clone();
        for method in seen {
            self.text(&format!("ext {method}\n")).await;
        }
    }

    pub(super) async fn ext_request(&self, method: &str) {
        let params = json!({ "sessionId": self.session_id });
        let line = match self.agent.peer.request(method, &params).await {
            Ok(result) => format!("ext-reply {}\n", result.get()),
            Err(CallError::Rpc(e)) => format!("ext-error {}\n", e.code),
            Err(CallError::Closed) => "ext-error closed\n".to_string(),
        };
        self.text(&line).await
    }

    /// `:request` and `:cancel-request`: streams "reply <JSON>" or "error <CODE>".
    pub(super) async fn request(&self, method: &str, params: &str, cancel: bool) {
        let mut params: serde_json::Value = serde_json::from_str(params).unwrap_or_default();
        if let Some(object) = params.as_object_mut() {
            object
                .entry("sessionId")
                .or_insert_with(|| json!(self.session_id));
        }
        let answer = match self.agent.peer.call(method, &params).await {
            Ok(call) => {
                if cancel {
                    let cancel = json!({ "requestId": call.id });
                    let _ = self.agent.peer.notify("$/cancel_request", &cancel).await;
                }
                call.result().await
            }
            Err(e) => Err(e),
        };
        let line = match answer {
            Ok(result) => format!("reply {}\n", result.get()),
            Err(CallError::Rpc(e)) => format!("error {}\n", e.code),
            Err(CallError::Closed) => "error closed\n".to_string(),
        };
        self.text(&line).await
    }

    /// `:notify-json`: the params exactly as written.
    pub(super) async fn notify_json(&self, method: &str, params: &str) {
        let params: serde_json::Value = serde_json::from_str(params).unwrap_or_default();
        let _ = self.agent.peer.notify(method, &params).await;
    }

    /// `:client-caps`: "client-caps <JSON>" as `initialize` had them.
    pub(super) async fn client_caps(&self) {
        let caps = lock(&self.agent.client_caps).clone();
        self.text(&format!("client-caps {caps}\n")).await
    }

    /// `:session-meta`: "session-meta <JSON>", the `_meta` of this session's `session/new`.
    pub(super) async fn session_meta(&self) {
        let meta = lock(&self.agent.sessions)
            .get(self.session_id)
            .map_or(serde_json::Value::Null, |s| s.meta.clone());
        self.text(&format!("session-meta {meta}\n")).await
    }

    /// `:prompt-meta`: "prompt-meta <JSON>", the `_meta` of this turn's `session/prompt`.
    pub(super) async fn prompt_meta(&self) {
        let meta = lock(&self.agent.sessions)
            .get(self.session_id)
            .map_or(serde_json::Value::Null, |s| s.prompt_meta());
        self.text(&format!("prompt-meta {meta}\n")).await
    }

    /// `:tool-call NAME [STATUS]`: the tool call is reported (ids `echo-tool-N`, counted per
    /// process), never run; then "tool-call NAME STATUS" is streamed.
    pub(super) async fn tool_call(&self, name: &str, status: &str) {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        self.update(serde_json::json!({
            "sessionUpdate": "tool_call",
            "toolCallId": format!("echo-tool-{n}"),
            "title": name,
            "kind": "other",
            "status": status,
            "_meta": {"claudeCode": {"toolName": name}},
        }))
        .await;
        self.text(&format!("tool-call {name} {status}\n")).await
    }

    /// `:subagent` and `:subagent-hang`. `Some` ends the turn (a hang cancelled either way).
    pub(super) async fn subagent(&self, text: &str, hang: bool) -> Option<TurnEnd> {
        if !self.agent.args.subagents {
            self.text("subagent: agent started without --subagents\n")
                .await;
            return None;
        }
        if !self.agent.client_subagents.load(Ordering::Acquire) {
            self.text("subagent: client did not opt in\n").await;
            return None;
        }
        let sub_id = format!("echo-sub-{}", uuid::Uuid::new_v4());
        // Registered before the announcement, so a cancel sent as soon as the client sees the
        // subagent is never missed.
        let sub_cancel = CancellationToken::new();
        if hang {
            lock(&self.agent.subagents).insert(sub_id.clone(), sub_cancel.clone());
        }
        let end = self.run_subagent(&sub_id, text, hang, &sub_cancel).await;
        if hang {
            lock(&self.agent.subagents).remove(&sub_id);
        }
        end
    }

    async fn run_subagent(
        &self,
        sub_id: &str,
        text: &str,
        hang: bool,
        sub_cancel: &CancellationToken,
    ) -> Option<TurnEnd> {
        self.update(json!({
            "sessionUpdate": "subagent_update",
            "sessionId": sub_id,
            "title": "echo sub",
            "capabilities": {"cancel": {}},
        }))
        .await;
        let params = json!({"sessionId": sub_id, "update": text_update(&format!("{text}\n"))});
        let _ = self.agent.peer.notify("session/update", &params).await;
        if !hang {
            self.text(&format!("subagent {sub_id} done\n")).await;
            return None;
        }
        tokio::select! {
            _ = sub_cancel.cancelled() => {
                self.text("subagent cancelled\n").await;
                Some(stop("end_turn"))
            }
            _ = self.cancel.cancelled() => Some(stop("cancelled")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_named_by_uri_resource_uri_or_mime_type() {
        let line = |v: serde_json::Value| block_line(&v);
        assert_eq!(
            line(json!({"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs"})),
            "block resource_link file:///a.rs\n"
        );
        assert_eq!(
            line(json!({"type": "resource", "resource": {"uri": "file:///b", "text": "x"}})),
            "block resource file:///b\n"
        );
        assert_eq!(
            line(json!({"type": "image", "mimeType": "image/png", "data": "AA=="})),
            "block image image/png\n"
        );
        assert_eq!(line(json!({"type": "audio"})), "block audio -\n");
    }
}
