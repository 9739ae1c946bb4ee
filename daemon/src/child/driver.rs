//! The driver: one task per child that owns its wire. It reads every line the child writes, in
//! order, so an answer can never overtake the updates or the bad line that came before it.
//! Before its first command it idles in collect mode (updates dropped and logged, requests
//! refused), unless the child is a bridge session's, whose output waits for the relay.

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::envelope::{self, Id, Message, RpcError};
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use acpd_protocol::permission;

use super::queue::Queued;
use super::{Cmd, RelayEnd, Shared, collect, lock, relay};
use crate::wire::{CallError, LineFault, LineReader, Outbox};

/// After the child exits, how long its last words may take to come out of the pipe.
pub(super) const LAST_WORDS: Duration = Duration::from_millis(200);

/// What the driver reads the child from: its stdout (a duplex pipe in tests).
pub(super) type ChildOutput = Box<dyn tokio::io::AsyncRead + Unpin + Send + Sync>;

/// The child's side of the wire: its stdout, read inline, and its stdin's outbox.
pub(super) struct ChildWire {
    pub reader: LineReader<ChildOutput>,
    pub out: Outbox,
    next_id: i64,
}

impl ChildWire {
    pub(super) fn new(reader: LineReader<ChildOutput>, out: Outbox) -> Self {
        ChildWire {
            reader,
            out,
            next_id: 0,
        }
    }

    /// Sends a request; its answer arrives through the reader with the returned id.
    pub(super) async fn request(
        &mut self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<Id, CallError> {
        let id = Id::Num(self.next_id);
        self.next_id += 1;
        self.out
            .send_line(envelope::encode_request(&id, method, params))
            .await?;
        Ok(id)
    }

    pub(super) async fn notify(&self, method: &str, params: &RawValue) -> Result<(), CallError> {
        self.out
            .send_line(envelope::encode_notification(method, Some(params)))
            .await
    }

    pub(super) async fn respond(
        &self,
        id: &Id,
        reply: Result<&RawValue, &RpcError>,
    ) -> Result<(), CallError> {
        let line = envelope::encode_reply(id, reply);
        self.out.send_line(line).await
    }

    pub(super) async fn respond_ok<R: serde::Serialize>(
        &self,
        id: &Id,
        result: &R,
    ) -> Result<(), CallError> {
        self.respond(id, Ok(&envelope::to_raw(result))).await
    }
}

pub(super) struct Driver {
    pub shared: Arc<Shared>,
    pub wire: ChildWire,
    pub cmds: mpsc::Receiver<Queued>,
}

impl Driver {
    pub(super) fn new(shared: Arc<Shared>, wire: ChildWire, cmds: mpsc::Receiver<Queued>) -> Self {
        Driver { shared, wire, cmds }
    }

    pub(super) async fn run(mut self) {
        let reading = !self.shared.relay_child;
        let stop = self.shared.stop.clone();
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                // What the child said before a prompt arrived is handled (and dropped) first,
                // so it can never land in the next turn.
                frame = self.wire.reader.next(), if reading => {
                    if !self.between_turns(frame).await {
                        break;
                    }
                }
                cmd = self.cmds.recv() => match cmd.map(|q| q.cmd) {
                    None => break,
                    Some(Cmd::Prompt { prompt, ctl, reply }) => {
                        // Boxed, so an idle child's task holds only a small future.
                        let report = Box::pin(collect::turn(&mut self, prompt, ctl)).await;
                        let spent = report.child_spent;
                        let _ = reply.send(report);
                        if spent {
                            break;
                        }
                    }
                    Some(Cmd::Relay(target)) => {
                        let end = Box::pin(relay::run(&mut self, target)).await;
                        *lock(&self.shared.relay_end) = Some(end);
                        break;
                    }
                    Some(Cmd::Call { id, method, .. }) => {
                        tracing::debug!(%id, %method, "a call for a child that is not relaying");
                    }
                    Some(Cmd::Cancel(_)) => {
                        tracing::debug!("a cancel for a child that is not relaying");
                    }
                    Some(Cmd::Notify { method, .. }) => {
                        tracing::debug!(%method, "a notification for a child that is not relaying");
                    }
                    Some(Cmd::Announce(_) | Cmd::Parent(_)) => {}
                },
                _ = self.shared.tree.exited() => break,
            }
        }
        if lock(&self.shared.relay_end).is_none() && self.shared.relay_child {
            *lock(&self.shared.relay_end) = Some(RelayEnd::Closed);
        }
        self.shared.done.cancel();
    }

    /// A message outside any turn. Returns false when the child is spent.
    async fn between_turns(&mut self, frame: Option<Result<Message, LineFault>>) -> bool {
        let log = &self.shared.log_id;
        let provider = &self.shared.provider.name;
        match frame {
            None => {
                tracing::debug!(%provider, run = %log, "child closed its output between turns");
                false
            }
            Some(Err(fault)) => {
                tracing::warn!(%provider, run = %log, "child sent a bad line between turns: {fault}");
                false
            }
            Some(Ok(Message::Notification { method, .. })) => {
                tracing::info!(%provider, run = %log, %method, "dropping a notification sent between turns");
                true
            }
            Some(Ok(Message::Response { id, .. })) => {
                tracing::debug!(%provider, run = %log, ?id, "dropping a late answer");
                true
            }
            Some(Ok(Message::Request { id, method, params })) => {
                let _ = if method == "session/request_permission" {
                    // No turn to ask for: `cancelled`, or −32602 for one acpd cannot read.
                    match permission::parse_request(params.as_deref()) {
                        Ok(_) => self.wire.respond_ok(&id, &permission::cancelled()).await,
                        Err(why) => {
                            let e = RpcError::invalid_params(why);
                            self.wire.respond(&id, Err(&e)).await
                        }
                    }
                } else {
                    self.wire
                        .respond(&id, Err(&RpcError::method_not_found(&method)))
                        .await
                };
                true
            }
        }
    }

    /// The child's exit status if it exits within a second (its output closed, so it most
    /// likely is exiting).
    pub(super) async fn exit_status_soon(&self) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(Duration::from_secs(1), self.shared.tree.exited())
            .await
            .ok()
    }
}
