//! One turn: `session/prompt` to the child, its updates and requests while it runs, and every
//! way the turn can end — an answer, an RPC error, a crash (raced against the prompt, since a
//! grandchild may hold the pipe open), a bad line, the idle and run limits, or a cancel that the
//! child confirms within `cancel_grace` or not.

use std::collections::HashSet;
use std::time::Duration;

use acpd_protocol::acp::{
    CancelNotification, ContentBlock, PromptRequest, RequestPermissionRequest,
    RequestPermissionResponse,
};
use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::outcome::{ChildStopReason, TurnEnd};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::AcpChild;
use super::output::Output;
use super::permission::{self, Decision};
use crate::config::PermissionPolicy;
use crate::registry::RunEvent;
use crate::supervise;
use crate::wire::{CallError, Incoming};

/// A permission request for whoever can answer it (a user on a terminal, a parent over ACP).
pub struct PermissionAsk {
    pub request: RequestPermissionRequest,
    pub reply: oneshot::Sender<RequestPermissionResponse>,
}

/// How the owner steers a turn.
pub struct TurnControl {
    /// Parent cancel, dispose or Ctrl-C.
    pub cancel: CancellationToken,
    pub run_timeout: Option<Duration>,
    pub max_output: usize,
    /// Receives output text as it streams (bounded: a slow reader slows the child).
    pub sink: Option<mpsc::Sender<String>>,
    /// The owner's event channel; without it `permission = "forward"` has nobody to ask.
    pub tap: Option<Tap>,
}

/// Where a turn sends raw updates and permission requests.
#[derive(Clone)]
pub struct Tap {
    pub run_id: String,
    pub tx: mpsc::Sender<RunEvent>,
    /// Send every `session/update` `update` object.
    pub updates: bool,
    /// Send permission requests (policy `forward`).
    pub asks: bool,
}

/// What happened in a turn, before mapping to a result.
#[derive(Debug)]
pub struct TurnReport {
    pub end: TurnEnd,
    pub cancel_requested: bool,
    /// The stop reason the child gave, when it gave one.
    pub child_stop_reason: Option<String>,
    pub output: Vec<ContentBlock>,
    pub output_truncated: bool,
    pub notes: Vec<&'static str>,
    /// The child cannot take another turn (it died, hung, timed out or broke the protocol).
    pub child_spent: bool,
}

const NOTE_NOBODY_TO_ASK: &str = "permission: forwarded request rejected (nobody to ask)";
/// After the child exits, how long its last reply may still take to come out of the pipe.
const LAST_WORDS: Duration = Duration::from_millis(200);

