//! Collect mode: one turn of a run — `session/prompt`, the child's updates and requests while
//! it runs, and every way the turn can end: an answer, an RPC error, a crash (raced against the
//! prompt, since a grandchild may hold the pipe open), a bad line (also just before the
//! answer), a child that stops reading, the idle and run limits, or a cancel that the child
//! confirms within `cancel_grace` or not.
//!
//! `end_turn` is not always success: a typed failure record in the answer's `_meta` (acpd's
//! own, or AIR's `sessionFailure` when the agent negotiated it) makes the turn an `error` with
//! the record's category. And a quiet child is not always hung: while a permission request
//! waits on someone or a tool call the child reported is still pending or in progress, the
//! idle clock does not run (a long build or test run says nothing until it ends).

use std::collections::HashSet;

use acpd_protocol::acp::{CancelNotification, ContentBlock, PromptRequest};
use acpd_protocol::envelope::{self, Id, Message, RpcError};
use acpd_protocol::outcome::{self, ChildStopReason, TurnEnd, air};
use acpd_protocol::permission::{self, Decision, PolicyAnswer};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::driver::{Driver, LAST_WORDS};
use super::tool_guard::{self, ToolGuard};
use super::turn_output::Output;
use super::{ChildEvent, PermissionAsk, TurnControl, TurnReport, strict};
use crate::supervise;
use crate::wire::sleep_until_opt;

/// Permission requests of one turn waiting on whoever answers them, at most.
const MAX_ASKS: usize = 64;

/// Tool calls of one turn tracked as running, at most (memory only: one open call already
/// holds the idle clock; the run's `run_timeout` still bounds the turn).
const MAX_OPEN_TOOLS: usize = 1024;

const NOTE_NOBODY_TO_ASK: &str = "permission: forwarded request rejected (nobody to ask)";
const NOTE_POLICY_REJECTED: &str = "permission: request rejected by policy (permission = reject)";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateHead<'a> {
    session_update: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    /// `tool_call` and `tool_call_update`.
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    /// `usage_update`: the tokens in context, as written ([`tokens`] reads it).
    #[serde(borrow, default)]
    used: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptReply<'a> {
    stop_reason: String,
    #[serde(default, rename = "_meta")]
    meta: Option<serde_json::Value>,
    /// The turn's token usage, when the agent reports it (read leniently: a malformed one is
    /// no usage, never a protocol fault). Kept as text, so a number beyond `f64` (`1e400`)
    /// is a huge count, not a line serde refuses.
    #[serde(borrow, default)]
    usage: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Usage<'a> {
    #[serde(borrow, default)]
    total_tokens: Option<&'a RawValue>,
}

/// A count of tokens an agent reported (`usage_update.used`, `usage.totalTokens`): any JSON
/// number that is not negative. ACP types them as integers, but JSON has one number type and
/// an agent written in JavaScript or Python may well send `1200.0` or `1.2e3`: an integral
/// one counts as it is, a fractional one rounds up (a budget counts at least what was said),
/// one beyond `u64` (or `f64`) is `u64::MAX` (the budget is spent: the agent said so). A
/// negative number or anything not a number is refused, naming what it was: the caller
/// ignores it, as it would no report at all.
fn tokens(raw: &RawValue) -> Result<u64, &'static str> {
    let text = raw.get();
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Err("not a number");
    }
    // The text is a JSON number (serde checked the line), which Rust's float syntax includes;
    // a magnitude beyond f64 parses as infinity.
    match text.parse::<f64>() {
        Ok(f) if f.is_sign_negative() && f != 0.0 => Err("negative"),
        // `as` saturates: infinity and anything past u64::MAX become u64::MAX.
        Ok(f) => Ok(f.ceil() as u64),
        Err(_) => Err("not a number"),
    }
}

type Asked = FuturesUnordered<
    std::pin::Pin<
        Box<dyn Future<Output = (Id, acpd_protocol::acp::RequestPermissionResponse)> + Send + Sync>,
    >,
>;

