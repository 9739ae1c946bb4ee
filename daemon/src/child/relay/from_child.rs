//! What the child sends the parent of a bridge session besides answers: its notifications
//! (updates spliced with the minted session id, its own subagent sessions' traffic, failures it
//! reports in `_meta`) and its requests (forwarded where the parent serves them, permission
//! requests by the provider's policy), and the parent's answers to them.

use super::*;

impl Relay {
    /// A notification the hot path ([`Relay::own_update`]) did not take: everything else a
    /// child may send the parent, each checked on serde_json's raw value.
    pub(super) async fn child_notification(
        &mut self,
        d: &Driver,
        method: &str,
        params: Option<RawJson<'_>>,
    ) {
        self.flush_updates().await;
        let session = self.t.session_id.clone();
        let log = |why: &str| {
            tracing::warn!(provider = %d.shared.provider.name, %session,
                %method, "dropping a child notification: {why}");
        };
        // Off the hot path: the helpers below read serde_json's raw value.
        let params = match params.map(RawJson::to_raw_value).transpose() {
            Ok(params) => params,
            Err(e) => return log(&e.to_string()),
        };
        if !strict::forwardable(method) {
            return log("acpd's own method");
        }
        if !self.t.serves.takes(method) {
            return log("the parent did not advertise the capability it needs");
        }
        if method == CANCEL_REQUEST {
            return self.child_cancels(d, params).await;
        }
        let Some(params) = params else {
            if method == "session/update" {
                return log("no params");
            }
            return self
                .to_parent(envelope::encode_notification(method, None))
                .await;
        };
        let text = params.get();
        if let Some(why) = strict::doubled(params) {
            return log(&why);
        }
        let keys = strict::session_keys(params);
        let own = &d.shared.session_id;
        let sid = keys.as_ref().and_then(|k| k.value.as_deref());
        let target = match (keys.as_ref().map(|k| k.count), sid) {
            (Some(1), Some(sid)) if sid == own => self.t.session_id.clone(),
            (Some(1), Some(sid)) if self.subs.contains_key(sid) => self.subs[sid].clone(),
            (Some(0), _) if method != "session/update" => {
                return self
                    .to_parent(envelope::encode_notification(method, Some(params)))
                    .await;
            }
            (Some(0), _) => return log("no sessionId"),
            (Some(1), _) => return log("another session's sessionId"),
            (Some(_), _) => return log("more than one sessionId"),
            // An array naming no session has nothing to rewrite: passed on as it is, but for
            // an update, which must name its session.
            (None, _) if method != "session/update" && names_no_session(text) => {
                return self
                    .to_parent(envelope::encode_notification(method, Some(params)))
                    .await;
            }
            (None, _) => return log("params are not an object"),
        };
        if acpd_protocol::session_routes::names_other_sessions(text) {
            if !self.t.serves.subagents {
                return log("it names other sessions and the client did not opt in to subagents");
            }
            return match self.subagent_traffic(own, params) {
                Ok(p) => {
                    self.to_parent(envelope::encode_notification(method, Some(&p)))
                        .await
                }
                Err(id) => log(&format!(
                    "it names a session the agent never announced ({id})"
                )),
            };
        }
        match splice_session_id(text, &target) {
            Some(spliced) => {
                self.to_parent(envelope::encode_notification_text(method, &spliced))
                    .await
            }
            None => log("cannot rewrite its sessionId"),
        }
    }

