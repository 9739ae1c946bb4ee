#![warn(unreachable_pub)]
//! acpd's wire vocabulary: NDJSON framing, the JSON-RPC 2.0 envelope, the subagent types, the
//! typed `_acpd/*` bodies, the error table, the permission policy, the pure outcome mapping, prompt fitting, list pagination and cutting text on a character boundary. Nothing here spawns, listens or needs a runtime, so
//! every rule of the protocol can be unit- and property-tested in isolation.

pub mod codec;
pub mod content;
pub mod diagnostic;
pub mod envelope;
pub mod errors;
pub mod listing;
pub mod methods;
pub mod outcome;
pub mod permission;
pub mod session_id;
pub mod session_routes;
pub mod subagent;
pub mod tool_filter;
pub mod utf8;

/// ACP's own types, re-exported so both crates name them through one path.
pub use agent_client_protocol::v1::schema as acp;
