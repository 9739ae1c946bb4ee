//! The one mapping from whatever a child did in a turn to a subagent stop reason and failure
//! category (DESIGN.md's outcome table). Pure and exhaustive: every way a turn can end is a
//! variant of [`TurnEnd`], and a stop reason acpd does not know is a value, not a parse error.

use crate::envelope::AUTH_REQUIRED;
use crate::subagent::{Category, Failure, Stage, StopReason};

/// A child's `session/prompt` stop reason, as ACP defines it, plus whatever else a child sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildStopReason {
    EndTurn,
    MaxTokens,
    MaxTurnRequests,
    Refusal,
    Cancelled,
    Unknown(String),
}

impl ChildStopReason {
    pub fn parse(wire: &str) -> Self {
        match wire {
            "end_turn" => Self::EndTurn,
            "max_tokens" => Self::MaxTokens,
            "max_turn_requests" => Self::MaxTurnRequests,
            "refusal" => Self::Refusal,
            "cancelled" => Self::Cancelled,
            other => Self::Unknown(other.to_string()),
        }
    }

    pub fn as_wire(&self) -> &str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::MaxTurnRequests => "max_turn_requests",
            Self::Refusal => "refusal",
            Self::Cancelled => "cancelled",
            Self::Unknown(s) => s,
        }
    }
}

/// Everything that can end a turn after publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The child answered `session/prompt` with a stop reason. `reported_failure` is the
    /// category of a typed failure record in the response's `_meta.acpd.failure`, if any.
    Stopped {
        reason: ChildStopReason,
        reported_failure: Option<String>,
    },
    /// The child answered `session/prompt` with a JSON-RPC error.
    RpcError { code: i64 },
    /// The pipe closed or the process exited before the child answered.
    ProcessExit {
        exit_code: Option<i32>,
        signal: Option<String>,
    },
    /// The process exited (as in `ProcessExit`) after its tree ran into a cgroup limit.
    LimitExceeded {
        limit: ResourceLimit,
        exit_code: Option<i32>,
        signal: Option<String>,
    },
    /// The run's `run_timeout` was reached.
    RunTimeout,
    /// The run, or a run above it, spent its budget (tokens or wall time).
    Budget,
    /// No message and no pending request for `idle_timeout`.
    Idle,
    /// The child sent a line that is not JSON-RPC, not UTF-8, or over the line cap.
    Protocol,
    /// Cancelled by the parent, by dispose or by Ctrl-C, and the child did not confirm it in
    /// time.
    Abandoned,
    /// A tool the run's filter forbids ran anyway; acpd cancelled the turn and ends the child.
    ToolFilter,
}

/// A cgroup limit a child's tree can run into (`memory_max`, `pids_max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceLimit {
    Memory,
    Pids,
}

impl TurnEnd {
    /// A process exit becomes [`TurnEnd::LimitExceeded`] when the tree hit `limit`: the result
    /// says `oom` / `pids` instead of a bare crash. Any other end is kept.
    pub fn with_limit(self, limit: Option<ResourceLimit>) -> TurnEnd {
        match (self, limit) {
            (TurnEnd::ProcessExit { exit_code, signal }, Some(limit)) => TurnEnd::LimitExceeded {
                limit,
                exit_code,
                signal,
            },
            (end, _) => end,
        }
    }
}

/// The mapped outcome of a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub stop_reason: StopReason,
    pub failure: Option<Failure>,
}