struct Turn {
    output: Output,
    cancel_requested: bool,
    notes: Vec<&'static str>,
    /// Permission requests waiting on whoever answers them, by the child's request id.
    asks: Asked,
    pending_asks: HashSet<Id>,
    /// Tool calls the child reported as pending or in progress and not yet as ended.
    open_tools: HashSet<String>,
    /// Tokens of this turn charged to the run's budget so far.
    charged: u64,
    /// Set once a count the agent reported was not one (warned about once per turn).
    bad_count_told: bool,
    /// The run's tool filter, held from the outside.
    guard: Option<ToolGuard>,
    /// Set when a filtered tool ran: the turn ends `tool-filter`.
    filter_broken: bool,
}

impl Turn {
    /// Charges a count the agent reported in `field`; one that is not a count ([`tokens`]) is
    /// ignored, and named in one warning per turn (an agent may send thousands).
    fn count(&mut self, d: &Driver, ctl: &TurnControl, field: &str, raw: &RawValue) {
        match tokens(raw) {
            Ok(n) => self.spent_at_least(ctl, n),
            Err(why) if !self.bad_count_told => {
                self.bad_count_told = true;
                let shown: String = raw.get().chars().take(64).collect();
                tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
                    "ignoring the agent's {field} {shown}: {why}, not a count of tokens (the \
                     budget counts what it reports as a non-negative number)");
            }
            Err(_) => {}
        }
    }

    /// Raises what this turn has spent to `tokens` (never lowers it), charging the difference.
    fn spent_at_least(&mut self, ctl: &TurnControl, tokens: u64) {
        if let Some(meter) = &ctl.budget
            && tokens > self.charged
        {
            meter.charge(tokens - self.charged);
            self.charged = tokens;
        }
    }
}

