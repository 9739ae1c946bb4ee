//! Relay mode: a bridge session. Every message travels between the parent's connection and
//! the child in the order the child wrote it; only session ids and request ids are remapped.
//! Updates are forwarded raw (kinds nobody here knows arrive intact), the common shape spliced
//! as text with no JSON work beyond the envelope parse. A child's request reaches the parent
//! only if the parent serves it (`fs/*`, `terminal/*` as advertised, `_` extensions) and its
//! permission requests go by the provider's policy.
//!
//! A session can outlive its parent's connection (`detach`): the relay then keeps reading
//! the child, holds its permission requests, and waits to be attached to another connection,
//! which is asked them again. A child's own subagent sessions reach a parent that opted in
//! under ids acpd mints (`<session id>.<n>`), and calls on them are routed back.

mod detach;
mod end;
mod from_child;
mod from_parent;
mod ids;
mod shape;

use std::collections::HashMap;

use acpd_protocol::diagnostic;
use acpd_protocol::envelope::{
    self, INTERNAL_ERROR, Id, MessageRef, ParamsKeys, RawJson, RpcError,
};
use acpd_protocol::outcome::{self, ChildStopReason, TurnEnd, air};
use acpd_protocol::permission::{self, PolicyAnswer};
use acpd_protocol::session_id::{splice_session_id, with_session_id};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::json;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::driver::{ChildOutput, Driver, LAST_WORDS};
use super::queue::Queued;
use super::{Cmd, First, RelayEnd, RelayTarget, strict};
use crate::supervise;
use crate::trace::Hop;
use crate::wire::sleep_until_opt;
use crate::wire::{CallError, LineFault, LineReader};
use end::CANCELLED_HERE;

type Forwarded = FuturesUnordered<
    std::pin::Pin<
        Box<dyn Future<Output = (Id, bool, Result<Box<RawValue>, CallError>)> + Send + Sync>,
    >,
>;

/// ACP's request cancellation: `{"requestId": ID}` names a request of the sender's.
const CANCEL_REQUEST: &str = "$/cancel_request";

/// Messages already read that are handled in one round of the pump, beyond the first.
const BURST: usize = 63;
/// Bytes of gathered updates queued as one item at most: the parent's budget is claimed for
/// them before more of the burst is read. Below acpd's `mmap` threshold (32 KiB) with a line to
/// spare, so the batch buffers the parent's writer gives back stay on the heap and are reused.
const UPDATES_AT_ONCE: usize = 24 * 1024;
/// A batch buffer's room during a flood: the batch is queued once it holds `UPDATES_AT_ONCE`,
/// so the line that crosses that mark still fits (unless it is over 4 KiB) and the buffer is
/// never grown, which copied the whole batch and moved it to its own mapping.
const BATCH_CAPACITY: usize = UPDATES_AT_ONCE + 4 * 1024;

/// Child requests waiting on the parent at once; more are refused to the child.
const MAX_FORWARDED: usize = 64;

/// Room the child's outbox must have, beyond the parent's next command's own bytes, before that
/// command is handed to it.
const ROOM: usize = 64 * 1024;

struct Relay {
    t: RelayTarget,
    /// The child's own session id.
    own: String,
    /// The child's session id as a JSON string, as an update's params name it.
    own_json: String,
    /// The parent's session id as a JSON string, spliced in its place.
    minted_json: String,
    /// The child's capabilities: which optional methods it has.
    caps: serde_json::Value,
    /// Parent calls forwarded to the child, by the id acpd gave them: (parent's id, method).
    open: HashMap<Id, (Id, String)>,
    /// What to record once the agent answers one of those calls with a result.
    after_ok: HashMap<Id, crate::child::AfterOk>,
    /// The child id of the `session/load`/`session/resume` that opens the session.
    opening: Option<Id>,
    /// Child permission requests waiting on the parent, with the params it was asked with
    /// (answered `cancelled` on cancel; asked again after a re-attach).
    asks: HashMap<Id, Option<Box<RawValue>>>,
    /// Other child requests waiting on the parent.
    waiting: std::collections::HashSet<Id>,
    /// The id the parent knows each of those child requests by (for `$/cancel_request`).
    parent_ids: HashMap<Id, Id>,
    forwarded: Forwarded,
    /// The child's subagent sessions: its id → the id the parent knows, and back.
    subs: HashMap<String, String>,
    subs_back: HashMap<String, String>,
    /// Another connection's attach that arrived before this relay saw its own go.
    attach_next: Option<RelayTarget>,
    tracer: Option<std::sync::Arc<crate::trace::Trace>>,
    /// acpd's span of each call forwarded with trace context, ended by its answer.
    hops: HashMap<Id, crate::otel::Span>,
    /// The editor's prompts forwarded and not yet answered, by their child id: the turn
    /// histogram's one clock read per prompt (nothing per update).
    prompts: HashMap<Id, Prompt>,
    /// Own-session updates of the burst being read, not yet queued.
    updates: shape::UpdateBatch,
    /// The last own-session update that went the hot path, as the shape the next is held to
    /// (see [`Relay::own_update_like_the_last`]).
    last_update: Option<shape::UpdateShape>,
    /// Commands still to take before the parent's cancel that found the queue full is sent
    /// (see `Shared::late_cancel`).
    late: Option<usize>,
    /// The parent's next command, taken off the queue and waiting for room in the child's
    /// outbox: the pump goes on reading the child meanwhile, never blocked on a write.
    next: Option<Queued>,
}

