//! `acpd reload`: asks the running daemon to re-read its config and says whether it took, so
//! `systemctl reload acpd` (its `ExecReload=`) fails visibly on a bad file.
//!
//! Exit codes: 0 the new config is in force; 2 the daemon rejected the file and keeps the old
//! one (the error, with file, line and key, is on stderr and in the daemon's log), or a usage
//! error; 1 no daemon answered, or it refused (only acpd's own user may reload, and not from
//! inside one of its children's process trees).

use std::path::Path;
use std::time::Duration;

use acpd_protocol::errors::ErrorName;
use acpd_protocol::methods::{ReloadReply, name};
use serde_json::json;

use super::client::{Client, ClientError};
use super::daemon::SocketArg;
use super::{EXIT_USAGE, stdout_failed};
use crate::runtime;

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    pub json: bool,
    /// The default is below systemd's reload timeout, so the journal gets acpd's message.
    #[command(flatten)]
    pub timeout: super::client::TimeoutArg,
}

pub(super) async fn reload(args: ReloadArgs) -> u8 {
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
    let reply = match ask(&path, args.timeout.timeout).await {
        Ok(reply) => reply,
        Err(Refused::Rejected(message)) => {
            errln!("acpd: {message}");
            return EXIT_USAGE;
        }
        Err(Refused::Other(message)) => {
            errln!("acpd: {message}");
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

async fn ask(path: &Path, within: Duration) -> Result<ReloadReply, Refused> {
    let failed = |e: ClientError, asked: bool| match e {
        ClientError::Rpc { error, .. } if error.code == ErrorName::ConfigRejected.code() => {
            Refused::Rejected(error.message)
        }
        ClientError::Rpc { error, .. } => {
            Refused::Other(format!("the daemon refused to reload: {}", error.message))
        }
        // A read of the config that blocks (a FIFO, a hung mount) is the likely stall.
        e @ ClientError::Silent { .. } if asked => Refused::Other(format!(
            "{e}; nothing may have been reloaded (is its config file readable? a FIFO or a hung \
             mount blocks the read)"
        )),
        e => Refused::Other(format!("{e}; nothing was reloaded")),
    };
    let mut client = Client::open(path, within)
        .await
        .map_err(|e| failed(e, false))?;
    let raw = client
        .call(name::RELOAD, &json!({}))
        .await
        .map_err(|e| failed(e, true))?;
    client.close();
    serde_json::from_str(raw.get())
        .map_err(|e| Refused::Other(format!("the daemon's answer is not a reload reply: {e}")))
}
