//! `acpd mcp`: the subagent registry as MCP tools over stdio, so any agent that takes MCP
//! servers (Claude Code, Codex, Gemini CLI, goose, …) can hand work to an isolated child
//! agent. Built on the official Rust MCP SDK (`rmcp`).
//!
//! The runs live in a running daemon when one answers on its socket (`--socket`,
//! `$ACPD_SOCKET`, else the default path, as `acpd connect` finds it): they show in
//! `acpd status` and count in its limits, and the daemon disposes them when this process's
//! connection closes. Otherwise (or with `--in-process`) they live in a registry of this
//! process, disposed and reaped when the MCP client disconnects or on SIGTERM, SIGINT or
//! SIGHUP.

mod backend;
mod mcp_error;
mod server;
mod tools;
mod transport;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use rmcp::ServiceExt;
use tokio::signal::unix::SignalKind;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use backend::{Backend, Daemon, Local};

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The daemon's socket (default: $XDG_RUNTIME_DIR/acpd/acpd.sock). With no daemon
    /// answering there, runs live in this process.
    #[arg(long, value_name = "PATH", env = "ACPD_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Never use a daemon: runs live in this process.
    #[arg(long)]
    pub in_process: bool,
}

/// Serves MCP on stdin/stdout until the client disconnects or a signal asks to stop; every
/// run is disposed first. 0, `local_config`'s code when runs would live in this process and it
/// fails (it loads the config and sets up containment, and says what failed on stderr), 1
/// when serving failed.
pub(crate) async fn run(args: McpArgs, local_config: impl FnOnce() -> Result<Config, u8>) -> u8 {
    let shutdown = match crate::runtime::Shutdown::on_signals(&[
        SignalKind::terminate(),
        SignalKind::interrupt(),
        SignalKind::hangup(),
    ]) {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "acpd: cannot set up signal handling: {e}"
            );
            return 1;
        }
    };
    let backend = match choose(&args, local_config).await {
        Ok(b) => Arc::new(b),
        Err(code) => return code,
    };
    tracing::info!("acpd mcp: runs live in {}", backend.describe());
    let code = serve(backend.clone(), &shutdown).await;
    let bound = backend.close_bound();
    let close = backend.close();
    tokio::pin!(close);
    tokio::select! {
        () = &mut close => {}
        () = shutdown.urgent() => kill_all("second shutdown request", &mut close).await,
        () = tokio::time::sleep(bound) => kill_all("teardown is taking too long", &mut close).await,
    }
    if matches!(*backend, Backend::Local(_)) {
        crate::supervise::forget_records();
    }
    code
}

async fn kill_all(why: &str, close: &mut (impl std::future::Future<Output = ()> + Unpin)) {
    tracing::warn!("{why}: killing every child now");
    crate::supervise::kill_all();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), close).await;
}

/// The daemon, when one answers; else a registry of this process.
async fn choose(
    args: &McpArgs,
    local_config: impl FnOnce() -> Result<Config, u8>,
) -> Result<Backend, u8> {
    if !args.in_process {
        let path = match &args.socket {
            Some(p) => Some(p.clone()),
            None => crate::runtime::default_socket_path().ok(),
        };
        if let Some(path) = path {
            match Daemon::connect(&path).await {
                Ok(d) => return Ok(Backend::Daemon(d)),
                Err(e) if args.socket.is_some() => tracing::warn!(
                    "no acpd daemon answers at {} ({e}); runs live in this process",
                    path.display()
                ),
                Err(e) => tracing::debug!("no daemon at {} ({e})", path.display()),
            }
        }
    }
    let config = local_config()?;
    crate::supervise::init();
    crate::supervise::keep_records();
    Ok(Backend::Local(Local::new(config)))
}

async fn serve(backend: Arc<Backend>, shutdown: &crate::runtime::Shutdown) -> u8 {
    let (reader, writer) = crate::runtime::stdio();
    let stop = CancellationToken::new();
    let serving = server::AcpdMcp::new(backend)
        .serve_with_ct(transport::Screening::new(reader, writer), stop.clone());
    let service = tokio::select! {
        served = serving => match served {
            Ok(s) => s,
            Err(e) => {
                // The client went away, or never spoke MCP: nothing was started.
                tracing::info!("MCP initialization did not complete: {e}");
                return 0;
            }
        },
        () = shutdown.requested() => return 0,
    };
    let waiting = service.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        ended = &mut waiting => {
            if let Err(e) = ended {
                tracing::warn!("the MCP service ended abnormally: {e}");
            }
            return 0;
        }
        () = shutdown.requested() => {}
    }
    tracing::info!("shutting down: disposing every run");
    stop.cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), waiting).await;
    0
}