/// A `session/prompt` on its way: when acpd forwarded it, and whether the editor asked to
/// cancel it since (a `cancelled` answer is then the editor's own, not the agent's).
struct Prompt {
    at: Instant,
    cancel_asked: bool,
}

pub(super) async fn run(d: &mut Driver, t: RelayTarget) -> RelayEnd {
    let own = d.shared.session_id.clone();
    let own_json = envelope::json_string(&own).into_owned();
    let mut r = Relay {
        minted_json: envelope::json_string(&t.session_id).into_owned(),
        t,
        own_json,
        own,
        caps: d.shared.agent.capabilities.clone(),
        open: HashMap::new(),
        after_ok: HashMap::new(),
        opening: None,
        asks: HashMap::new(),
        waiting: Default::default(),
        parent_ids: HashMap::new(),
        forwarded: FuturesUnordered::new(),
        subs: HashMap::new(),
        subs_back: HashMap::new(),
        attach_next: None,
        tracer: d.shared.trace.clone(),
        hops: HashMap::new(),
        prompts: HashMap::new(),
        updates: shape::UpdateBatch::default(),
        last_update: None,
        late: None,
        next: None,
    };
    if let Some(trace) = &r.tracer {
        trace.note(
            Hop::Acpd,
            &format!("bridge session {} (the agent's {})", r.t.session_id, r.own),
        );
    }
    r.first(d).await;
    let early = std::mem::take(&mut *super::lock(&d.shared.early));
    for (method, params) in early {
        let params = params.as_deref().map(RawJson::from);
        r.child_notification(d, &method, params).await;
    }
    r.flush_updates().await;
    let end = loop {
        let end = r.pump(d).await;
        let detach = r.t.detach;
        match (end, detach) {
            (RelayEnd::ParentGone, Some(wait)) if !d.shared.stop.is_cancelled() => {
                match r.detached(d, wait).await {
                    Ok(()) => continue,
                    Err(end) => break end,
                }
            }
            (end, _) => break end,
        }
    };
    r.finish(d, &end).await;
    if let Some(trace) = &r.tracer {
        trace.note(Hop::Acpd, &format!("bridge session ended: {end:?}"));
        trace.flush();
    }
    end
}

