//! Running one prompt turn: each script step streamed, asked or acted out in order.
//!
//! A turn honours `session/cancel` the way ACP asks of an agent (it stops and answers
//! `cancelled`), checking between steps, between `:chunks` chunks and while it hangs or
//! sleeps; only `:hang-deaf` and `:close-stdout` ignore it, on purpose.

use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use acpd_protocol::envelope::{self, RpcError};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::unistd::Pid;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::echo::Agent;
use super::script::Step;
use crate::wire::CallError;

/// Filler for `:chunks`: plain ASCII, so a chunk's byte count is its character count.
const FILLER: &[u8] = b"abcdefghijklmnopqrstuvwxyz";

/// The tiny PNG (just its signature) that `:image` sends.
const IMAGE_DATA: &str = "iVBORw0KGgo=";

/// An `agent_message_chunk` update holding `text`.
pub(super) fn text_update(text: &str) -> serde_json::Value {
    json!({
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text},
    })
}

/// How a turn ended, i.e. how `session/prompt` is answered.
pub(super) enum TurnEnd {
    /// A result with this stop reason and, if set, this `_meta` (a typed failure record).
    Stop {
        reason: String,
        meta: Option<serde_json::Value>,
    },
    Error(RpcError),
}

/// Raw lines to write in the same write as the prompt answer: `before` it and `after` it, each
/// line newline-terminated. How the hostile directives place bytes next to the answer exactly.
#[derive(Default)]
pub(super) struct Around {
    pub before: Vec<u8>,
    pub after: Vec<u8>,
}

impl Around {
    /// `before`, then `answer`, then `after`, as one buffer for one `send_line` (which adds the
    /// final newline).
    pub(super) fn wrap(self, answer: Vec<u8>) -> Vec<u8> {
        let mut line = self.before;
        line.extend_from_slice(&answer);
        if !self.after.is_empty() {
            line.push(b'\n');
            line.extend_from_slice(&self.after);
            // `send_line` appends the last newline.
            line.pop();
        }
        line
    }
}

pub(super) fn stop(reason: &str) -> TurnEnd {
    TurnEnd::Stop {
        reason: reason.to_string(),
        meta: None,
    }
}

/// What a finished turn leaves: how to answer, what goes around the answer, and the text it
/// streamed as agent messages (for `--sessions` history).
pub(super) struct Ran {
    pub end: TurnEnd,
    pub around: Around,
    pub transcript: String,
}

/// Runs the steps; never returns for turns that hang by design. `prompt` is the prompt's
/// content blocks, for `:blocks`.
pub(super) async fn run(
    agent: &Agent,
    session_id: &str,
    cancel: &CancellationToken,
    steps: Vec<Step>,
    prompt: &[serde_json::Value],
) -> Ran {
    let turn = Turn {
        agent,
        session_id,
        cancel,
        prompt,
        around: Mutex::new(Around::default()),
        transcript: Mutex::new(String::new()),
    };
    let end = turn.steps(steps).await;
    let around = turn.around.into_inner().unwrap_or_else(|p| p.into_inner());
    let transcript = turn
        .transcript
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    Ran {
        end,
        around,
        transcript,
    }
}

pub(super) struct Turn<'a> {
    pub agent: &'a Agent,
    pub session_id: &'a str,
    pub cancel: &'a CancellationToken,
    pub prompt: &'a [serde_json::Value],
    around: Mutex<Around>,
    /// The text of every agent message this turn streamed through [`Turn::text`].
    transcript: Mutex<String>,
}

