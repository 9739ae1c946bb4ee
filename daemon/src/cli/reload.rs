//! `acpd reload`: asks the running daemon to re-read its config and says whether it took, so
//! `systemctl reload acpd` (its `ExecReload=`) fails visibly on a bad file.
//!
//! Exit codes: 0 the new config is in force; 2 the daemon rejected the file and keeps the old
//! one (the error, with file, line and key, is on stderr and in the daemon's log), or a usage
//! error; 1 no daemon answered, or it refused (only acpd's own user may reload, and not from
//! inside one of its children's process trees).

use std::path::PathBuf;
use std::time::Duration;

use acpd_protocol::errors::ErrorName;
use acpd_protocol::methods::{ReloadReply, name};
use serde_json::json;

use super::daemon::SocketArg;
use super::{EXIT_USAGE, stdout_failed};
use crate::runtime;
use crate::wire::{self, CallError};

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    pub json: bool,
    /// Give up (exit 1) when the daemon has not answered within this many seconds. The
    /// default is below systemd's reload timeout, so the journal gets acpd's message.
    #[arg(long, value_name = "SECS", default_value_t = 20)]
    pub timeout: u64,
}

pub async fn reload(args: ReloadArgs) -> u8 {
    let path = match &args.socket.socket {
        Some(p) => p.clone(),
        None => match runtime::default_socket_path() {
            Ok(p) => p,
            Err(e) => {
                errln!("acpd: {e}");
                return EXIT_USAGE;
            }
        },
    };
    let within = Duration::from_secs(args.timeout);
    let asked = tokio::time::timeout(within, ask(&path)).await;
    let reply = match asked {
        Ok(Ok(reply)) => reply,
        Ok(Err(Refused::Rejected(message))) => {
            errln!("acpd: {message}");
            return EXIT_USAGE;
        }
        Ok(Err(Refused::Other(message))) => {
            errln!("acpd: {message}");
            return 1;
        }
        Err(_) => {
            errln!(
                "acpd: the daemon at {} did not answer within {}s (is its config file readable? \
                 a FIFO or a hung mount blocks the read)",
                path.display(),
                args.timeout
            );
            return 1;
        }
    };
    let printed = if args.json {
        outln!("{}", json!(reply))
    } else {
        outln!(
            "acpd reloaded {}: providers {} (default {})",
            reply.source.as_deref().unwrap_or("the built-in defaults"),
            reply.providers.join(", "),
            reply.default_provider
        )
    };
    match printed {
        Ok(()) => 0,
        Err(e) => stdout_failed(&e),
    }
}

enum Refused {
    /// The daemon read the file and rejected it.
    Rejected(String),
    /// Anything else: no daemon, not permitted, a daemon too old to know the method.
    Other(String),
}

async fn ask(path: &PathBuf) -> Result<ReloadReply, Refused> {
    let stream = tokio::net::UnixStream::connect(path).await.map_err(|e| {
        Refused::Other(format!(
            "no acpd daemon at {} ({e}); nothing was reloaded",
            path.display()
        ))
    })?;
    let (reader, writer) = stream.into_split();
    let conn = wire::connect(reader, writer, acpd_protocol::codec::DEFAULT_MAX_LINE);
    let failed = |e: CallError| match e {
        CallError::Rpc(e) if e.code == ErrorName::ConfigRejected.code() => {
            Refused::Rejected(e.message)
        }
        CallError::Rpc(e) => Refused::Other(format!("the daemon refused to reload: {}", e.message)),
        CallError::Closed => Refused::Other(format!(
            "the daemon at {} closed the connection (is this user allowed to connect?)",
            path.display()
        )),
    };
    // A query asks acpd, not the agent: no probe of the default provider.
    let init = json!({ "protocolVersion": 1, "clientCapabilities": {},
        "_meta": { "acpd": { "query": true } } });
    conn.peer
        .request("initialize", &init)
        .await
        .map_err(failed)?;
    let raw = conn
        .peer
        .request(name::RELOAD, &json!({}))
        .await
        .map_err(failed)?;
    conn.peer.close();
    serde_json::from_str(raw.get())
        .map_err(|e| Refused::Other(format!("the daemon's answer is not a reload reply: {e}")))
}