/// Resolves once the run's budget is spent; never without one.
async fn budget_spent(ctl: &TurnControl) {
    match &ctl.budget {
        Some(meter) => meter.spent().cancelled().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn turn(
    d: &mut Driver,
    prompt: Vec<ContentBlock>,
    ctl: TurnControl,
) -> TurnReport {
    let mut t = Turn {
        output: Output::new(ctl.max_output),
        cancel_requested: false,
        notes: Vec::new(),
        asks: FuturesUnordered::new(),
        pending_asks: HashSet::new(),
        open_tools: HashSet::new(),
        charged: 0,
        bad_count_told: false,
        guard: ctl.tool_filter.clone().map(ToolGuard::new),
        filter_broken: false,
    };
    let (end, child_stop_reason) = drive(d, prompt, &ctl, &mut t).await;
    // Whatever is still waiting for an answer gets `cancelled`: the turn is over.
    for id in t.pending_asks.drain().collect::<Vec<_>>() {
        let _ = d.wire.respond_ok(&id, &permission::cancelled()).await;
    }
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
    d: &mut Driver,
    prompt: Vec<ContentBlock>,
    ctl: &TurnControl,
    t: &mut Turn,
) -> (TurnEnd, Option<String>) {
    if ctl.cancel.is_cancelled() {
        // Cancelled (a dispose) before the prompt went out: the child never sees it.
        t.cancel_requested = true;
        return (TurnEnd::Abandoned, None);
    }
    if ctl
        .budget
        .as_ref()
        .is_some_and(|m| m.spent().is_cancelled())
    {
        // Spent before the prompt went out (between turns, or by a run above it).
        return (TurnEnd::Budget, None);
    }
    // A run's turn continues the run's trace, when spans are exported.
    let request =
        PromptRequest::new(d.shared.session_id.clone(), prompt).meta(d.shared.span_meta());
    let prompt_id = match d
        .wire
        .request("session/prompt", Some(&envelope::to_raw(&request)))
        .await
    {
        Ok(id) => id,
        Err(_) => return (process_exit(d, None).await, None),
    };
    let idle = d.shared.provider.idle_timeout;
    let mut idle_deadline = idle.map(crate::config::durations::deadline);
    let run_deadline = ctl.run_timeout.map(crate::config::durations::deadline);
    // Set when acpd itself ends the turn (timeout, hung): the child is cancelled and then torn
    // down, and this is the outcome whatever it answers.
    let mut ending: Option<TurnEnd> = None;
    let mut cancel_deadline: Option<Instant> = None;
    let mut exited: Option<(std::process::ExitStatus, Instant)> = None;
    let deaf = d.wire.out.broken();
    loop {
        let idle_armed = ending.is_none()
            && cancel_deadline.is_none()
            && t.pending_asks.is_empty()
            && t.open_tools.is_empty();
        let last_words = exited.map(|(_, at)| at);
        tokio::select! {
            biased;
            frame = d.wire.reader.next() => {
                if let Some(i) = idle {
                    idle_deadline = Some(crate::config::durations::deadline(i));
                }
                match frame {
                    None => {
                        let status = match exited {
                            Some((s, _)) => Some(s),
                            None => d.exit_status_soon().await,
                        };
                        return (ending.unwrap_or(exit_end(d, status)), None);
                    }
                    Some(Err(fault)) => {
                        tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
                            "child sent a bad line: {fault}");
                        return (ending.unwrap_or(TurnEnd::Protocol), None);
                    }
                    Some(Ok(Message::Response { id, outcome })) if id.as_ref() == Some(&prompt_id) => {
                        return match outcome {
                            Ok(raw) => stopped(d, &raw, ending, ctl, t),
                            Err(e) => (ending.unwrap_or(TurnEnd::RpcError { code: e.code }), None),
                        };
                    }
                    Some(Ok(Message::Response { id, .. })) => {
                        // acpd asked nothing else: an answer to no call of ours (or to ours
                        // under a rewritten id, such as `7.0`) is the child not speaking JSON-RPC.
                        tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
                            ?id, "child answered a call acpd never made");
                        return (ending.unwrap_or(TurnEnd::Protocol), None);
                    }
                    Some(Ok(Message::Notification { method, params })) => {
                        on_notification(d, &method, params.as_deref(), ctl, t).await;
                        if t.filter_broken && !matches!(ending, Some(TurnEnd::ToolFilter)) {
                            // A forbidden tool ran: whatever else was ending the turn, this is
                            // the outcome, and the child is cancelled, then torn down.
                            ending = Some(TurnEnd::ToolFilter);
                            if cancel_deadline.is_none() {
                                cancel_deadline = Some(send_cancel(d, t).await);
                            }
                        }
                    }
                    Some(Ok(Message::Request { id, method, params })) => {
                        on_request(d, id, &method, params.as_deref(), ctl, t).await;
                    }
                }
            }
            status = d.shared.tree.exited(), if exited.is_none() => {
                exited = Some((status, Instant::now() + LAST_WORDS));
            }
            _ = sleep_until_opt(last_words) => {
                return (ending.unwrap_or(exit_end(d, exited.map(|(s, _)| s))), None);
            }
            _ = deaf.cancelled(), if exited.is_none() => {
                // The child stopped taking our bytes for write_timeout, or its stdin broke.
                let status = d.exit_status_soon().await;
                let end = match status {
                    Some(s) => exit_end(d, Some(s)),
                    None => TurnEnd::Idle,
                };
                return (ending.unwrap_or(end), None);
            }
            Some((id, response)) = t.asks.next(), if !t.asks.is_empty() => {
                if t.pending_asks.remove(&id) {
                    let _ = d.wire.respond_ok(&id, &response).await;
                }
                // Waiting on a person is not the child hanging: the idle clock restarts.
                if t.pending_asks.is_empty() {
                    idle_deadline = idle.map(crate::config::durations::deadline);
                }
            }
            _ = sleep_until_opt(idle_deadline), if idle_armed => {
                ending = Some(TurnEnd::Idle);
                cancel_deadline = Some(send_cancel(d, t).await);
            }
            _ = sleep_until_opt(run_deadline), if ending.is_none() && cancel_deadline.is_none() => {
                ending = Some(TurnEnd::RunTimeout);
                cancel_deadline = Some(send_cancel(d, t).await);
            }
            _ = budget_spent(ctl), if ending.is_none() && cancel_deadline.is_none() => {
                ending = Some(TurnEnd::Budget);
                cancel_deadline = Some(send_cancel(d, t).await);
            }
            _ = ctl.cancel.cancelled(), if !t.cancel_requested && ending.is_none() => {
                t.cancel_requested = true;
                if cancel_deadline.is_none() {
                    cancel_deadline = Some(send_cancel(d, t).await);
                }
            }
            _ = sleep_until_opt(cancel_deadline), if cancel_deadline.is_some() => {
                return (ending.unwrap_or(TurnEnd::Abandoned), None);
            }
        }
    }
}

