//! The typed request and reply bodies of acpd's own `_acpd/*` methods, and their names.
//!
//! Bodies are camelCase, as ACP's own are. Requests accept fields they do not know (a newer
//! caller may send more) but reject a known field of the wrong type; params must be a JSON
//! object (or absent where the method takes none), never a positional array.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::acp::ContentBlock;
use crate::subagent::ProviderInfo;

/// Method names.
pub mod name {
    pub const PROVIDERS: &str = "_acpd/providers";
    pub const STATUS: &str = "_acpd/status";
    pub const RUNS: &str = "_acpd/runs";
    pub const START: &str = "_acpd/subagent/start";
    pub const WAIT: &str = "_acpd/subagent/wait";
    pub const CANCEL: &str = "_acpd/subagent/cancel";
    pub const DISPOSE: &str = "_acpd/subagent/dispose";
    pub const SEND: &str = "_acpd/subagent/send";
    pub const LIST: &str = "_acpd/subagent/list";
    /// The operator's: re-read the daemon's config (only acpd's own user may).
    pub const RELOAD: &str = "_acpd/reload";
    /// The operator's: read the network tokens again (`acpd token create`/`revoke` ask it, so
    /// a revoked token's connections end at once). Only acpd's own user may.
    pub const TOKENS_RELOAD: &str = "_acpd/tokens/reload";
    /// The operator's: the daemon's metrics in Prometheus text format ([`super::MetricsReply`]).
    pub const METRICS: &str = "_acpd/metrics";
    /// Notification: a turn started ([`crate::subagent::Started`]).
    pub const STARTED: &str = "_acpd/subagent/started";
    /// Notification: a turn settled ([`crate::subagent::Ended`]).
    pub const ENDED: &str = "_acpd/subagent/ended";
    /// Every method and notification name is under this prefix; a child may never send one.
    pub const PREFIX: &str = "_acpd/";

    /// The requests a parent may call (not the notifications acpd sends).
    pub const REQUESTS: [&str; 12] = [
        PROVIDERS,
        STATUS,
        RUNS,
        START,
        WAIT,
        CANCEL,
        DISPOSE,
        SEND,
        LIST,
        RELOAD,
        TOKENS_RELOAD,
        METRICS,
    ];
}

/// Reads a method's params into `T`: absent params read as `{}` (so a method without required
/// fields needs none), anything other than a JSON object is refused. The error is the detail for
/// a −33012 INVALID_REQUEST (or −32602) answer.
pub fn parse_params<T: DeserializeOwned>(params: Option<&RawValue>) -> Result<T, String> {
    let text = params.map_or("{}", RawValue::get);
    if !text.starts_with('{') {
        return Err("params must be a JSON object".into());
    }
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// No fields: the params of `_acpd/providers`, `status`, `runs`, `subagent/list`, and the reply
/// of `subagent/cancel`. Serialises as `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// `_acpd/subagent/wait`, `cancel`, `dispose`: which run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    pub run_id: String,
}

/// `_acpd/subagent/dispose`: which run, whether its worktree's branch stays (it does
/// unless `keepBranch` is `false`), and whether a worktree whose work git refuses to commit
/// is removed all the same (only with `force: true`; else it stays, and the reply says so).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DisposeRequest {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_branch: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}

/// `_acpd/subagent/dispose`'s reply: `{}`, or the worktree it kept because the work in it
/// could not be committed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DisposeReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<crate::subagent::WorkspaceFailure>,
}

/// `_acpd/subagent/start`'s reply (its request is [`crate::subagent::StartRequest`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartReply {
    pub run_id: String,
    pub session_id: String,
}

/// `_acpd/subagent/send`: a follow-up turn on a kept-alive run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendRequest {
    pub run_id: String,
    pub prompt: Vec<ContentBlock>,
}

/// `_acpd/subagent/send`'s reply: the turn that started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendReply {
    pub run_id: String,
    pub turn: u32,
}

