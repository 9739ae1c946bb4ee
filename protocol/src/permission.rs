//! Answering a child's `session/request_permission` by policy, as one pure function shared by
//! runs (collect mode) and bridge sessions (relay mode).
//!
//! An option is picked by its `kind`, never by its position or its name (a child may label a
//! rejecting option "Allow"); with no option of a wanted kind the answer is `cancelled`. An
//! option of a kind acpd's schema does not know (`allow_session`) is never picked, since what
//! it allows is not known, and never makes the request malformed: the others are still picked
//! from. A request acpd answers itself must otherwise be what ACP's schema says (−32602 if
//! not); one it forwards need only be an object naming its session, since whoever is asked
//! reads it, not acpd.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::acp::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome,
};
use crate::session_id::session_id;

/// A provider's `permission` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Pick an allowing option.
    Allow,
    /// Pick a rejecting option.
    Reject,
    /// Ask whoever can answer (the parent over ACP, or the user on a terminal).
    #[default]
    Forward,
}

/// The decision acpd takes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    Allow,
    Reject,
}

/// What to do with one `session/request_permission`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one short-lived value per permission request, moved once"
)]
pub enum PolicyAnswer {
    /// Answer the child with this.
    Answer(RequestPermissionResponse),
    /// Answer the child with −32602 and this detail.
    InvalidParams(String),
    /// Ask whoever can answer; the params are an object naming a session.
    Forward,
}

/// The answer for `decision`: the first option whose kind is the once-kind, else the
/// always-kind, else `cancelled`.
pub fn decide(request: &RequestPermissionRequest, decision: Decision) -> RequestPermissionResponse {
    let preference: &[PermissionOptionKind] = match decision {
        Decision::Allow => &[
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
        ],
        Decision::Reject => &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ],
    };
    let chosen = preference
        .iter()
        .find_map(|kind| request.options.iter().find(|o| &o.kind == kind));
    match chosen {
        Some(option) => RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
            SelectedPermissionOutcome::new(option.option_id.clone()),
        )),
        None => cancelled(),
    }
}

/// The `cancelled` outcome (a cancelled turn, or no option of the wanted kind).
pub fn cancelled() -> RequestPermissionResponse {
    RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)
}

/// Reads a request's params: an object that ACP's schema accepts once the options of kinds it
/// does not know are left out.
pub fn parse_request(params: Option<&RawValue>) -> Result<RequestPermissionRequest, String> {
    let Some(params) = params else {
        return Err("session/request_permission needs params".into());
    };
    // The schema's derived deserialiser would also take a JSON array, field by field.
    let mut value = match serde_json::from_str(params.get()) {
        Ok(serde_json::Value::Object(value)) => value,
        _ => return Err("session/request_permission params must be an object".into()),
    };
    if let Some(serde_json::Value::Array(options)) = value.get_mut("options") {
        options.retain(|o| match o.get("kind") {
            Some(kind) => PermissionOptionKind::deserialize(kind).is_ok() || !kind.is_string(),
            None => true,
        });
    }
    serde_json::from_value(serde_json::Value::Object(value))
        .map_err(|e| format!("session/request_permission: {e}"))
}

