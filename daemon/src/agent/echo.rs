//! The echo agent's connection: the incoming loop, the handshake, sessions and turn
//! bookkeeping.
//!
//! The loop only ever answers quickly; a prompt's turn runs in its own task, so `session/cancel`
//! and the answers to the agent's own requests (permission, file reads) keep flowing while a
//! turn streams, sleeps or hangs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use acpd_protocol::codec::DEFAULT_MAX_LINE;
use acpd_protocol::envelope::{self, Id, RESOURCE_NOT_FOUND, RpcError};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::session_files::{self, Entry, Role, SessionFile, Store};
use super::turn::{self, TurnEnd};
use super::{EchoArgs, Stage, lifecycle, script};
use crate::wire::{self, Incoming, Peer};

/// How long an exit waits for queued output to reach stdout. Bounded because a client that
/// stopped reading must not keep a scripted crash from happening.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// State shared by the incoming loop and the turn tasks.
pub(super) struct Agent {
    pub peer: Peer,
    pub args: EchoArgs,
    /// The `--sessions` directory, opened.
    pub store: Option<Store>,
    pub sessions: Mutex<HashMap<String, Session>>,
    pub next_session: AtomicU64,
    next_turn: AtomicU64,
    /// Set by `--ignore-eof` or `:ignore-eof`; read when stdin ends.
    pub ignore_eof: AtomicBool,
    /// Set by `:deaf-stdin`: stdin is never read again (see [`Deaf`]).
    pub deaf: Arc<AtomicBool>,
    /// The auth method `authenticate` succeeded with (`--auth`).
    pub authenticated: Mutex<Option<String>>,
    /// Whether the client's `initialize` had `clientCapabilities.subagents`.
    pub client_subagents: AtomicBool,
    /// With `--air`: the client negotiated AIR's `sessionFailure` at `initialize`.
    pub client_air: AtomicBool,
    /// `clientCapabilities` of `initialize` (`:client-caps`).
    pub client_caps: Mutex<serde_json::Value>,
    /// The methods of the `_` notifications received, in order (`:ext`).
    pub ext_seen: Mutex<Vec<String>>,
    /// The running `:subagent-hang` sessions, so `session/cancel` can reach them.
    pub subagents: Mutex<HashMap<String, CancellationToken>>,
}

pub(super) struct Session {
    turn: Option<RunningTurn>,
    /// The `systemPrompt` text given at `session/new` (only offered with `--system-prompt`).
    pub system_prompt: Option<String>,
    /// What `--sessions` keeps of this session; written at the end of each turn.
    pub file: Option<SessionFile>,
    /// The `mcpServers` of `session/new`, for `:delegate`.
    pub mcp_servers: Vec<serde_json::Value>,
    /// The `_meta` of `session/new` (null without one), for `:session-meta`.
    pub meta: serde_json::Value,
}

struct RunningTurn {
    /// Distinguishes this turn from a later one, so a finishing turn only clears its own slot.
    generation: u64,
    cancel: CancellationToken,
    /// The `session/prompt` request's id, for `$/cancel_request`.
    request: Id,
    /// Set by `$/cancel_request`: the prompt is answered -32800 instead of a stop reason.
    by_request: Arc<AtomicBool>,
    /// The `_meta` of the `session/prompt` (null without one), for `:prompt-meta`.
    meta: serde_json::Value,
}

impl Session {
    pub(super) fn new(system_prompt: Option<String>, file: Option<SessionFile>) -> Session {
        Session {
            turn: None,
            system_prompt,
            file,
            mcp_servers: Vec::new(),
            meta: serde_json::Value::Null,
        }
    }

    /// The `_meta` of the running turn's `session/prompt` (null without one).
    pub(super) fn prompt_meta(&self) -> serde_json::Value {
        self.turn
            .as_ref()
            .map_or(serde_json::Value::Null, |t| t.meta.clone())
    }

    /// Cancels the running turn, if any (the session is being closed or deleted).
    pub(super) fn cancel_turn(&self) {
        if let Some(turn) = &self.turn {
            turn.cancel.cancel();
        }
    }
}

impl Agent {
    /// Closes stdout after everything queued so far has been written, waiting at most
    /// [`FLUSH_GRACE`].
    pub(super) async fn flush_and_close(&self) {
        let _ = tokio::time::timeout(FLUSH_GRACE, self.peer.flush_and_close()).await;
    }

    /// Closes stdout for real. Dropping tokio's `Stdout` leaves descriptor 1 open, so after the
    /// queued lines are out it is pointed at `/dev/null`: the client sees its pipe close while
    /// this process lives on, and nothing written later can reach whatever reuses the number.
    pub(super) async fn close_stdout(&self) {
        self.flush_and_close().await;
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null");
        if let Ok(null) = null {
            let _ = nix::unistd::dup2_stdout(&null);
        }
    }

    /// Ends the process with `code` once queued output is out, as a crashing agent that had
    /// already written its last lines would.
    pub(super) async fn exit(&self, code: i32) {
        self.flush_and_close().await;
        std::process::exit(code);
    }
}

