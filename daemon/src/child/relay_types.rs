//! What a bridge session's relay is handed and how it ends: where its traffic goes, the first
//! thing it does, what the parent serves, the commands it takes, the end it reports.

use acpd_protocol::acp::ContentBlock;
use acpd_protocol::envelope::Id;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::{TurnControl, TurnReport, strict};
use crate::wire::Peer;

/// Where a bridge session's traffic goes (relay mode).
pub struct RelayTarget {
    /// The parent's connection.
    pub parent: Peer,
    /// The session id the parent knows (acpd mints it; the child's own is never shown).
    pub session_id: String,
    /// Which client methods the parent advertised, so a child's `fs/*` and `terminal/*`
    /// requests reach it (else −32601).
    pub serves: ParentServes,
    /// The child's sandbox, when it has one: its `fs/*` requests reach the parent only for
    /// paths beneath a directory it may write (the editor would read and write for it
    /// outside the sandbox), and its `terminal/*` never do.
    pub confinement: Option<std::sync::Arc<crate::supervise::Confinement>>,
    /// What the relay does before anything else, so no update can reach the parent before
    /// the session id it names.
    pub first: First,
    /// How long the session outlives its parent's connection, waiting to be attached again
    /// (`detach_timeout`); `None`: it ends with the connection.
    pub detach: Option<std::time::Duration>,
    /// Runs when the agent accepted the parent's `session/close`, before that answer reaches
    /// the parent: the parent's next call naming the id (a load, a resume) must find the
    /// session closed, not still open while its child is torn down.
    pub on_closed: Option<Box<dyn FnOnce() + Send + Sync>>,
}

/// The first thing a relay does toward its parent.
pub enum First {
    Nothing,
    /// Answers the parent's `session/new` (or the `session/load` that re-attached it).
    Answer(Id, Box<RawValue>),
    /// Forwards the parent's `session/load` or `session/resume`: the call that makes an
    /// existing session live. Its replay reaches the parent under the parent's session id;
    /// if the agent refuses it, the parent gets the agent's error and the session ends.
    Open {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    },
}

/// The client methods a parent serves.
#[derive(Debug, Clone, Copy, Default)]
pub struct ParentServes {
    pub read_text_file: bool,
    pub write_text_file: bool,
    pub terminal: bool,
    /// `clientCapabilities.elicitation`: `elicitation/create` and `elicitation/complete`.
    pub elicitation: bool,
    /// The parent opted in to Subagent Sessions: the child's own reach it, remapped.
    pub subagents: bool,
}

impl ParentServes {
    /// Whether the parent advertised what the child's `method` needs of it.
    pub fn takes(&self, method: &str) -> bool {
        match strict::needs_of_parent(method) {
            None => true,
            Some(strict::Need::ReadTextFile) => self.read_text_file,
            Some(strict::Need::WriteTextFile) => self.write_text_file,
            Some(strict::Need::Terminal) => self.terminal,
            Some(strict::Need::Elicitation) => self.elicitation,
        }
    }
}

/// How a bridge session ended, for the parent's log and the answer to its open calls.
#[derive(Debug, Clone)]
pub enum RelayEnd {
    /// The child exited or closed its output.
    ChildGone {
        exit_code: Option<i32>,
        signal: Option<String>,
    },
    /// The child sent a line that is not JSON-RPC (or too long, or never finished): why.
    Protocol(String),
    /// The child stopped reading for `write_timeout`.
    ChildDeaf,
    /// The parent's connection broke.
    ParentGone,
    /// `session/close` succeeded, or the owner shut the session.
    Closed,
    /// The agent refused the `session/load` or `session/resume` that was to open it.
    OpenRefused,
    /// Detached from its parent for `detach_timeout` without being attached again.
    Expired,
}

/// What acpd records of a forwarded call (a session's new title) once the agent answered it
/// with a result, before the parent sees the answer; never after an error, so what the agent
/// refused changes nothing.
pub(crate) type AfterOk =
    Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

pub(crate) enum Cmd {
    Prompt {
        prompt: Vec<ContentBlock>,
        ctl: TurnControl,
        reply: oneshot::Sender<TurnReport>,
    },
    /// Starts relaying (the session is filed and its `session/new` answered).
    Relay(RelayTarget),
    /// A parent's call, forwarded with its id (relay mode).
    Call {
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
        after_ok: Option<AfterOk>,
    },
    /// A parent's `session/cancel` of this session, its params as the parent sent them
    /// (relay mode). Queued in order, so it reaches the child after what the parent sent
    /// before it (the prompt it cancels) and before what it sent after (its next prompt).
    Cancel(Box<RawValue>),
    /// A parent's `_` extension notification (relay mode).
    Notify {
        method: String,
        params: Box<RawValue>,
    },
    /// A `session/update` acpd itself sends the parent about this session: a run nested under
    /// it (relay mode; shown only to a parent that opted in to Subagent Sessions).
    Announce(Box<RawValue>),
    /// The parent's connection, for asking it about a run nested under this session; `None`
    /// when detached or when it did not opt in to Subagent Sessions.
    Parent(oneshot::Sender<Option<crate::wire::Peer>>),
}
