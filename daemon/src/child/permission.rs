//! Answering a child's `session/request_permission` by policy: an option is picked by its
//! `kind`, never by position or name; with no matching option the answer is `cancelled`.

use acpd_protocol::acp::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome,
};

/// The decision acpd takes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Reject,
}

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

pub fn cancelled() -> RequestPermissionResponse {
    RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)
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

    #[test]
    fn picks_by_kind_not_position() {
        let r = request(
            r#"[{"optionId":"r","name":"Allow (really reject)","kind":"reject_once"},
                {"optionId":"a2","name":"x","kind":"allow_always"},
                {"optionId":"a1","name":"y","kind":"allow_once"}]"#,
        );
        assert_eq!(chosen(&decide(&r, Decision::Allow)), "a1");
        assert_eq!(chosen(&decide(&r, Decision::Reject)), "r");
    }

    #[test]
    fn no_matching_kind_is_cancelled() {
        let r = request(r#"[{"optionId":"a","name":"a","kind":"allow_once"}]"#);
        assert_eq!(chosen(&decide(&r, Decision::Reject)), "cancelled");
    }
}