impl Relay {
    async fn pump(&mut self, d: &mut Driver) -> RelayEnd {
        let stop = d.shared.stop.clone();
        let parent_gone = self.t.parent.broken();
        let child_deaf = d.wire.out.broken();
        let mut exited: Option<(std::process::ExitStatus, Instant)> = None;
        // Made once and pinned: re-creating them every round re-registered their waiters for
        // every message of a stream.
        let shared = d.shared.clone();
        let stopped = stop.cancelled();
        let parent_broke = parent_gone.cancelled();
        let deaf = child_deaf.cancelled();
        let leader_exit = shared.tree.exited();
        tokio::pin!(stopped, parent_broke, deaf, leader_exit);
        loop {
            let last_words = exited.map(|(_, at)| at);
            // What the next command needs free in the outbox to be queued without waiting.
            let room = self
                .next
                .as_ref()
                .map(|q| ROOM + q.held.as_ref().map_or(0, |h| h.num_permits()));
            tokio::select! {
                biased;
                () = &mut stopped => return RelayEnd::Closed,
                () = &mut parent_broke => return RelayEnd::ParentGone,
                frame = d.wire.reader.next_line() => {
                    let Some(frame) = frame else {
                        let status = match exited {
                            Some((s, _)) => Some(s),
                            None => d.exit_status_soon().await,
                        };
                        return gone(status);
                    };
                    let mut end = self.on_frame(d, frame).await;
                    // The rest of a burst already read goes out in this round too, its own
                    // updates in one queued write.
                    for _ in 0..BURST {
                        if end.is_some() {
                            break;
                        }
                        if self.updates.bytes.len() >= UPDATES_AT_ONCE {
                            self.flush_updates().await;
                        }
                        // Chunks shaped like the last are forwarded from where they lie.
                        if self.lend_like_the_last(&mut d.wire.reader) > 0 {
                            continue;
                        }
                        let Some(frame) = d.wire.reader.next_buffered_line() else { break };
                        end = self.on_frame(d, frame).await;
                    }
                    self.flush_updates().await;
                    if let Some(end) = end {
                        return end;
                    }
                }
                status = &mut leader_exit, if exited.is_none() => {
                    exited = Some((status, Instant::now() + LAST_WORDS));
                }
                _ = sleep_until_opt(last_words) => return gone(exited.map(|(s, _)| s)),
                () = &mut deaf, if exited.is_none() => {
                    return match d.exit_status_soon().await {
                        Some(s) => gone(Some(s)),
                        None => RelayEnd::ChildDeaf,
                    };
                }
                _ = d.shared.relay_detach.notified() => return RelayEnd::ParentGone,
                // A cancel that found the queue full goes once what was queued before it has
                // gone (nothing can be queued after it meanwhile), so it never overtakes the
                // prompt it cancels; the pump keeps reading the child all the while.
                _ = d.shared.relay_cancel.notified() => {
                    if self.late.is_none() && super::lock(&d.shared.late_cancel).is_some() {
                        self.late = Some(d.cmds.len() + usize::from(self.next.is_some()));
                        self.late_cancel(d).await;
                    }
                }
                cmd = d.cmds.recv(), if self.next.is_none() => match cmd {
                    None => return RelayEnd::Closed,
                    Some(cmd) => self.next = Some(cmd),
                },
                // The child is behind on reading: the parent's next command waits here, its
                // share of the session's byte budget held, until it catches up (its own
                // output keeps flowing meanwhile).
                () = d.wire.out.room(room.unwrap_or(ROOM)), if room.is_some() => {
                    if let Some(Queued { cmd, held }) = self.next.take() {
                        self.parent_cmd(d, cmd).await;
                        // Handed to the child's outbox (bounded in bytes itself), or answered.
                        drop(held);
                    }
                    if let Some(before) = self.late.as_mut() {
                        *before = before.saturating_sub(1);
                        self.late_cancel(d).await;
                    }
                    if self.attach_next.is_some() {
                        return RelayEnd::ParentGone;
                    }
                }
                Some((id, ask, result)) = self.forwarded.next(), if !self.forwarded.is_empty() => {
                    self.parent_answered(d, id, ask, result).await;
                }
            }
        }
    }

    /// One line from the child; the end of the session when it ends it. The message borrows
    /// from the line, so an update is checked and spliced without a copy of its own.
    async fn on_frame(
        &mut self,
        d: &mut Driver,
        frame: Result<Bytes, LineFault>,
    ) -> Option<RelayEnd> {
        let line = match frame {
            Ok(line) => line,
            Err(fault) => return bad_line(d, &self.t.session_id, &fault),
        };
        if self.own_update_like_the_last(&line) {
            return None;
        }
        let line = crate::wire::unicode_escapes(line);
        let message = envelope::parse_keyed(&line);
        if !matches!(message, Ok((MessageRef::Notification { .. }, _))) {
            self.flush_updates().await;
        }
        match message {
            Err(e) => bad_line(d, &self.t.session_id, &e.into()),
            Ok((MessageRef::Response { id, outcome }, _)) => match outcome.map(RawJson::to_boxed) {
                Ok(Err(e)) => bad_line(d, &self.t.session_id, &e.into()),
                Ok(Ok(result)) => self.answered(d, id, Ok(result)).await,
                Err(error) => self.answered(d, id, Err(error)).await,
            },
            Ok((MessageRef::Notification { method, params }, keys)) => {
                if let Some((before, after)) = self.own_update(&method, params, &keys) {
                    self.last_update =
                        shape::UpdateShape::learn(&line, before, after, &self.minted_json);
                    self.forward_own_update(before, after);
                } else {
                    self.child_notification(d, &method, params).await;
                }
                None
            }
            Ok((MessageRef::Request { id, method, params }, _)) => {
                match params.map(RawJson::to_boxed).transpose() {
                    Ok(params) => {
                        self.child_request(d, id, method.into_owned(), params).await;
                        None
                    }
                    Err(e) => bad_line(d, &self.t.session_id, &e.into()),
                }
            }
        }
    }