/// Maps a turn's end to its result. `cancel_requested` says whether acpd asked the child to
/// cancel on behalf of the parent (parent cancel, dispose, Ctrl-C); a child that then dies or
/// errors instead of confirming was still cancelled, so the result is `aborted`.
pub fn map_outcome(end: &TurnEnd, cancel_requested: bool) -> Mapped {
    let fail = |category: Category| Mapped {
        stop_reason: StopReason::Error,
        failure: Some(Failure {
            stage: Stage::Prompt,
            category,
            code: None,
            exit_code: None,
            signal: None,
        }),
    };
    let plain = |stop_reason| Mapped {
        stop_reason,
        failure: None,
    };
    let aborted = plain(StopReason::Aborted);
    match end {
        TurnEnd::Stopped {
            reason,
            reported_failure,
        } => match reason {
            ChildStopReason::EndTurn => match reported_failure.as_deref().map(sanitize_category) {
                // acpd's own auth category: the diagnostic then names what would satisfy it.
                Some(cat) if cat == Category::Auth.as_str() => fail(Category::Auth),
                Some(cat) => fail(Category::Reported(cat)),
                None => plain(StopReason::Completed),
            },
            ChildStopReason::MaxTokens => plain(StopReason::MaxTokens),
            ChildStopReason::MaxTurnRequests => fail(Category::RemoteLimit),
            ChildStopReason::Refusal => plain(StopReason::Refusal),
            ChildStopReason::Cancelled if cancel_requested => aborted,
            ChildStopReason::Cancelled => Mapped {
                stop_reason: StopReason::Aborted,
                failure: Some(Failure {
                    stage: Stage::Prompt,
                    category: Category::RemoteCancel,
                    code: None,
                    exit_code: None,
                    signal: None,
                }),
            },
            ChildStopReason::Unknown(_) => fail(Category::UnknownStopReason),
        },
        TurnEnd::RpcError { .. } | TurnEnd::ProcessExit { .. } | TurnEnd::LimitExceeded { .. }
            if cancel_requested =>
        {
            aborted
        }
        TurnEnd::RpcError { code } => {
            let category = if *code == AUTH_REQUIRED {
                Category::Auth
            } else {
                Category::Rpc
            };
            let mut m = fail(category);
            if let Some(f) = m.failure.as_mut() {
                f.code = Some(*code);
            }
            m
        }
        TurnEnd::ProcessExit { exit_code, signal } => {
            let mut m = fail(Category::ProcessExit);
            if let Some(f) = m.failure.as_mut() {
                f.exit_code = *exit_code;
                f.signal = signal.clone();
            }
            m
        }
        TurnEnd::LimitExceeded {
            limit,
            exit_code,
            signal,
        } => {
            let mut m = fail(match limit {
                ResourceLimit::Memory => Category::Oom,
                ResourceLimit::Pids => Category::Pids,
            });
            if let Some(f) = m.failure.as_mut() {
                f.exit_code = *exit_code;
                f.signal = signal.clone();
            }
            m
        }
        TurnEnd::RunTimeout => fail(Category::Timeout),
        TurnEnd::Budget => fail(Category::Budget),
        TurnEnd::Idle => fail(Category::Hung),
        TurnEnd::Protocol => fail(Category::Protocol),
        TurnEnd::Abandoned => aborted,
        TurnEnd::ToolFilter => fail(Category::ToolFilter),
    }
}

/// The category of a typed failure record in a `session/prompt` result's `_meta`, when it
/// carries one: acpd's own `_meta.acpd.failure.category`, else — only when `air` says the
/// agent negotiated it at `initialize` — the JetBrains AIR `sessionFailure` record (see
/// [`air`]). The category is child text: it is sanitized when mapped.
pub fn reported_failure(meta: &serde_json::Value, air: bool) -> Option<String> {
    if let Some(category) = meta
        .pointer("/acpd/failure/category")
        .and_then(|c| c.as_str())
    {
        return Some(category.to_string());
    }
    if air {
        return air::failure_category(meta);
    }
    None
}

