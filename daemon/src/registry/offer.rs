//! Offering acpd to a child (`offer_delegation`): its session gets the MCP server `acpd`,
//! an `acpd mcp` that connects back to this acpd's socket, so the child can delegate in turn
//! (placed by [`super::lineage`]), as long as a run it started would not be refused for its
//! depth.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::Registry;
use crate::config::ProviderConfig;

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
        // This very binary for as long as acpd (the agent's ancestor) lives, even after an
        // upgrade replaced the file it was started from.
        let exe = format!("/proc/{}/exe", std::process::id());
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
