//! How a bridge session ends for its editor: every call still open answered with why, a
//! prompt nobody will answer ended `cancelled` where ACP says so, the turn histogram told.

use super::*;

impl Relay {
    /// Every call still open gets an answer that says why the session ended.
    pub(super) async fn finish(&mut self, d: &mut Driver, end: &RelayEnd) {
        let name = &d.shared.provider.name;
        let error = match end {
            RelayEnd::ChildGone { exit_code, signal } => {
                let how = match (exit_code, signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    _ => "its output closed".to_string(),
                };
                RpcError::new(INTERNAL_ERROR, format!("agent \"{name}\" exited ({how}); the session is closed"))
                    .with_data(json!({ "provider": name, "category": "process-exit", "exitCode": exit_code, "signal": signal }))
            }
            RelayEnd::Protocol(why) => RpcError::new(
                INTERNAL_ERROR,
                format!("agent \"{name}\" sent a line acpd could not take ({why}); the session is closed: start a new one, and if it happens again, check the agent's stderr in acpd's log"),
            )
            .with_data(json!({ "provider": name, "category": "protocol" })),
            RelayEnd::ChildDeaf => RpcError::new(
                INTERNAL_ERROR,
                format!("agent \"{name}\" stopped reading its input (write_timeout); the session is closed"),
            )
            .with_data(json!({ "provider": name, "category": "hung" })),
            RelayEnd::ParentGone
            | RelayEnd::Closed
            | RelayEnd::OpenRefused
            | RelayEnd::Expired => RpcError::internal("the session was closed"),
        };
        let parent = self.t.parent.clone();
        let stop = d.shared.stop.clone();
        for id in self
            .waiting
            .drain()
            .chain(self.asks.drain().map(|(id, _)| id))
        {
            let e = RpcError::internal("the session is closed");
            let _ = d.wire.respond(&id, Err(&e)).await;
        }
        let mut calls: Vec<(Id, String)> = self.open.drain().map(|(_, call)| call).collect();
        if let Some(Queued {
            cmd: Cmd::Call { id, method, .. },
            ..
        }) = self.next.take()
        {
            calls.push((id, method));
        }
        d.cmds.close();
        // Calls after a cancel still waiting are refused for that session's end now.
        crate::child::lock(&d.shared.late_cancel).take();
        while let Ok(Queued { cmd, .. }) = d.cmds.try_recv() {
            if let Cmd::Call { id, method, .. } = cmd {
                calls.push((id, method));
            }
        }
        if !matches!(end, RelayEnd::ParentGone | RelayEnd::Expired) {
            let cancelled = ended_cancelled(end, &error);
            for (id, method) in calls {
                let outcome = match &cancelled {
                    Some(c) if method == "session/prompt" => Ok(&**c),
                    _ => Err(&error),
                };
                tokio::select! {
                    biased;
                    _ = parent.respond(&id, outcome) => {}
                    _ = stop.cancelled() => break,
                }
            }
        }
        let turn_end = match end {
            RelayEnd::ChildGone { exit_code, signal } => TurnEnd::ProcessExit {
                exit_code: *exit_code,
                signal: signal.clone(),
            }
            .with_limit(d.shared.tree.limit_hit()),
            RelayEnd::Protocol(_) => TurnEnd::Protocol,
            // Not reading its input: hung, as an idle run's child is.
            RelayEnd::ChildDeaf => TurnEnd::Idle,
            RelayEnd::OpenRefused => TurnEnd::RpcError {
                code: INTERNAL_ERROR,
            },
            // Answered `cancelled` (the editor's close, acpd stopping), or never answered
            // because the editor left: aborted, as a run its owner's end disposes.
            RelayEnd::Closed | RelayEnd::ParentGone | RelayEnd::Expired => CANCELLED_HERE,
        };
        let here = matches!(
            end,
            RelayEnd::Closed | RelayEnd::ParentGone | RelayEnd::Expired
        );
        self.prompts_ended(d, &turn_end, here);
    }

    /// Every prompt still open ended as `end` (`here`: acpd or the editor ended it):
    /// observed in the turn histogram.
    pub(super) fn prompts_ended(&mut self, d: &Driver, end: &TurnEnd, here: bool) {
        for (_, p) in self.prompts.drain() {
            observe_prompt(d, p, end, here);
        }
    }
}

/// How a prompt ends that acpd (not the agent) ended for the editor: its close, acpd
/// stopping, the editor leaving before the answer. Aborted, as a run its owner's end disposes.
pub(super) const CANCELLED_HERE: TurnEnd = TurnEnd::Stopped {
    reason: ChildStopReason::Cancelled,
    reported_failure: None,
};

/// The answer to a prompt still open when its session ends as `end` with no answer of the
/// agent's, if it is not `error`: the turn ends `cancelled`, as ACP ends a turn nobody will
/// answer (an editor reads −32603 as acpd failing), when the editor closed the session, acpd
/// stopped, or the agent exited — then `_meta.acpd.sessionEnded` names the exit in the words
/// and `data` other open calls get as their error. A session acpd ended because of what the
/// agent sent (a bad line, not reading) keeps its error: it says what acpd refused and what to
/// do next.
fn ended_cancelled(end: &RelayEnd, error: &RpcError) -> Option<Box<RawValue>> {
    match end {
        RelayEnd::Closed => Some(envelope::to_raw(&json!({ "stopReason": "cancelled" }))),
        RelayEnd::ChildGone { .. } => Some(envelope::to_raw(&json!({
            "stopReason": "cancelled",
            "_meta": { "acpd": { "sessionEnded": {
                "message": error.message, "data": error.data_value(),
            } } },
        }))),
        _ => None,
    }
}
