//! Session ids across the relay: the parent knows the acpd id (and `<acpd id>.<n>` for the
//! child's own subagent sessions), the child knows its own.

use acpd_protocol::envelope::RpcError;
use acpd_protocol::session_id::with_session_id;
use acpd_protocol::session_routes::remap_routes;
use serde_json::value::RawValue;

use super::Relay;

/// Subagent sessions one bridge session may announce: a child that announces without end
/// gets the rest dropped, not a map that grows with it.
const MAX_SUBAGENT_SESSIONS: usize = 1024;

impl Relay {
    /// The parent's params with the session id it names turned into the child's (its own
    /// session's, or a subagent session's).
    pub(super) fn to_child(&self, params: &RawValue, own: &str) -> Result<Box<RawValue>, RpcError> {
        let Some(sid) = acpd_protocol::session_id::session_id(params) else {
            return Ok(params.to_owned());
        };
        let child = if sid == self.t.session_id {
            own
        } else if let Some(c) = self.subs_back.get(&sid) {
            c
        } else {
            return Err(crate::child::session_not_found(&sid));
        };
        Ok(with_session_id(params, child).unwrap_or_else(|| params.to_owned()))
    }

    /// A child's params with the session ids it names turned into the parent's: its own
    /// session's and its announced subagent sessions'. `Err` when it names another.
    pub(super) fn to_parent_params(
        &self,
        params: &RawValue,
        own: &str,
    ) -> Result<Box<RawValue>, String> {
        let map = |id: &str| {
            if id == own {
                Some(self.t.session_id.clone())
            } else {
                self.subs.get(id).cloned()
            }
        };
        let text = remap_routes(params.get(), map)?;
        RawValue::from_string(text).map_err(|e| e.to_string())
    }

    /// An update that names other sessions: a `subagent_update` announcing (or updating) one
    /// of the child's own subagent sessions gets it a minted id; every session id it names
    /// must be the child's own or an announced one.
    pub(super) fn subagent_traffic(
        &mut self,
        own: &str,
        params: &RawValue,
    ) -> Result<Box<RawValue>, String> {
        let value: serde_json::Value =
            serde_json::from_str(params.get()).map_err(|e| e.to_string())?;
        if value
            .pointer("/update/sessionUpdate")
            .and_then(|v| v.as_str())
            == Some("subagent_update")
            && let Some(sub) = value.pointer("/update/sessionId").and_then(|v| v.as_str())
            && sub != own
            && !self.subs.contains_key(sub)
        {
            if self.subs.len() >= MAX_SUBAGENT_SESSIONS {
                return Err(format!(
                    "{sub}: more than {MAX_SUBAGENT_SESSIONS} subagent sessions announced"
                ));
            }
            let minted = format!("{}.{}", self.t.session_id, self.subs.len() + 1);
            self.subs_back.insert(minted.clone(), sub.to_string());
            self.subs.insert(sub.to_string(), minted);
        }
        self.to_parent_params(params, own)
    }

    /// acpd's hop of a parent's message to the child (`otel::Otel::hop`): only when spans are
    /// exported and the params carry trace context; otherwise they go as they came.
    pub(super) fn hop(
        &self,
        d: &super::Driver,
        method: &str,
        params: Box<RawValue>,
    ) -> (Box<RawValue>, Option<crate::otel::Span>) {
        let Some(o) = crate::otel::exporting() else {
            return (params, None);
        };
        let attributes = vec![
            opentelemetry::KeyValue::new("acpd.provider", d.shared.provider.name.clone()),
            opentelemetry::KeyValue::new("acpd.session.id", self.t.session_id.clone()),
        ];
        match o.hop(method, &params, attributes) {
            Some((p, span)) => (p, Some(span)),
            None => (params, None),
        }
    }
}