#[derive(Deserialize)]
struct UpdateParams<'a> {
    #[serde(borrow)]
    update: &'a RawValue,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateHead<'a> {
    session_update: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptReply {
    stop_reason: String,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Value>,
}

impl AcpChild {
    /// Runs one turn to its end. Never fails: every outcome is a [`TurnReport`].
    pub async fn turn(&mut self, prompt: Vec<ContentBlock>, ctl: TurnControl) -> TurnReport {
        let mut t = Turn {
            output: Output::new(ctl.max_output),
            cancel_requested: false,
            notes: Vec::new(),
            asks: JoinSet::new(),
            pending_asks: HashSet::new(),
        };
        let end = self.drive(prompt, &ctl, &mut t).await;
        // Whatever is still waiting for an answer gets `cancelled`: the turn is over.
        for id in t.pending_asks.drain() {
            self.answer(&id, &permission::cancelled()).await;
        }
        t.asks.abort_all();
        let (end, child_stop_reason) = end;
        let child_spent = !matches!(end, TurnEnd::Stopped { .. } | TurnEnd::RpcError { .. });
        let (output, output_truncated) = t.output.finish();
        TurnReport {
            end,
            cancel_requested: t.cancel_requested,
            child_stop_reason,
            output,
            output_truncated,
            notes: t.notes,
            child_spent,
        }
    }

    async fn drive(
        &mut self,
        prompt: Vec<ContentBlock>,
        ctl: &TurnControl,
        t: &mut Turn,
    ) -> (TurnEnd, Option<String>) {
        let request = PromptRequest::new(self.session_id.clone(), prompt);
        let call = match self.peer.call("session/prompt", &request).await {
            Ok(call) => call,
            Err(_) => return (self.process_exit().await, None),
        };
        let reply = call.result();
        tokio::pin!(reply);
        let idle = self.provider.idle_timeout;
        let mut idle_deadline = idle.map(|d| Instant::now() + d);
        let run_deadline = ctl.run_timeout.map(|d| Instant::now() + d);
        // Set when acpd itself ends the turn (timeout, hung): the child is cancelled and then
        // torn down, and this is the outcome whatever it answers.
        let mut ending: Option<TurnEnd> = None;
        let mut cancel_deadline: Option<Instant> = None;
        loop {
            let idle_armed =
                ending.is_none() && cancel_deadline.is_none() && t.pending_asks.is_empty();
            tokio::select! {
                biased;
                r = &mut reply => {
                    // Everything the child sent before its answer is already queued.
                    self.drain_queued(ctl, t).await;
                    return match r {
                        Ok(raw) => self.stopped(&raw, ending),
                        Err(CallError::Rpc(e)) => (ending.unwrap_or(TurnEnd::RpcError { code: e.code }), None),
                        Err(CallError::Closed) => (self.ended_or_exit(ending).await, None),
                    };
                }
                status = self.tree.exited() => {
                    let last = tokio::time::timeout(LAST_WORDS, &mut reply).await;
                    self.drain_queued(ctl, t).await;
                    return match last {
                        Ok(Ok(raw)) => self.stopped(&raw, ending),
                        Ok(Err(CallError::Rpc(e))) => (ending.unwrap_or(TurnEnd::RpcError { code: e.code }), None),
                        _ => (ending.unwrap_or(TurnEnd::ProcessExit {
                            exit_code: status.code(),
                            signal: supervise::signal_name(&status),
                        }), None),
                    };
                }
                msg = self.incoming.recv(), if self.incoming_open => {
                    if let Some(d) = idle {
                        idle_deadline = Some(Instant::now() + d);
                    }
                    match msg {
                        None => self.incoming_open = false,
                        Some(Incoming::Fault(fault)) => {
                            tracing::warn!(provider = %self.provider.name, run = %self.run_id, "child sent a bad line: {fault}");
                            return (ending.unwrap_or(TurnEnd::Protocol), None);
                        }
                        Some(Incoming::Notification { method, params }) => {
                            if method == "session/update" {
                                self.on_update(params.as_deref(), ctl, t).await;
                            }
                        }
                        Some(Incoming::Request { id, method, params }) => {
                            self.on_request(id, &method, params.as_deref(), ctl, t).await;
                        }
                    }
                }
                Some(joined) = t.asks.join_next(), if !t.asks.is_empty() => {
                    if let Ok((id, response)) = joined
                        && t.pending_asks.remove(&id)
                    {
                        self.answer(&id, &response).await;
                    }
                    // Waiting on a person is not the child hanging: the idle clock restarts.
                    if t.pending_asks.is_empty() {
                        idle_deadline = idle.map(|d| Instant::now() + d);
                    }
                }
                _ = sleep_until_opt(idle_deadline), if idle_armed => {
                    ending = Some(TurnEnd::Idle);
                    cancel_deadline = Some(self.send_cancel(t).await);
                }
                _ = sleep_until_opt(run_deadline), if ending.is_none() && cancel_deadline.is_none() => {
                    ending = Some(TurnEnd::RunTimeout);
                    cancel_deadline = Some(self.send_cancel(t).await);
                }
                _ = ctl.cancel.cancelled(), if !t.cancel_requested && ending.is_none() => {
                    t.cancel_requested = true;
                    if cancel_deadline.is_none() {
                        cancel_deadline = Some(self.send_cancel(t).await);
                    }
                }
                _ = sleep_until_opt(cancel_deadline), if cancel_deadline.is_some() => {
                    return (ending.unwrap_or(TurnEnd::Abandoned), None);
                }
            }
        }
    }

    /// Handles messages already queued when the turn's answer arrived, so output sent before
    /// the answer is never lost to the race between the queue and the reply.
    async fn drain_queued(&mut self, ctl: &TurnControl, t: &mut Turn) {
        while let Ok(msg) = self.incoming.try_recv() {
            match msg {
                Incoming::Notification { method, params } if method == "session/update" => {
                    self.on_update(params.as_deref(), ctl, t).await;
                }
                Incoming::Request { id, method, .. } => self.refuse(&id, &method).await,
                _ => {}
            }
        }
    }

    /// Sends `session/cancel`, answers pending permission requests `cancelled`, and returns
    /// how long the child has to confirm.
    async fn send_cancel(&mut self, t: &mut Turn) -> Instant {
        let note = CancelNotification::new(self.session_id.clone());
        let _ = self.peer.notify("session/cancel", &note).await;
        t.asks.abort_all();
        for id in t.pending_asks.drain().collect::<Vec<_>>() {
            self.answer(&id, &permission::cancelled()).await;
        }
        Instant::now() + self.provider.cancel_grace
    }

    fn stopped(&self, raw: &RawValue, ending: Option<TurnEnd>) -> (TurnEnd, Option<String>) {
        let reply: PromptReply = match serde_json::from_str(raw.get()) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(provider = %self.provider.name, run = %self.run_id, "bad session/prompt result: {e}");
                return (ending.unwrap_or(TurnEnd::Protocol), None);
            }
        };
        let reported_failure = reply
            .meta
            .as_ref()
            .and_then(|m| m.pointer("/acpd/failure/category"))
            .and_then(|c| c.as_str())
            .map(str::to_string);
        let end = ending.unwrap_or(TurnEnd::Stopped {
            reason: ChildStopReason::parse(&reply.stop_reason),
            reported_failure,
        });
        (end, Some(reply.stop_reason))
    }

    async fn ended_or_exit(&self, ending: Option<TurnEnd>) -> TurnEnd {
        match ending {
            Some(end) => end,
            None => self.process_exit().await,
        }
    }

    async fn process_exit(&self) -> TurnEnd {
        let status = self.exit_status_soon().await;
        TurnEnd::ProcessExit {
            exit_code: status.and_then(|s| s.code()),
            signal: status.as_ref().and_then(supervise::signal_name),
        }
    }

    async fn on_update(&mut self, params: Option<&RawValue>, ctl: &TurnControl, t: &mut Turn) {
        let Some(params) = params else { return };
        let Ok(UpdateParams { update }) = serde_json::from_str::<UpdateParams<'_>>(params.get())
        else {
            tracing::debug!(run = %self.run_id, "ignoring a malformed session/update");
            return;
        };
        if let Some(tap) = ctl.tap.as_ref().filter(|t| t.updates) {
            let event = RunEvent::Update {
                run_id: tap.run_id.clone(),
                update: update.to_owned(),
            };
            let _ = tap.tx.send(event).await;
        }
        let Ok(head) = serde_json::from_str::<UpdateHead<'_>>(update.get()) else {
            return;
        };
        if head.session_update != "agent_message_chunk" {
            return;
        }
        let Some(content) = head.content else { return };
        match serde_json::from_str::<ContentBlock>(content.get()) {
            Ok(ContentBlock::Text(text)) => {
                let kept = t.output.push_text(&text.text);
                if let Some(sink) = &ctl.sink
                    && !kept.is_empty()
                {
                    let _ = sink.send(kept.to_string()).await;
                }
            }
            Ok(block) => t.output.push_block(block),
            Err(e) => {
                tracing::debug!(run = %self.run_id, "ignoring an unreadable content block: {e}")
            }
        }
    }

    async fn on_request(
        &mut self,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        ctl: &TurnControl,
        t: &mut Turn,
    ) {
        if method != "session/request_permission" {
            // fs/* and terminal/* need a parent that serves them; a delegated run has none.
            self.refuse(&id, method).await;
            return;
        }
        let request: RequestPermissionRequest = match params.map(|p| serde_json::from_str(p.get()))
        {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                let _ = self
                    .peer
                    .respond_err(Some(&id), &RpcError::invalid_params(e))
                    .await;
                return;
            }
            None => {
                let _ = self
                    .peer
                    .respond_err(Some(&id), &RpcError::invalid_params("missing params"))
                    .await;
                return;
            }
        };
        if t.cancel_requested {
            self.answer(&id, &permission::cancelled()).await;
            return;
        }
        let decision = match self.provider.permission {
            PermissionPolicy::Allow => Decision::Allow,
            PermissionPolicy::Reject => Decision::Reject,
            PermissionPolicy::Forward => match ctl.tap.as_ref().filter(|t| t.asks) {
                Some(tap) => {
                    let (tx, rx) = oneshot::channel();
                    let fallback = permission::decide(&request, Decision::Reject);
                    let event = RunEvent::Ask {
                        run_id: tap.run_id.clone(),
                        ask: Box::new(PermissionAsk { request, reply: tx }),
                    };
                    if tap.tx.send(event).await.is_ok() {
                        t.pending_asks.insert(id.clone());
                        t.asks
                            .spawn(async move { (id, rx.await.unwrap_or(fallback)) });
                        return;
                    }
                    push_note(t, NOTE_NOBODY_TO_ASK);
                    self.answer(&id, &fallback).await;
                    return;
                }
                None => {
                    push_note(t, NOTE_NOBODY_TO_ASK);
                    Decision::Reject
                }
            },
        };
        self.answer(&id, &permission::decide(&request, decision))
            .await;
    }

    async fn answer(&self, id: &Id, response: &RequestPermissionResponse) {
        let _ = self.peer.respond_ok(id, response).await;
    }
}

fn push_note(t: &mut Turn, note: &'static str) {
    if !t.notes.contains(&note) {
        t.notes.push(note);
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

struct Turn {
    output: Output,
    cancel_requested: bool,
    notes: Vec<&'static str>,
    asks: JoinSet<(Id, RequestPermissionResponse)>,
    pending_asks: HashSet<Id>,
}