    /// An update that names exactly the child's own session (by its keys as the scan counted
    /// them), as its params before and after that session id: the hot path's.
    pub(super) fn own_update<'a>(
        &self,
        method: &str,
        params: Option<RawJson<'a>>,
        keys: &ParamsKeys<'a>,
    ) -> Option<(&'a str, &'a str)> {
        if method == "session/update"
            && strict::names_only_its_own(keys, &self.own_json)
            && self.t.serves.takes(method)
        {
            keys.around_session_id(params?.get())
        } else {
            None
        }
    }

    /// The hot path's shortcut: `line` is the last own update but for the content of its last
    /// string (the text of a streamed chunk), which is checked as a JSON string's, so it is
    /// forwarded as that one was, with no scan of the rest. Whether it was.
    pub(super) fn own_update_like_the_last(&mut self, line: &[u8]) -> bool {
        self.last_update
            .as_ref()
            .is_some_and(|shape| shape.forward(line, &mut self.updates, self.tracer.as_deref()))
    }

    /// [`Relay::own_update_like_the_last`] for the lines already read, where they lie in the
    /// read buffer, until one does not fit or the batch is full; no search for their ends (a
    /// line that fits knows its length). How many were taken.
    pub(super) fn lend_like_the_last(&mut self, reader: &mut LineReader<ChildOutput>) -> usize {
        let Some(shape) = self.last_update.as_ref() else {
            return 0;
        };
        let (batch, tracer) = (&mut self.updates, self.tracer.as_deref());
        reader.lend_buffered_lines(
            |rest| shape.fits(rest),
            |line, content| {
                shape.put(line, content, batch, tracer);
                batch.bytes.len() < UPDATES_AT_ONCE
            },
        )
    }

    /// The hot path: an update that names exactly the child's own session, spliced as text
    /// (the minted id in place of the child's, `before` and `after` it as the child wrote
    /// them) with no parse beyond the envelope's scan.
    /// Gathers the spliced update into the burst's batch, which `flush_updates` queues.
    pub(super) fn forward_own_update(&mut self, before: &str, after: &str) {
        let tracer = self.tracer.as_deref();
        self.updates
            .splice(before, &self.minted_json, after, tracer);
    }

    pub(super) async fn child_request(
        &mut self,
        d: &mut Driver,
        id: Id,
        method: String,
        params: Option<Box<RawValue>>,
    ) {
        let serves = self.t.serves;
        let ask = method == "session/request_permission";
        let allowed = match method.as_str() {
            "session/request_permission" => {
                match permission::answer_by_policy(d.shared.provider.permission, params.as_deref())
                {
                    PolicyAnswer::InvalidParams(why) => {
                        let e = RpcError::invalid_params(why);
                        let _ = d.wire.respond(&id, Err(&e)).await;
                        return;
                    }
                    PolicyAnswer::Answer(answer) => {
                        let _ = d.wire.respond_ok(&id, &answer).await;
                        return;
                    }
                    PolicyAnswer::Forward => true,
                }
            }
            m => strict::forwardable_request(m) && serves.takes(m),
        };
        if !allowed {
            let e = RpcError::method_not_found(&method);
            let _ = d.wire.respond(&id, Err(&e)).await;
            return;
        }
        if let Some(limit) = &self.t.confinement
            && let Some(e) = outside_sandbox(limit, &method, params.as_deref())
        {
            tracing::warn!(provider = %d.shared.provider.name, %method,
                "refused a sandboxed child's request: {}", e.message);
            let _ = d.wire.respond(&id, Err(&e)).await;
            return;
        }
        // Exactly the child's own sessionId, rewritten to the parent's; a request with none is
        // forwarded as it is; anything else (another session's, two of them) never leaves.
        let params = match params.as_deref() {
            None => None,
            Some(p) => match strict::session_keys(p).map(|k| (k.count, k.value)) {
                // A request-scoped elicitation names the parent's call it belongs to by the id
                // acpd gave that call on the child's wire: the parent knows its own.
                Some((0, _)) if method.starts_with("elicitation/") => {
                    let parent_id = |child: &Id| self.open.get(child).map(|(pid, _)| pid.clone());
                    match remap_request_id(p, parent_id) {
                        Some((_, p)) => Some(p),
                        // Naming no call of the parent's that is open: it could only be
                        // mistaken for another request of the parent's.
                        None => {
                            let e = RpcError::invalid_params(
                                "an elicitation must name its own session or an open request",
                            );
                            let _ = d.wire.respond(&id, Err(&e)).await;
                            return;
                        }
                    }
                }
                Some((0, _)) => Some(p.to_owned()),
                // An array naming no session has nothing to rewrite: passed on as it is (an
                // elicitation must name its session or the parent's call, so it is not one).
                None if names_no_session(p.get()) && !method.starts_with("elicitation/") => {
                    Some(p.to_owned())
                }
                Some((1, Some(sid))) if sid == d.shared.session_id => {
                    with_session_id(p, &self.t.session_id)
                }
                Some((1, Some(sid))) if self.subs.contains_key(&*sid) => {
                    with_session_id(p, &self.subs[&*sid])
                }
                _ => {
                    tracing::warn!(provider = %d.shared.provider.name, session = %self.t.session_id,
                        %method, "refusing a child request that does not name exactly its own session");
                    let e =
                        RpcError::invalid_params("the request must name exactly its own session");
                    let _ = d.wire.respond(&id, Err(&e)).await;
                    return;
                }
            },
        };
        // Two sessionIds were refused above (-32602); any other routing key written twice
        // (a nested session id, an update kind) is an invalid request.
        if let Some(why) = params.as_deref().and_then(strict::doubled) {
            tracing::warn!(provider = %d.shared.provider.name, session = %self.t.session_id,
                %method, "refusing a child request: {why}");
            let e = RpcError::invalid_request(format!("{why} in the params; send it once"));
            let _ = d.wire.respond(&id, Err(&e)).await;
            return;
        }
        if self.forwarded.len() >= MAX_FORWARDED {
            let e = RpcError::internal("too many requests are waiting on the parent");
            let _ = d.wire.respond(&id, Err(&e)).await;
            return;
        }
        self.ask_parent(id, &method, params, ask).await;
    }

    /// Forwards a child's request to the parent; its answer comes back through `forwarded`.
    pub(super) async fn ask_parent(
        &mut self,
        id: Id,
        method: &str,
        params: Option<Box<RawValue>>,
        ask: bool,
    ) {
        if ask {
            self.asks.insert(id.clone(), params.clone());
        } else {
            self.waiting.insert(id.clone());
        }
        self.trace(Hop::AcpdToParent, || {
            envelope::encode_notification(method, params.as_deref())
        });
        crate::metrics::to_parent(crate::metrics::size(&params));
        let call = self.t.parent.call_raw(method, params.as_deref()).await;
        if let Ok(call) = &call {
            self.parent_ids.insert(id.clone(), call.id.clone());
        }
        self.forwarded.push(Box::pin(async move {
            let result = match call {
                Ok(call) => call.result().await,
                Err(e) => Err(e),
            };
            (id, ask, result)
        }));
    }

    pub(super) async fn parent_answered(
        &mut self,
        d: &mut Driver,
        id: Id,
        ask: bool,
        result: Result<Box<RawValue>, CallError>,
    ) {
        // The connection went while a permission request waited on it: with detach the request
        // is held for the next connection (asked again on attach), not answered.
        if ask && self.t.detach.is_some() && matches!(result, Err(CallError::Closed)) {
            return;
        }
        // A permission request already answered `cancelled` stays answered.
        if ask && self.asks.remove(&id).is_none() {
            return;
        }
        if !ask {
            self.waiting.remove(&id);
        }
        self.parent_ids.remove(&id);
        self.trace(Hop::ParentToAcpd, || match &result {
            Ok(raw) => envelope::encode_reply(&id, Ok(raw)),
            Err(CallError::Rpc(e)) => envelope::encode_reply(&id, Err(e)),
            Err(CallError::Closed) => b"\"the parent is gone\"".to_vec(),
        });
        crate::metrics::to_child(crate::metrics::size(&result));
        let _ = match result {
            Ok(raw) => d.wire.respond(&id, Ok(&raw)).await,
            Err(CallError::Rpc(e)) => d.wire.respond(&id, Err(&e)).await,
            Err(CallError::Closed) => {
                let e = RpcError::internal("the parent is gone");
                d.wire.respond(&id, Err(&e)).await
            }
        };
    }
}

