//! What the parent sends the child of a bridge session: its calls and notifications (checked
//! against what the agent advertised, ids remapped, trace context continued), the first
//! request that opens the session, and a cancel.

use super::*;

impl Relay {
    pub(super) fn supports(&self, method: &str) -> bool {
        let present = |v: Option<&serde_json::Value>| v.is_some_and(|v| !v.is_null());
        let on = |v: Option<&serde_json::Value>| present(v) && v != Some(&json!(false));
        match method {
            "session/prompt" => true,
            "session/close" => present(self.caps.pointer("/sessionCapabilities/close")),
            "session/set_title" => present(self.caps.pointer("/sessionCapabilities/title")),
            // Of the session open here (the router checked the capability).
            "session/load" => on(self.caps.pointer("/loadSession")),
            "session/resume" => on(self.caps.pointer("/sessionCapabilities/resume")),
            // Every other method passes: the agent answers what it does not know (-32601).
            // `set_mode`, `set_model`, `set_config_option` too: what a session offers is said
            // by the answer that opened it, which a load or a resume need not repeat (and acpd
            // may not have seen), so only the agent can tell.
            m => strict::forwardable_request(m),
        }
    }

    pub(super) async fn parent_cmd(&mut self, d: &mut Driver, cmd: Cmd) {
        match &cmd {
            Cmd::Call {
                id, method, params, ..
            } => self.trace(Hop::ParentToAcpd, || {
                envelope::encode_request(id, method, params.as_deref())
            }),
            Cmd::Notify { method, params } => self.trace(Hop::ParentToAcpd, || {
                envelope::encode_notification(method, Some(params))
            }),
            _ => {}
        }
        let (id, method, params, after_ok) = match cmd {
            Cmd::Call {
                id,
                method,
                params,
                after_ok,
            } => (id, method, params, after_ok),
            Cmd::Cancel(params) => {
                self.cancel(d, params).await;
                return;
            }
            Cmd::Notify { method, params } if method == CANCEL_REQUEST => {
                // The parent's id of a call this relay forwarded: the child gets its own.
                let child_id = |pid: &Id| {
                    self.open
                        .iter()
                        .find(|(_, (p, _))| p == pid)
                        .map(|(child, _)| child.clone())
                };
                if let Some((child, p)) = from_child::remap_request_id(&params, child_id) {
                    if let Some(prompt) = self.prompts.get_mut(&child) {
                        prompt.cancel_asked = true;
                    }
                    crate::metrics::to_child(p.get().len());
                    let _ = d.wire.notify(&method, &p).await;
                }
                return;
            }
            Cmd::Notify { method, params } => {
                if let Ok(p) = self.to_child(&params, &d.shared.session_id) {
                    let (p, hop) = self.hop(d, &method, p);
                    crate::metrics::to_child(p.get().len());
                    let _ = d.wire.notify(&method, &p).await;
                    if let Some(hop) = hop {
                        hop.end();
                    }
                }
                return;
            }
            // Attached elsewhere before this relay saw its connection go: the pump ends as if
            // the connection broke, and `detached` attaches it at once.
            Cmd::Relay(t) => {
                self.attach_next = Some(t);
                return;
            }
            Cmd::Announce(params) => {
                if self.t.serves.subagents {
                    self.to_parent(envelope::encode_notification(
                        "session/update",
                        Some(&params),
                    ))
                    .await;
                }
                return;
            }
            Cmd::Parent(reply) => {
                let _ = reply.send(self.t.serves.subagents.then(|| self.t.parent.clone()));
                return;
            }
            Cmd::Prompt { .. } => return,
        };
        if !self.supports(&method) {
            let e = RpcError::method_not_found(&method);
            let _ = self.t.parent.respond_err(Some(&id), &e).await;
            return;
        }
        let (params, hop) = match params.as_deref() {
            None => (None, None),
            Some(p) => match self.to_child(p, &d.shared.session_id) {
                Ok(p) => {
                    let (p, hop) = self.hop(d, &method, p);
                    (Some(p), hop)
                }
                Err(e) => {
                    let _ = self.t.parent.respond_err(Some(&id), &e).await;
                    return;
                }
            },
        };
        crate::metrics::to_child(crate::metrics::size(&params));
        let prompt = (method == "session/prompt").then(|| Prompt {
            at: Instant::now(),
            cancel_asked: false,
        });
        let Some(child_id) = self.send_call(d, id, method, params).await else {
            // Answered an error at once: the agent is not reading its input.
            if let Some(p) = prompt {
                observe_prompt(d, p, &TurnEnd::Idle, false);
            }
            return;
        };
        if let Some(p) = prompt {
            self.prompts.insert(child_id.clone(), p);
        }
        if let Some(hop) = hop {
            self.hops.insert(child_id.clone(), hop);
        }
        if let Some(record) = after_ok {
            self.after_ok.insert(child_id, record);
        }
    }