    /// `value` naming the parent's session where it names the child's own (a load's answer,
    /// an error's `data`), spliced; `None` when it names no session, or another.
    fn own_renamed(&self, value: &RawValue) -> Option<Box<RawValue>> {
        let own = self.own.as_str();
        (value.get().contains(own)
            && acpd_protocol::session_id::session_id(value).as_deref() == Some(own))
        .then(|| with_session_id(value, &self.t.session_id))
        .flatten()
    }

    /// Queues the own-session updates gathered in this burst (see
    /// `from_child::forward_own_update`): one allocation, one budget claim and one queue slot
    /// for the lot. Called before anything else goes to the parent, so the order holds.
    async fn flush_updates(&mut self) {
        let batch = &mut self.updates;
        if !batch.bytes.is_empty() {
            // Counted per batch: the metrics' atomic adds were a tenth of a flood's CPU.
            let messages = std::mem::take(&mut batch.count);
            crate::metrics::to_parent_many(messages, batch.bytes.len() - messages);
            // The next burst is likely the size of this one: room for it up front, not grown
            // (and copied) by doubling, in a buffer the writer has given back when it has one.
            let want = if batch.bytes.len() >= UPDATES_AT_ONCE / 2 {
                BATCH_CAPACITY
            } else {
                batch.bytes.len()
            };
            let next = self.t.parent.batch_buffer(want);
            let lines = std::mem::replace(&mut batch.bytes, next);
            let _ = self.t.parent.send_lines(lines).await;
        }
    }

    async fn to_parent(&self, line: Vec<u8>) {
        crate::metrics::to_parent(line.len());
        self.trace(Hop::AcpdToParent, || line.clone());
        let _ = self.t.parent.send_line(line).await;
    }

    /// Records a parent-hop message in the session's trace (built only when tracing).
    fn trace(&self, hop: Hop, line: impl FnOnce() -> Vec<u8>) {
        if let Some(trace) = &self.tracer {
            trace.record(hop, &line());
        }
    }