/// The whole policy: under `forward`, only a check that the params are an object naming a
/// session (the one asked reads the rest); otherwise parse, then answer by `policy`.
pub fn answer_by_policy(policy: Policy, params: Option<&RawValue>) -> PolicyAnswer {
    let decision = match policy {
        Policy::Allow => Decision::Allow,
        Policy::Reject => Decision::Reject,
        Policy::Forward => {
            return match params {
                Some(p) if session_id(p).is_some() => PolicyAnswer::Forward,
                _ => PolicyAnswer::InvalidParams(
                    "session/request_permission params must be an object naming its sessionId"
                        .into(),
                ),
            };
        }
    };
    match parse_request(params) {
        Ok(request) => PolicyAnswer::Answer(decide(&request, decision)),
        Err(e) => PolicyAnswer::InvalidParams(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(options: &str) -> RequestPermissionRequest {
        serde_json::from_str(&format!(
            r#"{{"sessionId":"s","toolCall":{{"toolCallId":"t"}},"options":{options}}}"#
        ))
        .unwrap()
    }

    fn chosen(r: &RequestPermissionResponse) -> String {
        serde_json::to_value(r).unwrap()["outcome"]["optionId"]
            .as_str()
            .unwrap_or("cancelled")
            .to_string()
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    const MIXED: &str = r#"[{"optionId":"r","name":"Allow (really reject)","kind":"reject_once"},
                {"optionId":"a2","name":"x","kind":"allow_always"},
                {"optionId":"a1","name":"y","kind":"allow_once"}]"#;

    #[test]
    fn picks_by_kind_not_position() {
        let r = request(MIXED);
        assert_eq!(chosen(&decide(&r, Decision::Allow)), "a1");
        assert_eq!(chosen(&decide(&r, Decision::Reject)), "r");
    }

    #[test]
    fn no_matching_kind_is_cancelled() {
        let r = request(r#"[{"optionId":"a","name":"a","kind":"allow_once"}]"#);
        assert_eq!(chosen(&decide(&r, Decision::Reject)), "cancelled");
        let r = request("[]");
        assert_eq!(chosen(&decide(&r, Decision::Allow)), "cancelled");
        assert_eq!(chosen(&decide(&r, Decision::Reject)), "cancelled");
    }

    #[test]
    fn always_kinds_are_taken_when_no_once_kind_exists() {
        let r = request(
            r#"[{"optionId":"ra","name":"Allow","kind":"reject_always"},
                {"optionId":"aa","name":"Reject","kind":"allow_always"}]"#,
        );
        assert_eq!(chosen(&decide(&r, Decision::Allow)), "aa");
        assert_eq!(chosen(&decide(&r, Decision::Reject)), "ra");
    }

    #[test]
    fn cancelled_serialises_as_acp_says() {
        assert_eq!(
            serde_json::to_value(cancelled()).unwrap(),
            serde_json::json!({"outcome": {"outcome": "cancelled"}})
        );
    }

    #[test]
    fn policy_answers_or_forwards() {
        let params = raw(&format!(
            r#"{{"sessionId":"s","toolCall":{{"toolCallId":"t"}},"options":{MIXED}}}"#
        ));
        let PolicyAnswer::Answer(a) = answer_by_policy(Policy::Allow, Some(&params)) else {
            panic!()
        };
        assert_eq!(chosen(&a), "a1");
        let PolicyAnswer::Answer(a) = answer_by_policy(Policy::Reject, Some(&params)) else {
            panic!()
        };
        assert_eq!(chosen(&a), "r");
        assert_eq!(
            answer_by_policy(Policy::Forward, Some(&params)),
            PolicyAnswer::Forward
        );
    }

    /// Not an object naming a session: refused whoever would answer.
    const NOT_FOR_ANYONE: [Option<&str>; 5] = [
        None,
        Some("null"),
        Some("{}"),
        Some(r#"{"sessionId":7,"toolCall":{"toolCallId":"t"},"options":[]}"#),
        // The schema's derived deserialiser takes a sequence field by field; acpd does not.
        Some(r#"["s",{"toolCallId":"t"},[{"optionId":"a","name":"a","kind":"allow_once"}]]"#),
    ];

    #[test]
    fn malformed_requests_are_invalid_params_in_every_mode() {
        for params in NOT_FOR_ANYONE {
            let params = params.map(raw);
            for policy in [Policy::Allow, Policy::Reject, Policy::Forward] {
                let answer = answer_by_policy(policy, params.as_deref());
                assert!(
                    matches!(answer, PolicyAnswer::InvalidParams(_)),
                    "{policy:?} {params:?}: {answer:?}"
                );
            }
        }
    }

    /// What acpd must read to answer by itself, and whoever is asked may read as it likes.
    #[test]
    fn requests_acpd_cannot_answer_itself_are_still_forwarded() {
        for params in [
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t"}}"#,
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":{}}"#,
            r#"{"sessionId":"s","toolCall":"t","options":[]}"#,
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":[{"optionId":"a","kind":"allow_once"}]}"#,
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":[{"optionId":"a","name":"a","kind":7}]}"#,
        ] {
            let params = raw(params);
            for policy in [Policy::Allow, Policy::Reject] {
                let answer = answer_by_policy(policy, Some(&params));
                assert!(
                    matches!(answer, PolicyAnswer::InvalidParams(_)),
                    "{policy:?} {params:?}: {answer:?}"
                );
            }
            assert_eq!(
                answer_by_policy(Policy::Forward, Some(&params)),
                PolicyAnswer::Forward
            );
        }
    }

    /// A kind acpd's schema does not know is never picked and refuses nothing.
    #[test]
    fn options_of_unknown_kinds_are_passed_over() {
        let params = raw(
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":[{"optionId":"as","name":"a","kind":"allow_session"},{"optionId":"ro","name":"r","kind":"reject_once"},{"optionId":"aa","name":"a","kind":"allow_always"}]}"#,
        );
        let PolicyAnswer::Answer(a) = answer_by_policy(Policy::Allow, Some(&params)) else {
            panic!()
        };
        assert_eq!(chosen(&a), "aa");
        let PolicyAnswer::Answer(a) = answer_by_policy(Policy::Reject, Some(&params)) else {
            panic!()
        };
        assert_eq!(chosen(&a), "ro");
        let only_unknown = raw(
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t"},"options":[{"optionId":"as","name":"a","kind":"allow_session"}]}"#,
        );
        let PolicyAnswer::Answer(a) = answer_by_policy(Policy::Allow, Some(&only_unknown)) else {
            panic!()
        };
        assert_eq!(chosen(&a), "cancelled");
        assert_eq!(parse_request(Some(&params)).unwrap().options.len(), 2);
    }

    #[test]
    fn unknown_fields_are_tolerated() {
        let params = raw(
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t","future":1},"options":[{"optionId":"a","name":"a","kind":"allow_once","x":[]}],"later":true}"#,
        );
        let PolicyAnswer::Answer(a) = answer_by_policy(Policy::Allow, Some(&params)) else {
            panic!()
        };
        assert_eq!(chosen(&a), "a");
    }

    #[test]
    fn policy_is_lowercase_in_config() {
        for (p, s) in [
            (Policy::Allow, "\"allow\""),
            (Policy::Reject, "\"reject\""),
            (Policy::Forward, "\"forward\""),
        ] {
            assert_eq!(serde_json::to_string(&p).unwrap(), s);
            assert_eq!(serde_json::from_str::<Policy>(s).unwrap(), p);
        }
        assert!(serde_json::from_str::<Policy>("\"Allow\"").is_err());
        assert_eq!(Policy::default(), Policy::Forward);
    }
}