impl Turn<'_> {
    async fn steps(&self, steps: Vec<Step>) -> TurnEnd {
        for step in steps {
            if self.cancel.is_cancelled() {
                return stop("cancelled");
            }
            if let Some(end) = self.step(step).await {
                return end;
            }
        }
        if self.cancel.is_cancelled() {
            stop("cancelled")
        } else {
            stop("end_turn")
        }
    }

    /// As codex-acp ends a failed turn: to a client that negotiated AIR's `sessionFailure`,
    /// `end_turn` with the record in `_meta.jetbrains.air`; to any other, a JSON-RPC error.
    fn air_failure(&self, category: &str) -> TurnEnd {
        if !self
            .agent
            .client_air
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return TurnEnd::Error(RpcError::new(
                acpd_protocol::envelope::INTERNAL_ERROR,
                "scripted failure",
            ));
        }
        TurnEnd::Stop {
            reason: "end_turn".into(),
            meta: Some(
                json!({"jetbrains": {"air": {"version": 1, "sessionFailure": {
                    "id": format!("{}:error", self.session_id),
                    "revision": 1,
                    "category": category,
                    "severity": "error",
                    "title": "scripted failure",
                    "actions": ["retry"],
                }}}}),
            ),
        }
    }

    fn around(&self) -> std::sync::MutexGuard<'_, Around> {
        self.around.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one step; `Some` ends the turn.
    async fn step(&self, step: Step) -> Option<TurnEnd> {
        match step {
            Step::Echo(text) | Step::Explain(text) => self.text(&text).await,
            Step::Stop(reason) => return Some(stop(&reason)),
            Step::Error { code, message } => {
                return Some(TurnEnd::Error(RpcError::new(code, message)));
            }
            Step::MetaFailure(category) => {
                return Some(TurnEnd::Stop {
                    reason: "end_turn".into(),
                    meta: Some(json!({"acpd": {"failure": {"category": category}}})),
                });
            }
            Step::AirFailure(category) => return Some(self.air_failure(&category)),
            Step::Crash(code) => self.agent.exit(code).await,
            Step::Signal(sig) => self.kill_self(sig).await,
            Step::Chunks { count, size } => self.chunks(count, size).await,
            Step::Timed {
                count,
                size,
                every_ms,
            } => self.timed(count, size, every_ms).await,
            Step::Update(kind) => {
                self.update(json!({"sessionUpdate": kind, "acpdProbe": true}))
                    .await
            }
            Step::Usage(used) => {
                self.update(json!({
                    "sessionUpdate": "usage_update",
                    "used": used,
                    "size": used.max(200_000),
                }))
                .await
            }
            Step::RawUpdate(update) => {
                let sid = serde_json::to_string(&self.session_id).unwrap_or_default();
                let line = format!(
                    r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{sid},"update":{update}}}}}"#
                );
                self.raw(line.into_bytes()).await
            }
            Step::Thought(text) => {
                self.update(json!({
                    "sessionUpdate": "agent_thought_chunk",
                    "content": {"type": "text", "text": text},
                }))
                .await
            }
            Step::Image => {
                self.update(json!({
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "image", "mimeType": "image/png", "data": IMAGE_DATA},
                }))
                .await
            }
            Step::Hang => {
                self.cancel.cancelled().await;
                return Some(stop("cancelled"));
            }
            Step::HangDeaf => std::future::pending::<()>().await,
            Step::Sleep(ms) => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                    _ = self.cancel.cancelled() => return Some(stop("cancelled")),
                }
            }
            Step::IgnoreEof => self
                .agent
                .ignore_eof
                .store(true, std::sync::atomic::Ordering::Release),
            Step::IgnoreTerm => super::set_sigterm(SigHandler::SigIgn),
            Step::Grandchild => self.grandchild().await,
            Step::Escapee(ms) => self.escapee(ms).await,
            Step::Pid => self.text(&format!("pid {}\n", std::process::id())).await,
            Step::Permission => self.permission().await,
            Step::Read(path) => self.read(&path).await,
            Step::Cwd => {
                let line = match std::env::current_dir() {
                    Ok(dir) => format!("cwd {}\n", dir.display()),
                    Err(e) => format!("cwd error: {e}\n"),
                };
                self.text(&line).await
            }
            Step::Write(path, text) => {
                let line = match std::fs::write(&path, format!("{text}\n")) {
                    Ok(()) => format!("wrote {path}\n"),
                    Err(e) => format!("write error {path}: {e}\n"),
                };
                self.text(&line).await
            }
            Step::Env(names) => {
                let mut out = String::new();
                for name in names {
                    match std::env::var_os(&name) {
                        Some(value) => {
                            out.push_str(&format!("{name}={}\n", value.to_string_lossy()))
                        }
                        None => out.push_str(&format!("{name} unset\n")),
                    }
                }
                self.text(&out).await
            }
            Step::Garbage => self.raw(b"this is not json".to_vec()).await,
            Step::Binary => self.raw(vec![0xff, 0xfe, 0xfd]).await,
            Step::Oversize(bytes) => self.raw(vec![b'x'; bytes]).await,
            Step::CloseStdout => {
                self.agent.close_stdout().await;
                std::future::pending::<()>().await
            }
            Step::GarbageThenStop => {
                self.around()
                    .before
                    .extend_from_slice(b"this is not json\n");
                return Some(stop("end_turn"));
            }
            Step::AfterAnswer(text) => {
                let mut line = self.update_line(text_update(&format!("{text}\n")));
                line.push(b'\n');
                self.around().after.extend_from_slice(&line);
            }
            Step::ForgeAcpd => {
                let result = json!({
                    "runId": "run-forged",
                    "provider": "echo",
                    "turn": 1,
                    "stopReason": "completed",
                    "output": [{"type": "text", "text": "forged by the child"}],
                });
                let params = json!({
                    "runId": "run-forged",
                    "provider": "echo",
                    "turn": 1,
                    "result": result,
                });
                let _ = self
                    .agent
                    .peer
                    .notify("_acpd/subagent/ended", &params)
                    .await;
            }
            Step::Notify(method) => {
                let params = json!({"sessionId": self.session_id, "acpdProbe": true});
                let _ = self.agent.peer.notify(&method, &params).await;
            }
            Step::ForeignSession(id) => {
                let params = json!({"sessionId": id, "update": text_update("foreign-session\n")});
                let _ = self.agent.peer.notify("session/update", &params).await;
            }
            Step::NoSession => {
                let params = json!({"update": text_update("no-session\n")});
                let _ = self.agent.peer.notify("session/update", &params).await;
            }
            Step::DupSession(id) => {
                // Written by hand: a JSON object type cannot hold the same key twice.
                let params = format!(
                    "{{\"sessionId\":{},\"update\":{},\"sessionId\":{}}}",
                    json!(self.session_id),
                    text_update("dup-session\n"),
                    json!(id),
                );
                let _ = self.agent.peer.notify_text("session/update", &params).await;
            }
            Step::BadPermission => {
                // `toolCall` missing, `options` not an array: invalid params for ACP.
                let params = json!({"sessionId": self.session_id, "options": 7});
                self.ask_permission(params).await
            }
            Step::DeafStdin => self
                .agent
                .deaf
                .store(true, std::sync::atomic::Ordering::Release),
            Step::Blocks => self.blocks().await,
            Step::Auth => self.auth().await,
            Step::Ext => self.ext().await,
            Step::ExtRequest(method) => self.ext_request(&method).await,
            Step::Request {
                method,
                params,
                cancel,
            } => self.request(&method, &params, cancel).await,
            Step::NotifyJson { method, params } => self.notify_json(&method, &params).await,
            Step::ClientCaps => self.client_caps().await,
            Step::SessionMeta => self.session_meta().await,
            Step::PromptMeta => self.prompt_meta().await,
            Step::ToolCall { name, status } => self.tool_call(&name, &status).await,
            Step::Stderr(text) => write_stderr(text.as_bytes(), 1),
            Step::StderrFlood { count, size } => write_stderr(&vec![b'e'; size], count),
            Step::Subagent { text, hang } => return self.subagent(&text, hang).await,
            Step::Delegate(prompt) => self.delegate(serde_json::json!({ "prompt": prompt })).await,
            Step::DelegateJson(args) => {
                self.delegate(serde_json::from_str(&args).unwrap_or_default())
                    .await
            }
        }
        None
    }

    /// Encodes a `session/update` notification for this session.
    fn update_line(&self, update: serde_json::Value) -> Vec<u8> {
        let params = json!({"sessionId": self.session_id, "update": update});
        envelope::encode_notification("session/update", Some(&envelope::to_raw(&params)))
    }

    /// Sends one update. Send failures mean stdout is gone; the turn carries on regardless, as
    /// the process ends with stdin or by a later directive.
    pub(super) async fn update(&self, update: serde_json::Value) {
        let _ = self.agent.peer.send_line(self.update_line(update)).await;
    }

    /// Streams `text` as an agent message and keeps it for the session's history.
    pub(super) async fn text(&self, text: &str) {
        self.transcript
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_str(text);
        self.update(text_update(text)).await
    }

    async fn raw(&self, line: Vec<u8>) {
        let _ = self.agent.peer.send_line(line).await;
    }

    /// Streams `count` identical chunks from one pre-encoded line, so a flood of a hundred
    /// thousand chunks costs a copy per chunk rather than a JSON encoding.
    async fn chunks(&self, count: u64, size: usize) {
        let filler: String = FILLER
            .iter()
            .cycle()
            .take(size)
            .map(|&b| char::from(b))
            .collect();
        let line = self.update_line(json!({
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": filler},
        }));
        for _ in 0..count {
            if self.cancel.is_cancelled() {
                return;
            }
            // One spare byte, for the newline `send_line` appends, avoids a reallocation.
            let mut copy = Vec::with_capacity(line.len() + 1);
            copy.extend_from_slice(&line);
            if self.agent.peer.send_line(copy).await.is_err() {
                return;
            }
        }
    }

    /// `count` chunks whose text starts `t=<CLOCK_MONOTONIC ns>;`, padded to `size`.
    async fn timed(&self, count: u64, size: usize, every_ms: u64) {
        for _ in 0..count {
            if self.cancel.is_cancelled() {
                return;
            }
            let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                .map(|t| t.tv_sec() as u128 * 1_000_000_000 + t.tv_nsec() as u128)
                .unwrap_or_default();
            let mut text = format!("t={now};");
            text.extend(
                FILLER
                    .iter()
                    .cycle()
                    .take(size.saturating_sub(text.len()))
                    .map(|&b| char::from(b)),
            );
            let line = self.update_line(json!({
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            }));
            if self.agent.peer.send_line(line).await.is_err() {
                return;
            }
            if every_ms > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(every_ms)).await;
            }
        }
    }

    /// Dies by `sig` after flushing what was already sent. Should the signal not end the
    /// process (a stop signal, or one whose default is to ignore), stdout is already closed,
    /// so the turn then hangs as `:close-stdout` does.
    async fn kill_self(&self, sig: Signal) {
        // A scripted SIGSEGV or SIGABRT must not litter the test's directory with core files.
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_CORE) {
            let _ = setrlimit(Resource::RLIMIT_CORE, 0, hard);
        }
        // The default action is what a test expects to observe, even for a signal this process
        // ignores (Rust ignores SIGPIPE; `:ignore-term` ignores SIGTERM). SIGCHLD is left alone:
        // tokio reaps the grandchild through it, and its default ends nothing anyway.
        if !matches!(sig, Signal::SIGKILL | Signal::SIGSTOP | Signal::SIGCHLD) {
            // SAFETY: SIG_DFL runs no code in the process.
            let _ = unsafe { signal(sig, SigHandler::SigDfl) };
        }
        self.agent.flush_and_close().await;
        let _ = kill(Pid::this(), sig);
        std::future::pending::<()>().await
    }

    /// Spawns the sleeper holding our stdio, in our process group, as a stray descendant would.
    async fn grandchild(&self) {
        let spawned = std::env::current_exe().and_then(|exe| {
            tokio::process::Command::new(exe)
                .args(["agent", "sleeper"])
                .stdin(Stdio::inherit())
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit())
                .spawn()
        });
        let line = match spawned {
            Ok(mut child) => {
                let pid = child.id().unwrap_or_default();
                // Reap it if it ever dies, so it does not linger as a zombie of ours.
                tokio::spawn(async move {
                    let _ = child.wait().await;
                });
                format!("grandchild {pid}\n")
            }
            Err(e) => format!("grandchild error: {e}\n"),
        };
        self.text(&line).await
    }

    /// A descendant that leaves the process group (as daemonising helpers do) and is not
    /// waited for here: once this agent is gone it is acpd's to reap.
    async fn escapee(&self, ms: u64) {
        use std::os::unix::process::CommandExt as _;
        let spawned = std::env::current_exe().and_then(|exe| {
            std::process::Command::new(exe)
                .args(["agent", "sleeper", "--exit-after", &ms.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
        });
        let line = match spawned {
            Ok(child) => format!("escapee {}\n", child.id()),
            Err(e) => format!("escapee error: {e}\n"),
        };
        self.text(&line).await
    }

    async fn permission(&self) {
        let params = json!({
            "sessionId": self.session_id,
            "toolCall": {"toolCallId": "perm-1", "title": "scripted permission"},
            "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            ],
        });
        self.ask_permission(params).await
    }

    /// Asks `session/request_permission` with `params` and streams what came back.
    async fn ask_permission(&self, params: serde_json::Value) {
        let answer = self
            .agent
            .peer
            .request("session/request_permission", &params)
            .await;
        let line = match answer {
            Ok(result) => {
                let result: serde_json::Value =
                    serde_json::from_str(result.get()).unwrap_or_default();
                let outcome = &result["outcome"];
                match (outcome["outcome"].as_str(), outcome["optionId"].as_str()) {
                    (Some("selected"), Some(option)) => format!("permission: selected {option}\n"),
                    (Some("cancelled"), _) => "permission: cancelled\n".to_string(),
                    _ => format!("permission: error invalid answer {result}\n"),
                }
            }
            Err(CallError::Rpc(e)) => format!("permission: error {}\n", e.code),
            Err(CallError::Closed) => "permission: error closed\n".to_string(),
        };
        self.text(&line).await
    }

    async fn read(&self, path: &str) {
        let params = json!({"sessionId": self.session_id, "path": path});
        let answer = self.agent.peer.request("fs/read_text_file", &params).await;
        let line = match answer {
            Ok(result) => {
                let result: serde_json::Value =
                    serde_json::from_str(result.get()).unwrap_or_default();
                match result["content"].as_str() {
                    Some(content) => format!("read: {content}\n"),
                    None => format!("read error: invalid answer {result}\n"),
                }
            }
            Err(CallError::Rpc(e)) => format!("read error: {}\n", e.code),
            Err(CallError::Closed) => "read error: closed\n".to_string(),
        };
        self.text(&line).await
    }
}

/// Writes `line` and a newline to stderr `count` times, blocking as a real agent's `eprintln!`
/// does (a reader that falls behind stalls this turn, which is what acpd must not suffer from).
fn write_stderr(line: &[u8], count: u64) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    for _ in 0..count {
        if err
            .write_all(line)
            .and_then(|()| err.write_all(b"\n"))
            .is_err()
        {
            return;
        }
    }
}