/// Stdin behind a switch: once `deaf` is set, reads never complete again, so the peer's bytes
/// pile up in the pipe while this process stays alive (`:deaf-stdin`).
struct Deaf<R> {
    inner: R,
    deaf: Arc<AtomicBool>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Deaf<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.deaf.load(Ordering::Acquire) {
            // Never woken on purpose: this read stays pending for the life of the process.
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves one ACP connection on `stdin`/`stdout` (the process's own, from the caller);
/// returns the exit code for stdin EOF.
pub(super) async fn serve<R, W>(args: EchoArgs, stdin: R, stdout: W) -> i32
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let deaf = Arc::new(AtomicBool::new(false));
    let stdin = Deaf {
        inner: stdin,
        deaf: deaf.clone(),
    };
    let store = match args.sessions.as_deref().map(Store::open).transpose() {
        Ok(store) => store,
        Err(e) => {
            eprintln!("acpd agent echo: {e}");
            return 1;
        }
    };
    let conn = wire::connect(stdin, stdout, DEFAULT_MAX_LINE);
    let mut incoming = conn.incoming;
    let agent = Arc::new(Agent {
        peer: conn.peer,
        ignore_eof: AtomicBool::new(args.ignore_eof),
        args,
        store,
        sessions: Mutex::new(HashMap::new()),
        next_session: AtomicU64::new(1),
        next_turn: AtomicU64::new(1),
        deaf,
        authenticated: Mutex::new(None),
        client_subagents: AtomicBool::new(false),
        client_air: AtomicBool::new(false),
        client_caps: Mutex::new(serde_json::Value::Null),
        ext_seen: Mutex::new(Vec::new()),
        subagents: Mutex::new(HashMap::new()),
    });
    while let Some(message) = incoming.recv().await {
        match message {
            Incoming::Request { id, method, params } => {
                handle_request(&agent, id, &method, params.as_deref()).await;
            }
            Incoming::Notification { method, params } => {
                if method == "session/cancel" {
                    cancel(&agent, params.as_deref());
                } else if method == "$/cancel_request" {
                    cancel_request(&agent, params.as_deref());
                } else if method.starts_with('_') {
                    lock(&agent.ext_seen).push(method);
                }
            }
            Incoming::Fault(fault) => {
                let (id, error) = fault.to_rpc_error();
                let _ = agent.peer.respond_err(id.as_ref(), &error).await;
            }
        }
    }
    if agent.ignore_eof.load(Ordering::Acquire) {
        std::future::pending::<()>().await;
    }
    // Let answers already queued reach the client, but do not wait for running turns.
    agent.flush_and_close().await;
    0
}

async fn handle_request(agent: &Arc<Agent>, id: Id, method: &str, params: Option<&RawValue>) {
    let args = &agent.args;
    let stage = match method {
        "initialize" => Some(Stage::Initialize),
        "session/new" => Some(Stage::SessionNew),
        _ => None,
    };
    if let Some(stage) = stage {
        if args.fail_at == Some(stage) {
            match args.error_code {
                Some(code) => {
                    let error = RpcError::new(code, format!("scripted failure at {method}"));
                    let _ = agent.peer.respond_err(Some(&id), &error).await;
                }
                None => agent.exit(args.exit_code).await,
            }
            return;
        }
        if args.hang_at == Some(stage) {
            return;
        }
    }
    if let (Some(ms), "initialize") = (args.init_delay, method) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let reply = match method {
        "session/prompt" => match start_prompt(agent, &id, params) {
            // The turn task answers.
            Ok(()) => return,
            Err(e) => Err(e),
        },
        other => lifecycle::handle(agent, other, params).await,
    };
    let _ = match reply {
        Ok(result) => agent.peer.respond_ok(&id, &result).await,
        Err(error) => agent.peer.respond_err(Some(&id), &error).await,
    };
}

pub(super) fn parse_params<T: for<'de> Deserialize<'de>>(
    params: Option<&RawValue>,
) -> Result<T, RpcError> {
    let raw = params.map_or("null", RawValue::get);
    serde_json::from_str(raw).map_err(RpcError::invalid_params)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptParams {
    session_id: String,
    prompt: Vec<serde_json::Value>,
    #[serde(default, rename = "_meta")]
    meta: serde_json::Value,
}

/// The text blocks of `blocks`, joined. Only text carries script; other content is accepted and
/// ignored, as an agent that does not understand an attachment would. Blocks acpd marks as its
/// own instructions (`_meta.acpd.instruction`) are skipped, so the echo shows what the caller
/// wrote, not what acpd added.
pub(super) fn text_of(blocks: &[serde_json::Value]) -> String {
    blocks
        .iter()
        .filter(|block| block.get("type").and_then(|t| t.as_str()) == Some("text"))
        .filter(|block| block.pointer("/_meta/acpd/instruction") != Some(&json!(true)))
        .filter_map(|block| block.get("text").and_then(|t| t.as_str()))
        .collect()
}

/// Validates a prompt and spawns its turn; an `Err` is the answer to send at once.
fn start_prompt(agent: &Arc<Agent>, id: &Id, params: Option<&RawValue>) -> Result<(), RpcError> {
    let params: PromptParams = parse_params(params)?;
    let text = text_of(&params.prompt);
    let cancel = CancellationToken::new();
    let generation = agent.next_turn.fetch_add(1, Ordering::Relaxed);
    let by_request = Arc::new(AtomicBool::new(false));
    let system_prompt = {
        let mut sessions = lock(&agent.sessions);
        let Some(session) = sessions.get_mut(&params.session_id) else {
            return Err(RpcError::new(RESOURCE_NOT_FOUND, "Session not found")
                .with_data(json!({ "sessionId": params.session_id })));
        };
        if session.turn.is_some() {
            return Err(RpcError::invalid_request(format!(
                "session {} already has a prompt in progress",
                params.session_id
            )));
        }
        session.turn = Some(RunningTurn {
            generation,
            cancel: cancel.clone(),
            request: id.clone(),
            by_request: by_request.clone(),
            meta: params.meta.clone(),
        });
        session.system_prompt.clone()
    };
    let agent = agent.clone();
    let id = id.clone();
    tokio::spawn(async move {
        let mut steps = script::parse(&text);
        if let Some(system) = system_prompt {
            steps.insert(0, script::Step::Echo(format!("system: {system}\n")));
        }
        let ran = turn::run(&agent, &params.session_id, &cancel, steps, &params.prompt).await;
        let (end, around) = (ran.end, ran.around);
        // Free the session before answering, so a client that prompts again as soon as it
        // reads the answer is not told the session is busy.
        let record = {
            let mut sessions = lock(&agent.sessions);
            match sessions.get_mut(&params.session_id) {
                Some(session) => {
                    if session.turn.as_ref().map(|t| t.generation) == Some(generation) {
                        session.turn = None;
                    }
                    session.file.as_mut().map(|file| {
                        record_turn(file, &text, ran.transcript);
                        file.clone()
                    })
                }
                None => None,
            }
        };
        // Written before the answer, so a client that lists or loads as soon as the turn ends
        // sees it.
        if let (Some(store), Some(file)) = (&agent.store, record)
            && let Err(e) = store.save(&file)
        {
            eprintln!("acpd agent echo: {e}");
        }
        let answer = match end {
            _ if by_request.load(Ordering::Acquire) => {
                let e = RpcError::new(REQUEST_CANCELLED, "Request cancelled");
                envelope::encode_error(Some(&id), &e)
            }
            TurnEnd::Stop { reason, meta } => {
                let mut result = json!({ "stopReason": reason });
                if let Some(meta) = meta {
                    result["_meta"] = meta;
                }
                envelope::encode_result(&id, &envelope::to_raw(&result))
            }
            TurnEnd::Error(error) => envelope::encode_error(Some(&id), &error),
        };
        // One line buffer, so the lines a directive put around the answer go out in the same
        // write as the answer itself.
        let _ = agent.peer.send_line(around.wrap(answer)).await;
    });
    Ok(())
}

/// Appends a finished turn to the session's history: the prompt text, then what was streamed.
fn record_turn(file: &mut SessionFile, prompt: &str, streamed: String) {
    if file.title.is_none() {
        file.title = session_files::title_of(prompt);
    }
    file.history.push(Entry {
        role: Role::User,
        text: prompt.to_string(),
    });
    if !streamed.is_empty() {
        file.history.push(Entry {
            role: Role::Agent,
            text: streamed,
        });
    }
    file.updated_at = session_files::now();
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelParams {
    session_id: String,
}

/// Cancels the session's running turn. A cancel for an unknown or idle session is a no-op, as
/// notifications cannot be answered.
fn cancel(agent: &Agent, params: Option<&RawValue>) {
    let Ok(params) = parse_params::<CancelParams>(params) else {
        return;
    };
    if let Some(session) = lock(&agent.sessions).get(&params.session_id) {
        session.cancel_turn();
    }
    if let Some(sub) = lock(&agent.subagents).get(&params.session_id) {
        sub.cancel();
    }
}

/// ACP's answer to a request its sender cancelled with `$/cancel_request`.
const REQUEST_CANCELLED: i64 = -32800;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelRequestParams {
    request_id: Id,
}

/// `$/cancel_request` for a running prompt: its turn is cancelled and the prompt answered
/// -32800. Any other id (answered already, never seen) is a no-op.
fn cancel_request(agent: &Agent, params: Option<&RawValue>) {
    let Ok(params) = parse_params::<CancelRequestParams>(params) else {
        return;
    };
    for session in lock(&agent.sessions).values() {
        if let Some(turn) = session
            .turn
            .as_ref()
            .filter(|t| t.request == params.request_id)
        {
            turn.by_request.store(true, Ordering::Release);
            turn.cancel.cancel();
        }
    }
}