/// The process exited: `oom` / `pids` when its cgroup says a limit was hit.
fn exit_end(d: &Driver, status: Option<std::process::ExitStatus>) -> TurnEnd {
    TurnEnd::ProcessExit {
        exit_code: status.and_then(|s| s.code()),
        signal: status.as_ref().and_then(supervise::signal_name),
    }
    .with_limit(d.shared.tree.limit_hit())
}

async fn process_exit(d: &Driver, ending: Option<TurnEnd>) -> TurnEnd {
    match ending {
        Some(end) => end,
        None => {
            let status = d.exit_status_soon().await;
            exit_end(d, status)
        }
    }
}

/// Sends `session/cancel`, answers pending permission requests `cancelled`, and returns how
/// long the child has to confirm.
async fn send_cancel(d: &mut Driver, t: &mut Turn) -> Instant {
    let note = CancelNotification::new(d.shared.session_id.clone());
    let _ = d
        .wire
        .notify("session/cancel", &envelope::to_raw(&note))
        .await;
    t.asks = FuturesUnordered::new();
    for id in t.pending_asks.drain().collect::<Vec<_>>() {
        let _ = d.wire.respond_ok(&id, &permission::cancelled()).await;
    }
    crate::config::durations::deadline(d.shared.provider.cancel_grace)
}

fn stopped(
    d: &Driver,
    raw: &RawValue,
    ending: Option<TurnEnd>,
    ctl: &TurnControl,
    t: &mut Turn,
) -> (TurnEnd, Option<String>) {
    let reply: PromptReply = match serde_json::from_str(raw.get()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
                "bad session/prompt result: {e}");
            return (ending.unwrap_or(TurnEnd::Protocol), None);
        }
    };
    let total = reply
        .usage
        .and_then(|u| serde_json::from_str::<Usage<'_>>(u.get()).ok())
        .and_then(|u| u.total_tokens);
    if let Some(total) = total {
        t.count(d, ctl, "usage.totalTokens", total);
    }
    // A turn whose own final count spent the budget ends `budget` too.
    let ending = ending.or_else(|| {
        ctl.budget
            .as_ref()
            .filter(|m| m.spent().is_cancelled())
            .map(|_| TurnEnd::Budget)
    });
    let air = air::agent_supports(&d.shared.agent.meta);
    let reported_failure = reply
        .meta
        .as_ref()
        .and_then(|m| outcome::reported_failure(m, air));
    let end = ending.unwrap_or(TurnEnd::Stopped {
        reason: ChildStopReason::parse(&reply.stop_reason),
        reported_failure,
    });
    (end, Some(reply.stop_reason))
}

async fn on_notification(
    d: &mut Driver,
    method: &str,
    params: Option<&RawValue>,
    ctl: &TurnControl,
    t: &mut Turn,
) {
    if method != "session/update" {
        tracing::debug!(run = %d.shared.log_id, %method, "dropping a child notification in a run");
        return;
    }
    let update = match strict::own_update(params, &d.shared.session_id) {
        Ok(u) => u,
        Err(why) => {
            tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
                "dropping a session/update: {why}");
            return;
        }
    };
    if let Some(events) = ctl.events.as_ref().filter(|_| ctl.updates) {
        let _ = events.send(ChildEvent::Update(update.to_owned())).await;
    }
    let Ok(head) = serde_json::from_str::<UpdateHead<'_>>(update.get()) else {
        return;
    };
    if head.session_update == "usage_update" {
        if let Some(used) = head.used {
            t.count(d, ctl, "usage_update.used", used);
        }
        return;
    }
    if matches!(&*head.session_update, "tool_call" | "tool_call_update") {
        track_tool(&mut t.open_tools, &head);
        if let Some(guard) = t.guard.as_mut()
            && guard.ran(update)
            && !t.filter_broken
        {
            tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
                "a tool the run's filter forbids ran; ending the turn");
            t.filter_broken = true;
            t.notes.push(tool_guard::NOTE_RAN);
        }
        return;
    }
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
            tracing::debug!(run = %d.shared.log_id, "ignoring an unreadable content block: {e}")
        }
    }
}

