//! The JSON-RPC error object and the error codes of JSON-RPC 2.0 and ACP.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// A JSON-RPC error object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    /// Empty when the peer left it out (JSON-RPC requires it): its error is still an error
    /// to pass on, not a line that ends the session.
    #[serde(default)]
    pub message: String,
    /// Exactly as the peer wrote it, an explicit `null` included (`Some("null")`): a bridge
    /// passes on errors it did not make, and a parse into a value would rewrite numbers
    /// (`1e2` as `100.0`, big integers rounded) and escapes. Read it with
    /// [`RpcError::data_value`]; only a serde_json deserialiser can make one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub data: Option<Box<RawValue>>,
}

/// A `data` key that is there, whatever its value (`null` too): `Option`'s own deserialiser
/// reads `null` as absent.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// acpd's own `data` for an error it makes.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(super::to_raw(&data));
        self
    }

    /// `data` as a value, for a look inside (never to pass on: see [`RpcError::data`]).
    pub fn data_value(&self) -> Option<serde_json::Value> {
        serde_json::from_str(self.data.as_deref()?.get()).ok()
    }

    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(PARSE_ERROR, format!("Parse error: {detail}"))
    }

    pub fn invalid_request(detail: impl std::fmt::Display) -> Self {
        Self::new(INVALID_REQUEST, format!("Invalid request: {detail}"))
    }

    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("Method not found: {method}"))
    }

    pub fn invalid_params(detail: impl std::fmt::Display) -> Self {
        Self::new(INVALID_PARAMS, format!("Invalid params: {detail}"))
    }

    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::new(INTERNAL_ERROR, format!("Internal error: {detail}"))
    }

    /// A named limit is reached: −33013 with `data: {"code":"LIMIT","limit":limit,"value":value}`
    /// (`max_connections`, `max_sessions_per_connection`, `max_pending_requests`).
    pub fn limit(limit: &str, value: u64) -> Self {
        let name = crate::errors::ErrorName::Limit;
        Self::new(name.code(), format!("Limit reached: {limit} is {value}"))
            .with_data(serde_json::json!({ "code": name.as_str(), "limit": limit, "value": value }))
    }

    /// A partial line older than `line_timeout` was dropped: −32700 with
    /// `data: {"limit":"line_timeout"}`.
    pub fn line_timeout() -> Self {
        Self::parse_error("an unfinished line was dropped after line_timeout")
            .with_data(serde_json::json!({ "limit": "line_timeout" }))
    }

    /// The answer to a line the codec refused: −32700, and for an oversized line
    /// `data: {"limit":"max_line","value":N}`.
    pub fn from_frame(error: &crate::codec::FrameError) -> Self {
        match error {
            crate::codec::FrameError::Oversized { limit } => Self::parse_error(error)
                .with_data(serde_json::json!({ "limit": "max_line", "value": limit })),
            crate::codec::FrameError::NotUtf8 => Self::parse_error(error),
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// ACP: authentication required.
pub const AUTH_REQUIRED: i64 = -32000;
/// ACP: resource (or, with `data.sessionId`, session) not found.
pub const RESOURCE_NOT_FOUND: i64 = -32002;