/// The JetBrains AIR `sessionFailure` extension, as codex-acp defines it in its
/// `docs/air-extensions.md` ("Negotiation", "Session failure"). A client is AIR when its
/// `initialize` carries `clientCapabilities._meta.jetbrains.air = {version: 1, capabilities:
/// [..]}`; the agent then lists what it supports in the `initialize` result's
/// `_meta.jetbrains.air.capabilities`. With `sessionFailure` negotiated, a failed turn ends
/// with `stopReason: end_turn` and the record at `PromptResponse._meta.jetbrains.air.
/// sessionFailure = {id, revision, category, severity, title, details?, actions}` instead of
/// a JSON-RPC error — so `end_turn` alone is not success. Auth failures stay ACP's −32000.
pub mod air {
    use serde_json::{Map, Value, json};

    /// The capability name, on both sides.
    pub const SESSION_FAILURE: &str = "sessionFailure";

    /// Adds the opt-in to a client's `clientCapabilities._meta`, keeping every other key: an
    /// AIR declaration already there keeps its version and capabilities and gains
    /// `sessionFailure`.
    pub fn declare(meta: &mut Map<String, Value>) {
        let jetbrains = meta
            .entry("jetbrains")
            .or_insert_with(|| Value::Object(Map::new()));
        if !jetbrains.is_object() {
            *jetbrains = Value::Object(Map::new());
        }
        let Some(jetbrains) = jetbrains.as_object_mut() else {
            return;
        };
        let air = jetbrains
            .entry("air")
            .or_insert_with(|| json!({ "version": 1, "capabilities": [] }));
        let valid = air
            .get("version")
            .and_then(Value::as_u64)
            .is_some_and(|v| v >= 1)
            && air.get("capabilities").is_some_and(Value::is_array);
        if !valid {
            *air = json!({ "version": 1, "capabilities": [] });
        }
        if let Some(caps) = air.get_mut("capabilities").and_then(Value::as_array_mut)
            && !caps.iter().any(|c| c == SESSION_FAILURE)
        {
            caps.push(Value::String(SESSION_FAILURE.into()));
        }
    }

    /// Whether an agent's `initialize` result `_meta` lists `sessionFailure`.
    pub fn agent_supports(init_meta: &Value) -> bool {
        init_meta
            .pointer("/jetbrains/air/capabilities")
            .and_then(Value::as_array)
            .is_some_and(|caps| caps.iter().any(|c| c == SESSION_FAILURE))
    }

    /// The category of a `session/prompt` result's failure record, when `meta` (the result's
    /// `_meta`) holds one of severity `error` with a category. A `warning` does not end a turn
    /// (the document's "Delivery"), so it is not a failure; a record without a category is
    /// not one either. AIR's `access` (claude-agent-acp's sign-in and access failures, action
    /// `login`) is acpd's `auth`, so its diagnostic names what would satisfy the agent.
    pub fn failure_category(meta: &Value) -> Option<String> {
        let record = meta.pointer("/jetbrains/air/sessionFailure")?;
        if record.get("severity").and_then(Value::as_str) != Some("error") {
            return None;
        }
        let category = record
            .get("category")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())?;
        Some(
            if category == "access" {
                "auth"
            } else {
                category
            }
            .to_string(),
        )
    }
}