/// `_acpd/providers`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvidersReply {
    pub providers: Vec<ProviderInfo>,
}

/// `_acpd/subagent/list`'s reply: the caller's runs that are not disposed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListReply {
    pub runs: Vec<RunSummary>,
}

/// One run in `_acpd/subagent/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub run_id: String,
    pub session_id: String,
    pub provider: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `running`, `settled` or `disposed` (a string, so a newer state is still readable).
    pub state: String,
    /// The current or last turn; absent once disposed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    pub depth: u32,
}

/// `_acpd/runs`'s reply: every live run of the daemon (operators' view, any connection).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunsReply {
    pub runs: Vec<RunInfo>,
    /// Bridge sessions of the asking user (all of them: attached and detached).
    #[serde(default)]
    pub sessions: Vec<SessionEntry>,
}

/// One live bridge session in `_acpd/runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEntry {
    pub session_id: String,
    pub provider: String,
    pub pid: i32,
    /// `attached` or `detached`.
    pub state: String,
}

/// One run in `_acpd/runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunInfo {
    pub run_id: String,
    pub provider: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub state: String,
    /// Seconds since the run started.
    pub age_s: u64,
    /// The child's pid while it lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    pub depth: u32,
    /// The id of the connection that owns the run.
    pub connection: u64,
    /// Whose child started this run (nested delegation): `run:<run id>` or
    /// `session:<acpd session id>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Tokens spent by this run and every run nested under it (what its budget counts).
    #[serde(default)]
    pub tokens: u64,
    /// The run's budget in force, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<RunBudget>,
}

/// A run's budget as `_acpd/runs` shows it: tokens, and wall time in seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<u64>,
}

/// `_acpd/reload`'s reply: the config now in force. A rejected file is a CONFIG_REJECTED error
/// instead, and the previous config stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReloadReply {
    /// The file read; `None` when no file exists and the built-in defaults are in force.
    pub source: Option<String>,
    /// Provider names.
    pub providers: Vec<String>,
    pub default_provider: String,
}

/// `_acpd/metrics`'s reply: what `metrics_listen` serves at `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsReply {
    /// The `Content-Type` of `text`.
    pub content_type: String,
    /// The exposition, in Prometheus text format 0.0.4.
    pub text: String,
}

/// `_acpd/status`'s reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReply {
    pub version: String,
    pub pid: u32,
    pub uptime_s: u64,
    pub connections: u64,
    /// Runs not disposed.
    pub runs: u64,
    /// Provider names.
    pub providers: Vec<String>,
    pub limits: StatusLimits,
    /// Bridge sessions: open on a connection, and detached (waiting to be loaded again).
    #[serde(default)]
    pub sessions: SessionLoad,
    /// Warm spares ready per provider (`warm`).
    #[serde(default)]
    pub spares: BTreeMap<String, u64>,
    /// How this daemon contains its children's process trees, and why.
    #[serde(default)]
    pub containment: StatusContainment,
    /// The network face's endpoints (`listen`), with the ports bound: `https://IP:PORT/acp`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listening: Vec<String>,
}

