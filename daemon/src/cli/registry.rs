//! `acpd registry list [--json]`: what the configured ACP Registry offers, and how this
//! machine would run each agent.

use std::path::Path;

use super::output::Col;
use super::{config_or_usage, stdout_failed};
use crate::catalog::{self, Agent, Origin};

/// The ACP Registry's subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RegistryCommand {
    /// List the agents of the registry document at `registry_url` (cached for 24 h; the
    /// cache is used when the registry cannot be reached).
    #[command(after_help = super::help::REGISTRY_LIST)]
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        config: super::ConfigArg,
    },
}

pub(super) async fn registry(config: Option<&Path>, command: RegistryCommand) -> u8 {
    let RegistryCommand::List { json, .. } = command;
    let config = match config_or_usage(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let url = config.registry_url.clone();
    let state = crate::supervise::default_state_dir();
    let loaded = tokio::task::spawn_blocking(move || catalog::load(&url, state.as_deref())).await;
    let loaded = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            errln!("acpd: {e}");
            return 1;
        }
        Err(e) => {
            errln!("acpd: {e}");
            return 1;
        }
    };
    let platform = catalog::platform();
    let printed = if json {
        let agents: Vec<serde_json::Value> = loaded
            .document
            .agents
            .iter()
            .map(|a| {
                let mut v = serde_json::to_value(a).unwrap_or_default();
                v["runsAs"] = serde_json::json!(runs_as(a, &platform));
                v
            })
            .collect();
        outln!(
            "{}",
            serde_json::json!({
                "url": catalog::shown(&config.registry_url),
                "origin": loaded.origin,
                "version": loaded.document.version,
                "platform": platform,
                "agents": agents,
                "skipped": loaded.document.skipped,
            })
        )
    } else {
        let print = || -> std::io::Result<()> {
            let origin = match loaded.origin {
                Origin::Fetched => "fetched now",
                Origin::Cache => "cached",
                Origin::StaleCache => "cached, the registry is unreachable",
                Origin::File => "local file",
            };
            // The document's free text (and the id of an entry it skips) is whatever the
            // registry wrote: escaped, so no escape sequence of its reaches the terminal.
            let shown = crate::trace::escape_controls;
            outln!(
                "# {} ({origin}); config: registry = \"ID\"",
                shown(&catalog::shown(&config.registry_url))
            )?;
            let mut grid = super::output::Grid::new(&[
                ("ID", Col::Whole),
                ("VERSION", Col::Whole),
                ("RUNS AS", Col::Whole),
                ("NAME", Col::Text(24)),
                ("DESCRIPTION", Col::Text(60)),
            ]);
            for a in &loaded.document.agents {
                grid.row([
                    a.id.as_str(),
                    a.version.as_str(),
                    runs_as(a, &platform).unwrap_or("-"),
                    a.name.as_str(),
                    a.description.as_str(),
                ]);
            }
            grid.print()?;
            if !loaded.document.skipped.is_empty() {
                outln!(
                    "# skipped (not in the registry format): {}",
                    shown(&loaded.document.skipped.join(", "))
                )?;
            }
            Ok(())
        };
        print()
    };
    match printed {
        Ok(()) => 0,
        Err(e) => stdout_failed(&e),
    }
}

/// The distribution a start would use here (`binary`, `npx`, `uvx`), or none.
fn runs_as(agent: &Agent, platform: &str) -> Option<&'static str> {
    agent.choose(platform, catalog::on_path).map(|c| c.kind())
}
