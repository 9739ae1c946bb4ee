//! acpd's error table: a stable name and a numeric code for every way a subagent request can be
//! refused. Codes live in −33000…−33099, outside JSON-RPC's and ACP's reserved ranges; the name
//! travels as `error.data.code` so callers can match on a string that never changes.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorName {
    /// The request names a provider that is not configured.
    NoProvider,
    /// The request asks for a start-time feature the provider does not advertise.
    UnsupportedCapability,
    /// The `outputSchema` is outside what acpd can enforce.
    UnsupportedSchema,
    /// The working directory is missing, relative, or not an enterable directory.
    InvalidCwd,
    /// Starting the run would exceed the delegation depth limit.
    DepthExceeded,
    /// A provider or global child limit is reached.
    Capacity,
    /// The child could not be spawned or failed before the session was published.
    StartFailed,
    /// No run with this id exists for the caller.
    UnknownRun,
    /// A turn is already running on this run.
    RunBusy,
    /// The run's child is no longer alive, so it cannot take another turn.
    RunEnded,
    /// The request was cancelled before the run was published.
    StartCancelled,
    /// The request's fields are malformed (for example a negative `maxDepth`).
    InvalidRequest,
    /// A named connection limit is reached (`error.data.limit` names it, `value` is its setting).
    Limit,
    /// `_acpd/reload`: the config file was rejected (`error.data.file`, `line`, `key`); the
    /// previous config stays in force.
    ConfigRejected,
    /// The caller may not do this (`_acpd/reload` from another user than acpd's own; a run
    /// started from inside a sandboxed child's tree that would escape its sandbox).
    NotPermitted,
}

impl ErrorName {
    pub const ALL: [ErrorName; 15] = [
        ErrorName::NoProvider,
        ErrorName::UnsupportedCapability,
        ErrorName::UnsupportedSchema,
        ErrorName::InvalidCwd,
        ErrorName::DepthExceeded,
        ErrorName::Capacity,
        ErrorName::StartFailed,
        ErrorName::UnknownRun,
        ErrorName::RunBusy,
        ErrorName::RunEnded,
        ErrorName::StartCancelled,
        ErrorName::InvalidRequest,
        ErrorName::Limit,
        ErrorName::ConfigRejected,
        ErrorName::NotPermitted,
    ];

    pub const fn code(self) -> i64 {
        match self {
            ErrorName::NoProvider => -33001,
            ErrorName::UnsupportedCapability => -33002,
            ErrorName::UnsupportedSchema => -33003,
            ErrorName::InvalidCwd => -33004,
            ErrorName::DepthExceeded => -33005,
            ErrorName::Capacity => -33006,
            ErrorName::StartFailed => -33007,
            ErrorName::UnknownRun => -33008,
            ErrorName::RunBusy => -33009,
            ErrorName::RunEnded => -33010,
            ErrorName::StartCancelled => -33011,
            ErrorName::InvalidRequest => -33012,
            ErrorName::Limit => -33013,
            ErrorName::ConfigRejected => -33014,
            ErrorName::NotPermitted => -33015,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorName::NoProvider => "NO_PROVIDER",
            ErrorName::UnsupportedCapability => "UNSUPPORTED_CAPABILITY",
            ErrorName::UnsupportedSchema => "UNSUPPORTED_SCHEMA",
            ErrorName::InvalidCwd => "INVALID_CWD",
            ErrorName::DepthExceeded => "DEPTH_EXCEEDED",
            ErrorName::Capacity => "CAPACITY",
            ErrorName::StartFailed => "START_FAILED",
            ErrorName::UnknownRun => "UNKNOWN_RUN",
            ErrorName::RunBusy => "RUN_BUSY",
            ErrorName::RunEnded => "RUN_ENDED",
            ErrorName::StartCancelled => "START_CANCELLED",
            ErrorName::InvalidRequest => "INVALID_REQUEST",
            ErrorName::Limit => "LIMIT",
            ErrorName::ConfigRejected => "CONFIG_REJECTED",
            ErrorName::NotPermitted => "NOT_PERMITTED",
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.code() == code)
    }
}

impl std::fmt::Display for ErrorName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The serialised form of a typed error, as `acpd run --json` prints it and as JSON-RPC
/// `error.data` carries it (with `code` the stable name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub name: ErrorName,
    pub code: i64,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_in_range() {
        let mut seen = std::collections::HashSet::new();
        for n in ErrorName::ALL {
            assert!((-33099..=-33000).contains(&n.code()), "{n}");
            assert!(seen.insert(n.code()), "duplicate code for {n}");
            assert_eq!(ErrorName::from_code(n.code()), Some(n));
            let json = serde_json::to_string(&n).unwrap();
            assert_eq!(json, format!("\"{}\"", n.as_str()));
            let back: ErrorName = serde_json::from_str(&json).unwrap();
            assert_eq!(back, n);
        }
    }

    #[test]
    fn limit_is_33013() {
        assert_eq!(ErrorName::Limit.code(), -33013);
        assert_eq!(ErrorName::Limit.as_str(), "LIMIT");
        assert_eq!(ErrorName::from_code(-33013), Some(ErrorName::Limit));
        assert_eq!(
            serde_json::to_string(&ErrorName::Limit).unwrap(),
            "\"LIMIT\""
        );
    }
}