/// Follows a tool call's status: `pending` or `in_progress` (a new `tool_call` without one is
/// `pending`, as ACP defaults it) holds the idle clock; `completed`, `failed` or any other
/// status releases it. An update that names no status changes nothing.
fn track_tool(open: &mut HashSet<String>, head: &UpdateHead<'_>) {
    let Some(id) = head.tool_call_id.as_deref() else {
        return;
    };
    let status = match (head.status.as_deref(), &*head.session_update) {
        (Some(s), _) => s,
        (None, "tool_call") => "pending",
        (None, _) => return,
    };
    if matches!(status, "pending" | "in_progress") {
        if open.len() < MAX_OPEN_TOOLS {
            open.insert(id.to_string());
        }
    } else {
        open.remove(id);
    }
}

async fn on_request(
    d: &mut Driver,
    id: Id,
    method: &str,
    params: Option<&RawValue>,
    ctl: &TurnControl,
    t: &mut Turn,
) {
    if method != "session/request_permission" {
        // fs/* and terminal/* need a parent that serves them; a delegated run has none.
        let _ = d
            .wire
            .respond(&id, Err(&RpcError::method_not_found(method)))
            .await;
        return;
    }
    if let Some(why) = params.and_then(strict::doubled) {
        tracing::warn!(provider = %d.shared.provider.name, run = %d.shared.log_id,
            "refusing a permission request: {why}");
        let e = RpcError::invalid_request(format!("{why} in the params; send it once"));
        let _ = d.wire.respond(&id, Err(&e)).await;
        return;
    }
    if let Some(guard) = t.guard.as_mut()
        && guard.refuses(params)
        && let Ok(request) = permission::parse_request(params)
    {
        // Nobody is asked: the filter already said no.
        if !t.notes.contains(&tool_guard::NOTE_REFUSED) {
            t.notes.push(tool_guard::NOTE_REFUSED);
        }
        let answer = permission::decide(&request, Decision::Reject);
        let _ = d.wire.respond_ok(&id, &answer).await;
        return;
    }
    let request = match permission::answer_by_policy(d.shared.provider.permission, params) {
        PolicyAnswer::InvalidParams(why) => {
            let _ = d
                .wire
                .respond(&id, Err(&RpcError::invalid_params(why)))
                .await;
            return;
        }
        _ if t.cancel_requested => {
            let _ = d.wire.respond_ok(&id, &permission::cancelled()).await;
            return;
        }
        PolicyAnswer::Answer(answer) => {
            // A rejection the caller never saw is named in the result, not left to guess.
            if d.shared.provider.permission == permission::Policy::Reject
                && !t.notes.contains(&NOTE_POLICY_REJECTED)
            {
                t.notes.push(NOTE_POLICY_REJECTED);
            }
            let _ = d.wire.respond_ok(&id, &answer).await;
            return;
        }
        // acpd's own asker reads the options (those of kinds it does not know left out).
        PolicyAnswer::Forward => match permission::parse_request(params) {
            Ok(request) => request,
            Err(why) => {
                let e = RpcError::invalid_params(why);
                let _ = d.wire.respond(&id, Err(&e)).await;
                return;
            }
        },
    };
    let fallback = permission::decide(&request, Decision::Reject);
    // A child that floods permission requests gets the fallback beyond this many waiting.
    let room = t.pending_asks.len() < MAX_ASKS;
    if let Some(events) = ctl.events.as_ref().filter(|_| ctl.asks && room) {
        let (tx, rx) = oneshot::channel();
        let ask = PermissionAsk { request, reply: tx };
        if events.send(ChildEvent::Ask(Box::new(ask))).await.is_ok() {
            t.pending_asks.insert(id.clone());
            t.asks
                .push(Box::pin(async move { (id, rx.await.unwrap_or(fallback)) }));
            return;
        }
    }
    if !t.notes.contains(&NOTE_NOBODY_TO_ASK) {
        t.notes.push(NOTE_NOBODY_TO_ASK);
    }
    let _ = d.wire.respond_ok(&id, &fallback).await;
}
