//! A bridge session between connections: detached from the one that closed, attached to the
//! next that loads it (`detach_timeout`).

use acpd_protocol::envelope::{Message, RpcError};
use acpd_protocol::permission::{self, PolicyAnswer};
use futures::stream::FuturesUnordered;

use super::{MAX_FORWARDED, Relay, gone};
use crate::child::driver::Driver;
use crate::child::{Cmd, RelayEnd, RelayTarget};

impl Relay {
    /// Between connections: the child keeps running and is read (its updates are dropped, its
    /// permission requests held, anything else refused) until it is attached again (`Ok`),
    /// `wait` passes, or it ends.
    pub(super) async fn detached(
        &mut self,
        d: &mut Driver,
        wait: std::time::Duration,
    ) -> Result<(), RelayEnd> {
        let session = self.t.session_id.clone();
        tracing::info!(provider = %d.shared.provider.name, %session, ?wait, "bridge session detached");
        self.leave(d).await;
        // The old connection's command that was waiting for room: its cancel still stops the
        // turn, and an attach still attaches.
        match self.next.take().map(|q| q.cmd) {
            Some(Cmd::Cancel(params)) => self.cancel(d, params).await,
            Some(Cmd::Relay(t)) => self.attach_next = Some(t),
            Some(Cmd::Call { id, method, .. }) => self.left_unsent(&id, &method).await,
            _ => {}
        }
        d.shared.relay_left.notify_waiters();
        // The cancel the old connection sent last, waiting behind a full queue: what came
        // before it will never be sent now, and its turn is still to be stopped.
        self.late = None;
        let late = crate::child::lock(&d.shared.late_cancel).take();
        if let Some(params) = late {
            self.cancel(d, params).await;
        }
        if let Some(t) = self.attach_next.take() {
            self.switch(d, t).await;
            return Ok(());
        }
        let expires = crate::config::durations::deadline(wait);
        let stop = d.shared.stop.clone();
        let mut dropped = 0u64;
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return Err(RelayEnd::Closed),
                frame = d.wire.reader.next() => match frame {
                    None => return Err(gone(d.exit_status_soon().await)),
                    Some(Err(fault)) => return Err(RelayEnd::Protocol(fault.to_string())),
                    Some(Ok(Message::Request { id, method, params })) => {
                        if let Some(why) = params.as_deref().and_then(crate::child::strict::doubled) {
                            let e = RpcError::invalid_request(format!("{why} in the params; send it once"));
                            let _ = d.wire.respond(&id, Err(&e)).await;
                        } else if method == "session/request_permission" {
                            match permission::answer_by_policy(d.shared.provider.permission, params.as_deref()) {
                                PolicyAnswer::InvalidParams(why) => {
                                    let _ = d.wire.respond(&id, Err(&RpcError::invalid_params(why))).await;
                                }
                                PolicyAnswer::Answer(answer) => {
                                    let _ = d.wire.respond_ok(&id, &answer).await;
                                }
                                PolicyAnswer::Forward if self.asks.len() < MAX_FORWARDED => {
                                    let params = params.as_deref().and_then(|p| self.to_parent_params(p, &d.shared.session_id).ok());
                                    self.asks.insert(id, params);
                                }
                                PolicyAnswer::Forward => {
                                    let _ = d.wire.respond_ok(&id, &permission::cancelled()).await;
                                }
                            }
                        } else {
                            let e = RpcError::internal("no client is attached to this session");
                            let _ = d.wire.respond(&id, Err(&e)).await;
                        }
                    }
                    // The answer to a call of the connection that left: a title the agent
                    // took is recorded all the same.
                    Some(Ok(Message::Response { id: Some(id), outcome })) => {
                        self.record_if_taken(&id, &outcome).await;
                        dropped += 1;
                    }
                    Some(Ok(_)) => dropped += 1,
                },
                cmd = d.cmds.recv() => match cmd.map(|q| q.cmd) {
                    None => return Err(RelayEnd::Closed),
                    Some(Cmd::Relay(t)) => {
                        tracing::info!(provider = %d.shared.provider.name, %session, dropped, "bridge session attached again");
                        self.switch(d, t).await;
                        return Ok(());
                    }
                    // The old connection's, queued before it ended: never sent now.
                    Some(Cmd::Call { id, method, .. }) => self.left_unsent(&id, &method).await,
                    // The old connection's last word may be a cancel: its turn still stops.
                    Some(Cmd::Cancel(params)) => self.cancel(d, params).await,
                    Some(_) => {}
                },
                _ = tokio::time::sleep_until(expires) => {
                    tracing::info!(provider = %d.shared.provider.name, %session, "detached session expired (detach_timeout)");
                    return Err(RelayEnd::Expired);
                }
            }
        }
    }

    /// The old connection is gone: its prompts end `cancelled` for it (an editor that closed
    /// only its input still reads them, as at a close), its other calls get no answer, the
    /// requests it was asked are answered (permission requests are kept, to be asked again).
    /// The agent's own answer to such a prompt, when it comes, reaches nobody.
    pub(super) async fn leave(&mut self, d: &mut Driver) {
        let cancelled =
            acpd_protocol::envelope::to_raw(&serde_json::json!({ "stopReason": "cancelled" }));
        for (_, (pid, method)) in self.open.drain() {
            if method == "session/prompt" {
                let _ = self.t.parent.respond(&pid, Ok(&cancelled)).await;
            }
        }
        // Their answers can no longer reach the editor that asked.
        self.prompts_ended(d, &super::CANCELLED_HERE, true);
        self.opening = None;
        self.forwarded = FuturesUnordered::new();
        for id in std::mem::take(&mut self.waiting) {
            let e = RpcError::internal("the client disconnected");
            let _ = d.wire.respond(&id, Err(&e)).await;
        }
    }

    /// A call of the connection that left, still queued toward the agent: never sent now. A
    /// prompt ends `cancelled` for it, as one already forwarded does ([`Relay::leave`]); its
    /// other calls get no answer, as theirs do.
    async fn left_unsent(&self, id: &acpd_protocol::envelope::Id, method: &str) {
        if method == "session/prompt" {
            let cancelled =
                acpd_protocol::envelope::to_raw(&serde_json::json!({ "stopReason": "cancelled" }));
            let _ = self.t.parent.respond(id, Ok(&cancelled)).await;
        }
    }

    /// Attached to another connection.
    pub(super) async fn switch(&mut self, d: &mut Driver, t: RelayTarget) {
        // A detach signalled for the old connection must not detach the new one.
        let _ = futures::FutureExt::now_or_never(d.shared.relay_detach.notified());
        self.minted_json = acpd_protocol::envelope::json_string(&t.session_id).into_owned();
        // The kept shape's output holds the old id.
        self.last_update = None;
        self.t = t;
        self.first(d).await;
    }
}
