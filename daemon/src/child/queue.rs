//! The queue of commands toward one child's driver, bounded in messages ([`CMD_DEPTH`]) and in
//! bytes ([`QUEUE_BYTES`]). A parent's message waits here until the relay has passed it to the
//! child's outbox (bounded in bytes itself), so a child that stops reading its stdin holds at
//! most this much of what its editor sent, not `CMD_DEPTH` lines of up to `max_line` each.
//!
//! Past either bound a message is refused, never waited for: the editor's connection is read
//! by one task for all its sessions, so waiting here for one session's stalled agent would
//! stall the editor's other sessions too.

use std::sync::Arc;

use acpd_protocol::envelope::RpcError;
use acpd_protocol::errors::ErrorName;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc};

use super::Cmd;

/// Commands queued toward one driver at most, whatever their size.
pub(super) const CMD_DEPTH: usize = 256;
/// Bytes of the parent's messages queued toward one child at most (each costs its method and
/// params). A larger message (up to `max_line`) takes the whole budget: it is queued only
/// when nothing else of the parent's waits.
pub(crate) const QUEUE_BYTES: usize = 4 * 1024 * 1024;

/// A command and the share of the byte budget it holds until the relay has handed it on.
pub(crate) struct Queued {
    pub cmd: Cmd,
    pub held: Option<OwnedSemaphorePermit>,
}

/// Why a command was not queued.
pub(super) enum Refused {
    /// Past [`CMD_DEPTH`] or [`QUEUE_BYTES`]: the agent is not reading fast enough.
    Full(Box<Cmd>),
    /// The driver has ended.
    Closed,
}

/// The sending half: cheap to clone.
#[derive(Clone)]
pub(super) struct CmdTx {
    tx: mpsc::Sender<Queued>,
    bytes: Arc<Semaphore>,
}

impl CmdTx {
    pub(super) fn channel() -> (CmdTx, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel(CMD_DEPTH);
        let bytes = Arc::new(Semaphore::new(QUEUE_BYTES));
        (CmdTx { tx, bytes }, rx)
    }

    /// Queues `cmd`, whose payload is `len` bytes, without waiting.
    pub(super) fn try_send(&self, cmd: Cmd, len: usize) -> Result<(), Refused> {
        let held = if len == 0 {
            None
        } else {
            let cost = len.min(QUEUE_BYTES) as u32;
            match self.bytes.clone().try_acquire_many_owned(cost) {
                Ok(p) => Some(p),
                Err(TryAcquireError::NoPermits) => return Err(Refused::Full(Box::new(cmd))),
                Err(TryAcquireError::Closed) => return Err(Refused::Closed),
            }
        };
        self.tx.try_send(Queued { cmd, held }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(q) => Refused::Full(Box::new(q.cmd)),
            mpsc::error::TrySendError::Closed(_) => Refused::Closed,
        })
    }

    /// Queues a command with no payload of the parent's (a run's prompt, which its owner
    /// sends one at a time), waiting for a slot.
    pub(super) async fn send(&self, cmd: Cmd) -> Result<(), Cmd> {
        self.tx
            .send(Queued { cmd, held: None })
            .await
            .map_err(|e| e.0.cmd)
    }
}

/// The error an editor gets for a request refused because session `session`'s queue toward
/// its agent is full.
pub(crate) fn queue_full(session: &str) -> RpcError {
    let name = ErrorName::Limit;
    RpcError::new(
        name.code(),
        format!(
            "Limit reached: session {session}'s queue toward its agent is full ({} MiB or \
             {CMD_DEPTH} messages wait for an agent that is not reading them); retry once the \
             agent has caught up, or cancel the turn",
            QUEUE_BYTES >> 20
        ),
    )
    .with_data(serde_json::json!({
        "code": name.as_str(),
        "limit": "session_queue",
        "value": QUEUE_BYTES,
        "sessionId": session,
    }))
}

/// Why [`super::Child::call`] refused a parent's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallRefused {
    /// The session's queue toward its agent is full ([`queue_full`]).
    QueueFull,
    /// The session is over.
    Over,
}

impl CallRefused {
    /// The error the editor gets, naming its session `session`.
    pub fn to_rpc_error(self, session: &str) -> RpcError {
        match self {
            CallRefused::QueueFull => queue_full(session),
            CallRefused::Over => RpcError::internal(format!(
                "session {session} is over (its agent exited or the session was closed); \
                 start a new session, or session/load this one"
            )),
        }
    }
}
