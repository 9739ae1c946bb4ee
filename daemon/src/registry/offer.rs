//! Offering acpd to a child (`offer_delegation`): its session gets the MCP server `acpd`,
//! an `acpd mcp` that connects back to this acpd's socket, so the child can delegate in turn
//! (placed by [`super::lineage`]), as long as a run it started would not be refused for its
//! depth.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::Registry;
use crate::config::{ProviderConfig, SandboxMode};
use crate::supervise::landlock_abi;

/// The MCP server entry's name, as agents show it (`mcp__acpd__delegate` in Claude Code).
pub(super) const SERVER_NAME: &str = "acpd";

impl Registry {
    /// Where the `acpd mcp` offered to children connects: this acpd's socket.
    pub fn offer_socket(&self, path: &Path) {
        *self
            .inner
            .offer_socket
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(path.to_path_buf());
    }

    /// The `mcpServers` entry offering acpd to a child of `provider` at `depth` under the limit
    /// `max_depth`, when the provider offers delegation, runs on this host, this acpd has a
    /// socket to offer, and a run started by that child would not be refused for its depth.
    pub fn offered_server(
        &self,
        provider: &ProviderConfig,
        depth: u32,
        max_depth: u32,
    ) -> Option<serde_json::Value> {
        // A far agent could reach neither this binary nor this socket.
        if !provider.offer_delegation || provider.remote.is_some() || depth >= max_depth {
            return None;
        }
        let socket: PathBuf = self
            .inner
            .offer_socket
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let socket = socket.to_str()?.to_string();
        let exe = offered_command(provider)?;
        Some(json!({
            "name": SERVER_NAME,
            "command": exe,
            "args": ["mcp", "--socket", socket],
            "env": [],
        }))
    }

    /// `mcpServers` with acpd's own entry added when it is offered (an entry the parent
    /// already named `acpd` is left alone).
    pub fn offer_in(&self, params: &mut serde_json::Value, provider: &ProviderConfig, depth: u32) {
        let Some(entry) = self.offered_server(provider, depth, self.max_depth(None)) else {
            return;
        };
        let Some(obj) = params.as_object_mut() else {
            return;
        };
        let servers = obj.entry("mcpServers").or_insert_with(|| json!([]));
        if let Some(list) = servers.as_array_mut()
            && !list
                .iter()
                .any(|s| s.get("name").and_then(|n| n.as_str()) == Some(SERVER_NAME))
        {
            list.push(entry);
        }
    }
}

/// The program the child is told to start as `acpd mcp`.
///
/// Unsandboxed: `/proc/<acpd>/exe`, this very binary for as long as acpd (the agent's
/// ancestor) lives, even after an upgrade replaced the file it was started from. A sandboxed
/// child cannot start that: Landlock forbids following another domain's `/proc/<pid>/exe`
/// (a ptrace-class access), so it gets the path acpd's binary was started from, checked to be
/// a file it may read and execute. When an upgrade replaced that file, the child starts the
/// new acpd's `acpd mcp`, which speaks the same `_acpd/*` methods over the socket; when the
/// file is gone or lies where the sandbox denies, nothing is offered (and that is logged),
/// since an entry the child cannot start would only fail its agent's first tool call.
fn offered_command(provider: &ProviderConfig) -> Option<String> {
    let sandboxed = provider.sandbox != SandboxMode::None && landlock_abi() > 0;
    if !sandboxed {
        return Some(format!("/proc/{}/exe", std::process::id()));
    }
    let started = std::fs::read_link("/proc/self/exe").ok()?;
    // The kernel names a replaced or removed binary "<path> (deleted)".
    let started = started.to_str()?;
    let path = Path::new(started.strip_suffix(" (deleted)").unwrap_or(started));
    match super::sandbox_plan::runnable_in_sandbox(path) {
        Ok(real) => real.to_str().map(str::to_string),
        Err(why) => {
            tracing::warn!(
                provider = %provider.name,
                "acpd is not offered to this sandboxed provider's children: its binary cannot \
                 be started inside the sandbox ({why})"
            );
            None
        }
    }
}