    /// Sends a parent's call on; its child id, or `None` when the parent got an error.
    pub(super) async fn send_call(
        &mut self,
        d: &mut Driver,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Option<Id> {
        match d.wire.request(&method, params.as_deref()).await {
            Ok(child_id) => {
                self.open.insert(child_id.clone(), (id, method));
                Some(child_id)
            }
            Err(_) => {
                let e = RpcError::internal("the agent is not reading its input");
                let _ = self.t.parent.respond_err(Some(&id), &e).await;
                None
            }
        }
    }

    /// What the relay does before anything the child says reaches the parent.
    pub(super) async fn first(&mut self, d: &mut Driver) {
        match std::mem::replace(&mut self.t.first, First::Nothing) {
            First::Nothing => {}
            First::Answer(id, reply) => {
                self.trace(Hop::AcpdToParent, || {
                    envelope::encode_reply(&id, Ok(&reply))
                });
                let _ = self.t.parent.respond(&id, Ok(&reply)).await;
            }
            First::Open { id, method, params } => {
                let own = d.shared.session_id.clone();
                let params = params
                    .as_deref()
                    .map(|p| with_session_id(p, &own).unwrap_or_else(|| p.to_owned()));
                crate::metrics::to_child(crate::metrics::size(&params));
                self.opening = self.send_call(d, id, method, params).await;
            }
        }
        // Permission requests held while detached are asked again.
        let held: Vec<(Id, Option<Box<RawValue>>)> = self.asks.drain().collect();
        for (id, params) in held {
            self.ask_parent(id, "session/request_permission", params, true)
                .await;
        }
    }

    /// Sends the parent's late cancel once every command queued before it has gone
    /// (`Shared::late_cancel`).
    pub(super) async fn late_cancel(&mut self, d: &mut Driver) {
        if self.late != Some(0) {
            return;
        }
        self.late = None;
        let late = super::super::lock(&d.shared.late_cancel).take();
        if let Some(params) = late {
            self.cancel(d, params).await;
        }
    }

    /// The parent's `session/cancel`, with its own fields (`_meta`) as it sent them and the
    /// child's session id in place of the parent's.
    pub(super) async fn cancel(&mut self, d: &mut Driver, params: Box<RawValue>) {
        self.trace(Hop::ParentToAcpd, || {
            envelope::encode_notification("session/cancel", Some(&params))
        });
        let own = &d.shared.session_id;
        // Params naming the session twice (or not at all) cannot be rewritten: the child gets
        // its id alone rather than a guess.
        let cancel = with_session_id(&params, own)
            .unwrap_or_else(|| envelope::to_raw(&json!({ "sessionId": own })));
        crate::metrics::to_child(cancel.get().len());
        for p in self.prompts.values_mut() {
            p.cancel_asked = true;
        }
        let _ = d.wire.notify("session/cancel", &cancel).await;
        for (id, _) in std::mem::take(&mut self.asks) {
            let _ = d.wire.respond_ok(&id, &permission::cancelled()).await;
        }
    }
}
