//! `:delegate`: the echo agent as an agent that delegates over MCP, the way Claude Code or
//! Codex call a tool of a server the client offered in `session/new`. It starts the stdio
//! server named `acpd`, calls its `delegate` tool through the official MCP SDK's client, and
//! streams what came back, so nested delegation can be tested with no model.

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

use super::echo::lock;
use super::turn::Turn;

impl Turn<'_> {
    pub(super) async fn delegate(&self, args: serde_json::Value) {
        let server = lock(&self.agent.sessions)
            .get(self.session_id)
            .and_then(|s| {
                s.mcp_servers
                    .iter()
                    .find(|m| m.get("name").and_then(|n| n.as_str()) == Some("acpd"))
                    .cloned()
            });
        // Not offered: an agent that finds acpd's socket by itself (`ACPD_SOCKET` in its
        // environment) and tries anyway, hiding its depth, as a child escaping its depth
        // limit would.
        let server = server.or_else(|| {
            let socket = std::env::var("ACPD_SOCKET").ok()?;
            let exe = std::env::current_exe().ok()?;
            Some(json!({
                "name": "acpd",
                "command": exe,
                "args": ["mcp", "--socket", socket],
                "hideDepth": true,
            }))
        });
        let Some(server) = server else {
            self.text("delegate failed: no MCP server named acpd was offered\n")
                .await;
            return;
        };
        let outcome = tokio::select! {
            outcome = call(&server, args) => outcome,
            // Dropping the call kills the server it started (kill_on_drop).
            () = self.cancel.cancelled() => Err("the turn was cancelled".to_string()),
        };
        match outcome {
            Ok(text) => self.text(&format!("delegated: {text}\n")).await,
            Err(why) => self.text(&format!("delegate failed: {why}\n")).await,
        }
    }
}

/// Starts the stdio MCP server `server` describes (ACP's `McpServerStdio`), calls `delegate`
/// with `args`, and returns the text of its result (`Err` with it for a tool error).
async fn call(server: &serde_json::Value, args: serde_json::Value) -> Result<String, String> {
    let command = server
        .get("command")
        .and_then(|c| c.as_str())
        .ok_or("the acpd MCP server has no command")?;
    let mut cmd = tokio::process::Command::new(command);
    for arg in server
        .get("args")
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten()
    {
        cmd.arg(arg.as_str().unwrap_or_default());
    }
    for var in server
        .get("env")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
    {
        if let (Some(name), Some(value)) = (
            var.get("name").and_then(|n| n.as_str()),
            var.get("value").and_then(|v| v.as_str()),
        ) {
            cmd.env(name, value);
        }
    }
    if server.get("hideDepth").is_some() {
        cmd.env_remove(acpd_protocol::subagent::DEPTH_VAR)
            .env_remove(acpd_protocol::subagent::MAX_DEPTH_VAR);
    }
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {command}: {e}"))?;
    let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err("the MCP server's pipes were not made".into());
    };
    let client =
        ().serve((stdout, stdin))
            .await
            .map_err(|e| format!("MCP initialize failed: {e}"))?;
    let params = CallToolRequestParams::new("delegate")
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let result = client
        .call_tool(params)
        .await
        .map_err(|e| format!("tools/call failed: {e}"));
    let _ = client.cancel().await;
    let _ = child.wait().await;
    let result = result?;
    let text: Vec<String> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    let text = text.join(" ").trim().replace('\n', " ");
    if result.is_error == Some(true) {
        Err(text)
    } else {
        Ok(text)
    }
}