/// A child-reported category is child-controlled text: keep `[a-z0-9-]`, at most 64 bytes.
fn sanitize_category(raw: &str) -> String {
    let s: String = raw
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(64)
        .collect();
    if s.is_empty() { "reported".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(reason: &str) -> TurnEnd {
        TurnEnd::Stopped {
            reason: ChildStopReason::parse(reason),
            reported_failure: None,
        }
    }

    fn cat(m: &Mapped) -> Option<&str> {
        m.failure.as_ref().map(|f| f.category.as_str())
    }

    #[test]
    fn end_turn_is_completed() {
        let m = map_outcome(&stopped("end_turn"), false);
        assert_eq!((m.stop_reason, cat(&m)), (StopReason::Completed, None));
    }

    #[test]
    fn end_turn_with_reported_failure_is_error() {
        let end = TurnEnd::Stopped {
            reason: ChildStopReason::EndTurn,
            reported_failure: Some("Quota Exceeded!".into()),
        };
        let m = map_outcome(&end, false);
        assert_eq!(m.stop_reason, StopReason::Error);
        assert_eq!(cat(&m), Some("quotaexceeded"));
    }

    #[test]
    fn air_declaration_is_added_and_kept() {
        let mut meta = serde_json::Map::new();
        air::declare(&mut meta);
        assert_eq!(
            serde_json::Value::Object(meta.clone()),
            serde_json::json!({"jetbrains": {"air": {"version": 1, "capabilities": ["sessionFailure"]}}})
        );
        air::declare(&mut meta);
        assert_eq!(
            meta["jetbrains"]["air"]["capabilities"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
        let mut theirs = serde_json::json!({
            "terminal_output": true,
            "jetbrains": {"air": {"version": 2, "capabilities": ["diffPatch"]}, "other": 1}
        });
        air::declare(theirs.as_object_mut().unwrap());
        assert_eq!(
            theirs,
            serde_json::json!({
                "terminal_output": true,
                "jetbrains": {"air": {"version": 2, "capabilities": ["diffPatch", "sessionFailure"]}, "other": 1}
            })
        );
    }

    #[test]
    fn air_agent_support_and_records() {
        let init = serde_json::json!({"steering": {"supported": true},
            "jetbrains": {"air": {"version": 1, "capabilities": ["diffPatch", "sessionFailure"]}}});
        assert!(air::agent_supports(&init));
        assert!(!air::agent_supports(
            &serde_json::json!({"steering": {"supported": true}})
        ));
        let record = |severity: &str| {
            serde_json::json!({"quota": {}, "jetbrains": {"air": {"version": 1, "sessionFailure": {
                "id": "turn-7:error", "revision": 1, "category": "limit", "severity": severity,
                "title": "You've hit your usage limit.", "actions": []}}}})
        };
        assert_eq!(
            air::failure_category(&record("error")).as_deref(),
            Some("limit")
        );
        assert_eq!(air::failure_category(&record("warning")), None);
        assert_eq!(
            reported_failure(&record("error"), true).as_deref(),
            Some("limit")
        );
        // Not negotiated: the record is not read.
        assert_eq!(reported_failure(&record("error"), false), None);
        let access = serde_json::json!({"jetbrains": {"air": {"sessionFailure": {
            "id": "t:error", "revision": 1, "category": "access", "severity": "error",
            "title": "Sign in to continue using Claude.", "actions": ["login"]}}}});
        assert_eq!(air::failure_category(&access).as_deref(), Some("auth"));
        let end = TurnEnd::Stopped {
            reason: ChildStopReason::EndTurn,
            reported_failure: reported_failure(&access, true),
        };
        let m = map_outcome(&end, false);
        assert_eq!(m.failure.map(|f| f.category), Some(Category::Auth));
        let acpd = serde_json::json!({"acpd": {"failure": {"category": "quota"}}});
        assert_eq!(reported_failure(&acpd, false).as_deref(), Some("quota"));
    }

    #[test]
    fn max_tokens_refusal_and_limits() {
        let m = map_outcome(&stopped("max_tokens"), false);
        assert_eq!((m.stop_reason, cat(&m)), (StopReason::MaxTokens, None));
        let m = map_outcome(&stopped("refusal"), false);
        assert_eq!((m.stop_reason, cat(&m)), (StopReason::Refusal, None));
        let m = map_outcome(&stopped("max_turn_requests"), false);
        assert_eq!(
            (m.stop_reason, cat(&m)),
            (StopReason::Error, Some("remote-limit"))
        );
    }

    #[test]
    fn cancelled_is_aborted_and_remote_when_unasked() {
        let m = map_outcome(&stopped("cancelled"), true);
        assert_eq!((m.stop_reason, cat(&m)), (StopReason::Aborted, None));
        let m = map_outcome(&stopped("cancelled"), false);
        assert_eq!(
            (m.stop_reason, cat(&m)),
            (StopReason::Aborted, Some("remote-cancel"))
        );
    }

    #[test]
    fn unknown_stop_reason_is_an_error_value() {
        let m = map_outcome(&stopped("finished_early"), false);
        assert_eq!(
            (m.stop_reason, cat(&m)),
            (StopReason::Error, Some("unknown-stop-reason"))
        );
    }

    #[test]
    fn rpc_errors_keep_their_code() {
        let m = map_outcome(&TurnEnd::RpcError { code: -32603 }, false);
        assert_eq!(cat(&m), Some("rpc"));
        assert_eq!(m.failure.unwrap().code, Some(-32603));
        let m = map_outcome(&TurnEnd::RpcError { code: -32000 }, false);
        assert_eq!((m.stop_reason, cat(&m)), (StopReason::Error, Some("auth")));
    }

    #[test]
    fn process_exit_keeps_status() {
        let end = TurnEnd::ProcessExit {
            exit_code: Some(3),
            signal: None,
        };
        let m = map_outcome(&end, false);
        assert_eq!(m.stop_reason, StopReason::Error);
        let f = m.failure.unwrap();
        assert_eq!(
            (f.category.as_str(), f.exit_code),
            ("process-exit", Some(3))
        );
    }

    #[test]
    fn a_limit_hit_is_oom_or_pids_not_a_bare_crash() {
        let crash = || TurnEnd::ProcessExit {
            exit_code: None,
            signal: Some("SIGKILL".into()),
        };
        assert_eq!(crash().with_limit(None), crash());
        assert_eq!(
            TurnEnd::Idle.with_limit(Some(ResourceLimit::Memory)),
            TurnEnd::Idle
        );
        for (limit, c) in [
            (ResourceLimit::Memory, "oom"),
            (ResourceLimit::Pids, "pids"),
        ] {
            let m = map_outcome(&crash().with_limit(Some(limit)), false);
            assert_eq!((m.stop_reason, cat(&m)), (StopReason::Error, Some(c)));
            let f = m.failure.unwrap();
            assert_eq!(f.signal.as_deref(), Some("SIGKILL"));
            // Cancelled by acpd first: still the parent's abort.
            let m = map_outcome(&crash().with_limit(Some(limit)), true);
            assert_eq!((m.stop_reason, cat(&m)), (StopReason::Aborted, None));
        }
        assert_eq!(Category::Oom.as_str(), "oom");
        assert_eq!(
            serde_json::to_value(Category::Pids).unwrap(),
            serde_json::json!("pids")
        );
    }

    #[test]
    fn limits_and_protocol_faults() {
        for (end, c) in [
            (TurnEnd::RunTimeout, "timeout"),
            (TurnEnd::Budget, "budget"),
            (TurnEnd::Idle, "hung"),
            (TurnEnd::Protocol, "protocol"),
            // A forbidden tool that ran: acpd's cancel does not make it an abort.
            (TurnEnd::ToolFilter, "tool-filter"),
        ] {
            for cancel in [false, true] {
                let m = map_outcome(&end, cancel);
                assert_eq!((m.stop_reason, cat(&m)), (StopReason::Error, Some(c)));
            }
        }
    }

    #[test]
    fn local_cancel_wins_over_a_dying_child() {
        assert_eq!(
            map_outcome(&TurnEnd::Abandoned, true).stop_reason,
            StopReason::Aborted
        );
        let end = TurnEnd::ProcessExit {
            exit_code: None,
            signal: Some("SIGTERM".into()),
        };
        let m = map_outcome(&end, true);
        assert_eq!((m.stop_reason, cat(&m)), (StopReason::Aborted, None));
        let m = map_outcome(&TurnEnd::RpcError { code: -32603 }, true);
        assert_eq!(m.stop_reason, StopReason::Aborted);
    }
}