/// `_acpd/status` `containment`: `mode` is `cgroup` or `process-group`; `path` the daemon's
/// base cgroup (cgroup mode); `controllers` those its children's limits can use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusContainment {
    pub mode: String,
    pub reason: String,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub controllers: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionLoad {
    pub attached: u64,
    pub detached: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusLimits {
    pub max_children: u64,
    pub live_children: u64,
    /// Starts waiting for a free slot (`queue_timeout`).
    #[serde(default)]
    pub queued: u64,
    #[serde(default)]
    pub queue_timeout_s: Option<f64>,
    pub providers: BTreeMap<String, ProviderLoad>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderLoad {
    pub max_concurrent: u64,
    pub live: u64,
    /// The sandbox really enforced for its children (`landlock (ABI 7)`, `none`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subagent::Capabilities;
    use serde_json::json;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    /// `value` serialises to `expected` and reads back as itself.
    fn round_trip<T>(value: &T, expected: serde_json::Value)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let v = serde_json::to_value(value).unwrap();
        assert_eq!(v, expected);
        let back: T = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(&back, value);
        let back: T = parse_params(Some(&raw(&v.to_string()))).unwrap();
        assert_eq!(&back, value);
    }

    #[test]
    fn bodies_have_todays_json_shapes() {
        round_trip(&Empty {}, json!({}));
        round_trip(
            &RunRef {
                run_id: "r1".into(),
            },
            json!({"runId": "r1"}),
        );
        round_trip(
            &StartReply {
                run_id: "r1".into(),
                session_id: "s1".into(),
            },
            json!({"runId": "r1", "sessionId": "s1"}),
        );
        round_trip(
            &SendRequest {
                run_id: "r1".into(),
                prompt: vec![ContentBlock::from("again".to_string())],
            },
            json!({"runId": "r1", "prompt": [{"type": "text", "text": "again"}]}),
        );
        round_trip(
            &SendReply {
                run_id: "r1".into(),
                turn: 2,
            },
            json!({"runId": "r1", "turn": 2}),
        );
        round_trip(
            &ProvidersReply {
                providers: vec![ProviderInfo {
                    name: "echo".into(),
                    description: "d".into(),
                    capabilities: Capabilities::default(),
                    inherits_parent_context: false,
                    default: true,
                    workspace: None,
                    sandbox: None,
                }],
            },
            json!({"providers": [{
                "name": "echo", "description": "d",
                "capabilities": {"outputSchema": false, "depthLimit": false, "toolFilter": false, "persona": false},
                "inheritsParentContext": false, "default": true,
            }]}),
        );
        round_trip(
            &ListReply {
                runs: vec![
                    RunSummary {
                        run_id: "r1".into(),
                        session_id: "s1".into(),
                        provider: "echo".into(),
                        label: Some("l".into()),
                        state: "running".into(),
                        turn: Some(1),
                        depth: 1,
                    },
                    RunSummary {
                        run_id: "r2".into(),
                        session_id: "s2".into(),
                        provider: "echo".into(),
                        label: None,
                        state: "disposed".into(),
                        turn: None,
                        depth: 0,
                    },
                ],
            },
            json!({"runs": [
                {"runId": "r1", "sessionId": "s1", "provider": "echo", "label": "l", "state": "running", "turn": 1, "depth": 1},
                {"runId": "r2", "sessionId": "s2", "provider": "echo", "state": "disposed", "depth": 0},
            ]}),
        );
        round_trip(
            &RunsReply {
                runs: vec![RunInfo {
                    run_id: "r1".into(),
                    provider: "echo".into(),
                    label: None,
                    state: "settled".into(),
                    age_s: 3,
                    pid: Some(42),
                    depth: 0,
                    connection: 7,
                    parent: Some("session:acpd-1".into()),
                    tokens: 1200,
                    budget: Some(RunBudget {
                        tokens: Some(5000),
                        wall_s: None,
                    }),
                }],
                sessions: vec![SessionEntry {
                    session_id: "acpd-1".into(),
                    provider: "echo".into(),
                    pid: 43,
                    state: "detached".into(),
                }],
            },
            json!({"runs": [{"runId": "r1", "provider": "echo", "state": "settled", "ageS": 3, "pid": 42, "depth": 0, "connection": 7, "parent": "session:acpd-1", "tokens": 1200, "budget": {"tokens": 5000}}],
                "sessions": [{"sessionId": "acpd-1", "provider": "echo", "pid": 43, "state": "detached"}]}),
        );
        round_trip(
            &StatusReply {
                version: "0.1.0".into(),
                pid: 9,
                uptime_s: 5,
                connections: 1,
                runs: 2,
                providers: vec!["echo".into()],
                limits: StatusLimits {
                    max_children: 256,
                    live_children: 2,
                    queued: 1,
                    queue_timeout_s: Some(1.5),
                    providers: [(
                        "echo".to_string(),
                        ProviderLoad {
                            max_concurrent: 64,
                            live: 2,
                            sandbox: None,
                        },
                    )]
                    .into(),
                },
                sessions: SessionLoad {
                    attached: 1,
                    detached: 2,
                },
                spares: [("echo".to_string(), 1)].into(),
                containment: StatusContainment {
                    mode: "cgroup".into(),
                    reason: "cgroup v2 writable at /sys/fs/cgroup".into(),
                    path: Some("/sys/fs/cgroup/acpd-9-5".into()),
                    controllers: vec!["pids".into()],
                },
                listening: vec![],
            },
            json!({"version": "0.1.0", "pid": 9, "uptimeS": 5, "connections": 1, "runs": 2,
                "providers": ["echo"],
                "limits": {"maxChildren": 256, "liveChildren": 2, "queued": 1, "queueTimeoutS": 1.5,
                    "providers": {"echo": {"maxConcurrent": 64, "live": 2}}},
                "sessions": {"attached": 1, "detached": 2}, "spares": {"echo": 1},
                "containment": {"mode": "cgroup", "reason": "cgroup v2 writable at /sys/fs/cgroup",
                    "path": "/sys/fs/cgroup/acpd-9-5", "controllers": ["pids"]}}),
        );
    }

    #[test]
    fn todays_null_fields_still_read() {
        // Today's `json!` bodies write `"label": null` and `"turn": null`.
        let s: RunSummary = serde_json::from_value(json!({"runId": "r", "sessionId": "s",
            "provider": "p", "label": null, "state": "disposed", "turn": null, "depth": 0}))
        .unwrap();
        assert_eq!((s.label, s.turn), (None, None));
        let s: StatusLimits = serde_json::from_value(json!({"maxChildren": 1, "liveChildren": 0,
            "queueTimeoutS": null, "providers": {}}))
        .unwrap();
        assert_eq!(s.queue_timeout_s, None);
    }

    #[test]
    fn unknown_fields_are_accepted_wrong_types_refused() {
        let r: RunRef = parse_params(Some(&raw(r#"{"runId":"r","future":[1]}"#))).unwrap();
        assert_eq!(r.run_id, "r");
        let _: Empty = parse_params(Some(&raw(r#"{"anything":true}"#))).unwrap();
        let _: Empty = parse_params(None).unwrap();
        for bad in [
            r#"{"runId":7}"#,
            r#"{"runId":null}"#,
            r#"{}"#,
            r#"["r"]"#,
            r#""r""#,
            "null",
            r#"{"runId":"r","runId":"s"}"#,
        ] {
            assert!(parse_params::<RunRef>(Some(&raw(bad))).is_err(), "{bad}");
        }
        assert!(parse_params::<RunRef>(None).is_err());
        assert!(parse_params::<Empty>(Some(&raw("[]"))).is_err());
        for bad in [
            r#"{"runId":"r"}"#,
            r#"{"runId":"r","prompt":"text"}"#,
            r#"{"runId":"r","prompt":[{"type":"text"}]}"#,
            r#"{"runId":1,"prompt":[]}"#,
        ] {
            assert!(
                parse_params::<SendRequest>(Some(&raw(bad))).is_err(),
                "{bad}"
            );
        }
        let s: SendRequest =
            parse_params(Some(&raw(r#"{"runId":"r","prompt":[],"x":1}"#))).unwrap();
        assert!(s.prompt.is_empty());
        assert!(serde_json::from_str::<SendReply>(r#"{"runId":"r","turn":-1}"#).is_err());
    }

    #[test]
    fn names_are_under_the_prefix() {
        for n in name::REQUESTS.iter().chain([&name::STARTED, &name::ENDED]) {
            assert!(n.starts_with(name::PREFIX), "{n}");
        }
    }
}
