//! The command line's side of the daemon's socket (`status`, `runs`, `reload`, and `connect`'s
//! connect step): every step runs under one deadline (`--timeout`), so a daemon that is
//! stopped (SIGSTOP), wedged, or a socket that answers something that is not JSON-RPC ends the
//! command with a clear error instead of hanging it forever.

use std::path::{Path, PathBuf};
use std::time::Duration;

use acpd_protocol::envelope::RpcError;
use serde_json::value::RawValue;
use tokio::net::UnixStream;
use tokio::time::Instant;

use crate::wire::{self, CallError, Incoming};

/// How often a connect refused for a full backlog is retried before the deadline.
const BACKLOG_RETRY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, clap::Args)]
pub struct TimeoutArg {
    /// Give up (exit 1) when the daemon has not answered within this long: `10s`, `1m`,
    /// `500ms`, or a bare number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_timeout)]
    pub timeout: Duration,
}

/// `--timeout`: [`crate::durations::parse_flag`], above zero.
pub(super) fn parse_timeout(text: &str) -> Result<Duration, String> {
    let within = crate::durations::parse_flag(text)?;
    if within.is_zero() {
        return Err("the timeout must be above zero".into());
    }
    Ok(within)
}

/// Why a question to the daemon got no usable answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum ClientError {
    #[error(
        "no acpd daemon at {} ({source}); start one with `acpd serve` or `systemctl --user start \
         acpd.socket`, or pass the right --socket",
        path.display()
    )]
    NoDaemon {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the daemon at {} did not answer within {} ({why}); {hint}",
        path.display(),
        humantime::format_duration(*within)
    )]
    Silent {
        path: PathBuf,
        within: Duration,
        /// What was still outstanding: the connection, or an answer to a method.
        why: String,
        hint: String,
    },
    #[error(
        "what listens at {} is not an acpd daemon, or is broken: it answered {detail}; check \
         --socket / $ACPD_SOCKET, or restart the daemon",
        path.display()
    )]
    Garbage { path: PathBuf, detail: String },
    #[error(
        "the daemon at {} closed the connection before answering (is this user allowed to \
         connect? see `allow_group`; its log says why)",
        path.display()
    )]
    Closed { path: PathBuf },
    #[error("the daemon at {} answered {method} with an error: {}", path.display(), error.message)]
    Rpc {
        path: PathBuf,
        method: String,
        error: RpcError,
    },
}

/// What to do about a daemon that does not answer: its process is stopped, or busy.
fn hint(peer_pid: Option<i32>) -> String {
    let state = peer_pid.and_then(crate::supervise::procfs::stat);
    match (peer_pid, state) {
        (Some(pid), Some(s)) if matches!(s.state, 'T' | 't') => {
            format!("its process (pid {pid}) is stopped; resume it with `kill -CONT {pid}`")
        }
        (Some(pid), _) if pid > 1 => format!(
            "its process (pid {pid}) is alive but not answering; see its log \
             (`journalctl --user -u acpd`) and restart it if it stays stuck"
        ),
        _ => "see the daemon's log (`journalctl --user -u acpd`) and restart it if it stays stuck"
            .to_string(),
    }
}

/// Connects under `deadline`. A full backlog (EAGAIN: the daemon is not accepting) is retried
/// until the deadline; a stopped daemon is waited for until the deadline, since what it
/// queued would never be read.
pub(super) async fn connect(
    path: &Path,
    within: Duration,
    deadline: Instant,
) -> Result<UnixStream, ClientError> {
    let silent = |why: &str, pid: Option<i32>| ClientError::Silent {
        path: path.to_path_buf(),
        within,
        why: why.to_string(),
        hint: hint(pid),
    };
    let stream = loop {
        match tokio::time::timeout_at(deadline, UnixStream::connect(path)).await {
            Err(_) => return Err(silent("the connection was never accepted", None)),
            Ok(Ok(stream)) => break stream,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() + BACKLOG_RETRY >= deadline {
                    return Err(silent(
                        "its backlog stayed full: it is not accepting connections",
                        None,
                    ));
                }
                tokio::time::sleep(BACKLOG_RETRY).await;
            }
            Ok(Err(source)) => {
                return Err(ClientError::NoDaemon {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    };
    // The listener's pid (the process that bound the socket; pid 1 under socket activation).
    let pid = stream.peer_cred().ok().and_then(|c| c.pid());
    if let Some(pid) = pid.filter(|&p| p > 1) {
        while crate::supervise::procfs::stat(pid).is_some_and(|s| matches!(s.state, 'T' | 't')) {
            if Instant::now() + BACKLOG_RETRY >= deadline {
                return Err(silent("it is stopped", Some(pid)));
            }
            tokio::time::sleep(BACKLOG_RETRY).await;
        }
    }
    Ok(stream)
}

/// One connection to the daemon as an ACP client, every call under the same deadline.
pub(super) struct Client {
    path: PathBuf,
    within: Duration,
    deadline: Instant,
    peer_pid: Option<i32>,
    conn: wire::Connection,
}

impl Client {
    /// Connects and sends `initialize` as a query (acpd answers it itself, probing no agent).
    pub(super) async fn open(path: &Path, within: Duration) -> Result<Client, ClientError> {
        let deadline = Instant::now() + within;
        let stream = connect(path, within, deadline).await?;
        let peer_pid = stream.peer_cred().ok().and_then(|c| c.pid());
        let (reader, writer) = stream.into_split();
        let conn = wire::connect(reader, writer, acpd_protocol::codec::DEFAULT_MAX_LINE);
        let mut client = Client {
            path: path.to_path_buf(),
            within,
            deadline,
            peer_pid,
            conn,
        };
        let init = serde_json::json!({ "protocolVersion": 1, "clientCapabilities": {},
            "_meta": { "acpd": { "query": true } } });
        client.call("initialize", &init).await?;
        Ok(client)
    }

    /// One request; any line from the daemon that is not JSON-RPC fails it at once.
    pub(super) async fn call(
        &mut self,
        method: &str,
        params: &serde_json::Value,
    ) -> Result<Box<RawValue>, ClientError> {
        let request = self.conn.peer.request(method, params);
        tokio::pin!(request);
        let mut open = true;
        loop {
            tokio::select! {
                answer = &mut request => return answer.map_err(|e| match e {
                    CallError::Rpc(error) => ClientError::Rpc {
                        path: self.path.clone(),
                        method: method.to_string(),
                        error,
                    },
                    CallError::Closed => ClientError::Closed { path: self.path.clone() },
                }),
                incoming = self.conn.incoming.recv(), if open => match incoming {
                    Some(Incoming::Fault(fault)) => {
                        return Err(ClientError::Garbage {
                            path: self.path.clone(),
                            detail: format!("a line that is not JSON-RPC ({fault})"),
                        });
                    }
                    // A request or notification from the daemon: not for a query.
                    Some(_) => {}
                    None => open = false,
                },
                () = tokio::time::sleep_until(self.deadline) => {
                    return Err(ClientError::Silent {
                        path: self.path.clone(),
                        within: self.within,
                        why: format!("no answer to {method}"),
                        hint: hint(self.peer_pid),
                    });
                }
            }
        }
    }

    pub(super) fn close(self) {
        self.conn.peer.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_as_seconds_or_humantime() {
        assert_eq!(parse_timeout("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_timeout("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("-1").is_err());
        assert!(parse_timeout("18446744073709551615").is_err());
        assert!(parse_timeout("99999999999999999999s").is_err());
        assert!(parse_timeout("soon").is_err());
    }
}