impl Relay {
    /// The child's `$/cancel_request` for one of its requests to the parent: the parent gets
    /// it for its own id of that request (the rest of the params, `_meta` included, as sent).
    /// One for a request acpd answered itself, or never saw, is dropped.
    async fn child_cancels(&mut self, d: &Driver, params: Option<&RawValue>) {
        let remapped =
            params.and_then(|p| remap_request_id(p, |child| self.parent_ids.get(child).cloned()));
        match remapped {
            Some((_, p)) => {
                self.to_parent(envelope::encode_notification(CANCEL_REQUEST, Some(&p)))
                    .await
            }
            None => tracing::debug!(provider = %d.shared.provider.name,
                session = %self.t.session_id, "dropping a child's $/cancel_request for no request of its waiting on the parent"),
        }
    }
}

/// The id `map` gives for `params`' `requestId`, and `params` with it in that id's place,
/// spliced in as text: the rest (`_meta`, keys as spelled, whitespace) stays byte for byte,
/// and the id is read from its text as the request's was (`1e2`, `"p\u0041"` are ids of their own, not `100.0` or `"pA"`).
/// `None` when the params are not an object with exactly one `requestId` (however its key is
/// spelled: two would leave the receiver to guess), or `map` knows no such request.
pub(super) fn remap_request_id(
    params: &RawValue,
    map: impl FnOnce(&Id) -> Option<Id>,
) -> Option<(Id, Box<RawValue>)> {
    let text = params.get();
    let fields = acpd_protocol::session_routes::entries(text)?;
    let mut named = fields.iter().filter(|(key, _)| key == "requestId");
    let (_, raw) = named.next()?;
    if named.next().is_some() {
        return None;
    }
    let other = map(&Id::from_json(raw.get()).ok()??)?;
    let span = acpd_protocol::session_routes::span_in(text, raw.get())?;
    let mut out = String::with_capacity(text.len() + 16);
    out.push_str(text.get(..span.start)?);
    out.push_str(&other.to_json());
    out.push_str(text.get(span.end..)?);
    Some((other, RawValue::from_string(out).ok()?))
}