    /// The child answered one of the parent's calls. Returns the end of the session when that
    /// answer closes it.
    async fn answered(
        &mut self,
        d: &Driver,
        id: Option<Id>,
        outcome: Result<Box<RawValue>, RpcError>,
    ) -> Option<RelayEnd> {
        let id = id?;
        let Some((pid, method)) = self.open.remove(&id) else {
            // A call of a connection that has gone (the session detached, maybe attached again
            // since): its answer reaches nobody, but what it records still is.
            self.record_if_taken(&id, &outcome).await;
            return None;
        };
        let after_ok = self.after_ok.remove(&id);
        if !self.hops.is_empty()
            && let Some(hop) = self.hops.remove(&id)
        {
            if let Err(e) = &outcome {
                hop.fail(e.message.clone());
            }
            hop.end();
        }
        let prompt = if method == "session/prompt" {
            self.prompts.remove(&id)
        } else {
            None
        };
        let reported = match (&prompt, &outcome) {
            (Some(_), Ok(r)) => from_child::log_reported_failure(d, &self.t.session_id, r),
            _ => None,
        };
        let mut refused = false;
        // An answer naming the child's session (a load's, a resume's) names the parent's;
        // one that names a session twice is refused, never passed on for the parent to guess.
        let outcome = match outcome.map(|r| (strict::doubled(&r), r)) {
            Ok((Some(why), _)) => {
                refused = true;
                tracing::warn!(provider = %d.shared.provider.name, session = %self.t.session_id,
                    %method, "refusing the agent's answer: {why}");
                Err(RpcError::internal(format!(
                    "the agent's answer to {method} is ambiguous ({why})"
                )))
            }
            Ok((None, r)) => Ok(self.own_renamed(&r).unwrap_or(r)),
            // An error about the child's session (`Session not found`) names the parent's.
            Err(mut e) => {
                // An agent that wants credentials: the editor hears what would satisfy it, and
                // the daemon's log says so (an editor may show the error to nobody).
                if e.code == acpd_protocol::envelope::AUTH_REQUIRED {
                    let (provider, agent) = (&d.shared.provider, &d.shared.agent);
                    e = super::with_auth_advice(e, provider, &agent.auth_method_ids);
                    tracing::warn!(provider = %provider.name, session = %self.t.session_id,
                        %method, "the agent needs credentials: {}", e.message);
                }
                // Spliced: the rest of `data` stays as the agent wrote it.
                if let Some(data) = e.data.as_deref().and_then(|d| self.own_renamed(d)) {
                    e.data = Some(data);
                }
                Err(e)
            }
        };
        if let (Some(record), Ok(_)) = (after_ok, &outcome) {
            record().await;
        }
        let closed = method == "session/close" && outcome.is_ok();
        if closed && let Some(on_closed) = self.t.on_closed.take() {
            on_closed();
        }
        self.trace(Hop::AcpdToParent, || {
            envelope::encode_reply(&pid, outcome.as_ref().map(|r| &**r))
        });
        crate::metrics::to_parent(crate::metrics::size(&outcome));
        let _ = self
            .t
            .parent
            .respond(&pid, outcome.as_ref().map(|r| &**r))
            .await;
        if let Some(p) = prompt {
            let end = match &outcome {
                _ if refused => TurnEnd::Protocol,
                Ok(r) => TurnEnd::Stopped {
                    reason: stop_reason(r),
                    reported_failure: reported,
                },
                Err(e) => TurnEnd::RpcError { code: e.code },
            };
            observe_prompt(d, p, &end, false);
        }
        if self.opening.as_ref() == Some(&id) {
            self.opening = None;
            if let Err(e) = &outcome {
                let why = format!("the agent refused to open the session: {}", e.message);
                d.shared.fail_span(why);
                return Some(RelayEnd::OpenRefused);
            }
        }
        closed.then_some(RelayEnd::Closed)
    }

    /// Runs what `id`'s call records once the agent took it (a title), when it answered with
    /// a result that names no session twice: also for a call whose connection is gone, since the
    /// agent took it all the same.
    pub(super) async fn record_if_taken(
        &mut self,
        id: &Id,
        outcome: &Result<Box<RawValue>, RpcError>,
    ) {
        let Some(record) = self.after_ok.remove(id) else {
            return;
        };
        if matches!(outcome, Ok(r) if strict::doubled(r).is_none()) {
            record().await;
        }
    }
}

/// One bridge turn ended as `end`, observed from its forwarding; `here`: acpd or the editor
/// cancelled it, whatever the agent then did.
fn observe_prompt(d: &Driver, p: Prompt, end: &TurnEnd, here: bool) {
    let mapped = outcome::map_outcome(end, here || p.cancel_asked);
    crate::metrics::get().bridge_turn_ended(&d.shared.provider.name, &mapped, p.at.elapsed());
}

/// The `stopReason` of a prompt's answer (an answer without one is an unknown stop reason).
fn stop_reason(answer: &RawValue) -> ChildStopReason {
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(borrow, rename = "stopReason")]
        stop_reason: std::borrow::Cow<'a, str>,
    }
    match serde_json::from_str::<Answer<'_>>(answer.get()) {
        Ok(a) => ChildStopReason::parse(&a.stop_reason),
        Err(_) => ChildStopReason::Unknown(String::new()),
    }
}

fn bad_line(d: &Driver, session: &str, fault: &LineFault) -> Option<RelayEnd> {
    tracing::warn!(provider = %d.shared.provider.name, %session,
        "child sent a bad line; ending the session: {fault}");
    Some(RelayEnd::Protocol(fault.to_string()))
}

fn gone(status: Option<std::process::ExitStatus>) -> RelayEnd {
    RelayEnd::ChildGone {
        exit_code: status.and_then(|s| s.code()),
        signal: status.as_ref().and_then(supervise::signal_name),
    }
}
