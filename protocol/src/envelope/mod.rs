//! The JSON-RPC 2.0 envelope.
//!
//! Only the routing fields (`id`, `method`) are parsed; `params`, `result` and `error.data` stay
//! raw JSON, so a bridge forwards what it does not read without re-serialising it and without
//! losing fields (or update kinds) that ACP's typed schema does not know.
//!
//! - [`id`]: the request id, kept exactly as the peer wrote it.
//! - [`rpc_error`]: the error object and the JSON-RPC / ACP error codes.
//! - [`parse`]: one line into a [`Message`] (or a [`MessageRef`] borrowing from the line), or an
//!   [`EnvelopeError`] that still carries the id.
//! - `scan`: the single pass that checks a line is JSON (as serde_json would) and finds the
//!   envelope keys' values in it; `oracle` (tests and the fuzz target's feature) is the serde_json parse it is held to.
//! - [`encode`]: requests, notifications and replies written back as one line.

mod encode;
mod id;
#[cfg(any(test, feature = "oracle"))]
pub mod oracle;
mod parse;
mod rpc_error;
mod scan;
#[cfg(test)]
mod scan_tests;
mod surrogates;
#[cfg(test)]
mod template_tests;
#[cfg(test)]
mod tests;

pub use encode::{
    encode_error, encode_notification, encode_notification_text, encode_reply, encode_request,
    encode_result, json_string, to_raw,
};
pub use id::{Id, IdError, RawId};
pub use parse::{EnvelopeError, Message, MessageRef, RawJson, parse, parse_keyed, parse_ref};
pub use rpc_error::{
    AUTH_REQUIRED, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR,
    RESOURCE_NOT_FOUND, RpcError,
};
pub use scan::{LineTemplate, ParamsKeys};
pub use surrogates::{lone_surrogates, replace_lone_surrogates};