/// Whether `params` is an array with no key naming a session anywhere in it (one that did
/// could not be rewritten, and a session not the editor's must never reach it).
fn names_no_session(params: &str) -> bool {
    params.starts_with('[') && !acpd_protocol::session_routes::names_a_session_anywhere(params)
}

/// A prompt answered `end_turn` with a typed failure record (the editor's own AIR opt-in, or
/// acpd's record) is a failed turn: the answer goes to the editor as it is, and acpd's log
/// says so with the safe diagnostic. Only an answer that mentions a record is parsed. Returns
/// the category the record names (child text, sanitized when mapped).
pub(super) fn log_reported_failure(d: &Driver, session: &str, answer: &RawValue) -> Option<String> {
    let text = answer.get();
    if !text.contains("sessionFailure") && !text.contains("\"acpd\"") {
        return None;
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        stop_reason: String,
        #[serde(default, rename = "_meta")]
        meta: serde_json::Value,
    }
    let answer = serde_json::from_str::<Answer>(text).ok()?;
    let air = air::agent_supports(&d.shared.agent.meta);
    let category = outcome::reported_failure(&answer.meta, air)?;
    let end = TurnEnd::Stopped {
        reason: ChildStopReason::parse(&answer.stop_reason),
        reported_failure: Some(category.clone()),
    };
    let mapped = outcome::map_outcome(&end, false);
    let failure = mapped.failure.as_ref()?;
    let diagnostic = diagnostic::build(&diagnostic::Facts {
        provider: &d.shared.provider.name,
        failure: Some(failure),
        stop_reason: Some(&answer.stop_reason),
        ..Default::default()
    });
    tracing::warn!(provider = %d.shared.provider.name, %session,
        category = failure.category.as_str(), "the agent reported a failed turn: {diagnostic}");
    Some(category)
}

/// Why a sandboxed child's `fs/*` request may not reach the editor, which would read or write
/// for it outside the sandbox: a `path` not beneath a directory the child may write (resolved
/// as far as it exists, so neither a symlink nor `..` leads out). `None`: it may.
fn outside_sandbox(
    limit: &crate::supervise::Confinement,
    method: &str,
    params: Option<&RawValue>,
) -> Option<RpcError> {
    if !method.starts_with("fs/") {
        return None;
    }
    use acpd_protocol::errors::ErrorName;
    use std::path::Component;
    #[derive(serde::Deserialize)]
    struct Path {
        path: std::path::PathBuf,
    }
    let asked = params.and_then(|p| serde_json::from_str::<Path>(p.get()).ok());
    let resolved = asked
        .as_ref()
        .filter(|a| {
            a.path.is_absolute()
                && a.path
                    .components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        })
        .map(|a| crate::private_fs::resolved_as_far_as_it_exists(&a.path));
    if resolved.as_ref().is_some_and(|r| limit.permits_write(r)) {
        return None;
    }
    let shown = asked.map_or_else(|| "(none)".to_string(), |a| format!("{:?}", a.path));
    let why = format!(
        "{method}: the path {shown} does not lie beneath a directory this sandboxed agent may \
         write ({}), so the editor is not asked to reach it for the agent; give an absolute \
         path in its workspace",
        limit.describe()
    );
    Some(
        RpcError::new(ErrorName::NotPermitted.code(), why)
            .with_data(serde_json::json!({ "code": ErrorName::NotPermitted.as_str() })),
    )
}
