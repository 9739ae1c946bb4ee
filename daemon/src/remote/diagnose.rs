//! Why a remote child did not start, from the facts the local process leaves: its exit code
//! and its stderr. ssh exits 255 for its own failures and says which in a few fixed phrases; a
//! remote shell exits 127 (126) when it cannot find (execute) `remote_acpd`; `acpd supervise`
//! marks its own failures with its name. The classification reads stderr, but only the fixed
//! category and note it picks reach a diagnostic — never the text itself.

use acpd_protocol::subagent::Category;

/// What `acpd supervise` writes before every message of its own, so its failures are told
/// apart from a shell that did not find it.
pub(crate) const SUPERVISE_MARK: &str = "acpd supervise:";

/// A start failure that happened on the way to, or at, the far side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FarFailure {
    /// The host name did not resolve.
    Unresolved,
    /// Nothing listens there, or a firewall said no.
    Refused,
    /// No answer in time, no route, network down.
    TimedOut,
    /// The server rejected every credential ssh offered (BatchMode: nothing interactive).
    AuthRefused,
    /// The server's host key is unknown or changed.
    HostKey,
    /// ssh failed for another reason of its own (exit 255).
    SshFailed,
    /// The far side has no `remote_acpd` (not found or not executable there).
    NoRemoteAcpd,
    /// The far side's acpd is a release without `acpd supervise`.
    OldRemoteAcpd,
    /// `acpd supervise` ran but could not start the provider's command there.
    FarCommand,
    /// `acpd supervise` ran but rejected its setup (cwd missing there, bad line).
    FarSetup,
}

impl FarFailure {
    pub fn category(self) -> Category {
        match self {
            FarFailure::Unresolved
            | FarFailure::Refused
            | FarFailure::TimedOut
            | FarFailure::SshFailed => Category::Unreachable,
            FarFailure::AuthRefused | FarFailure::HostKey => Category::Auth,
            FarFailure::NoRemoteAcpd | FarFailure::OldRemoteAcpd => Category::NoRemoteAcpd,
            FarFailure::FarCommand | FarFailure::FarSetup => Category::Spawn,
        }
    }

    /// A fixed remark for the diagnostic.
    pub fn note(self) -> &'static str {
        match self {
            FarFailure::Unresolved => "unreachable: the host name does not resolve",
            FarFailure::Refused => "unreachable: the host refused the connection",
            FarFailure::TimedOut => "unreachable: the connection timed out or has no route",
            FarFailure::AuthRefused => {
                "auth refused: the host rejected every ssh credential (BatchMode, no prompts)"
            }
            FarFailure::HostKey => "auth refused: the host key is unknown or has changed",
            FarFailure::SshFailed => "ssh failed before the far side started (exit 255)",
            FarFailure::NoRemoteAcpd => {
                "no acpd on the far side: remote_acpd was not found or is not executable there"
            }
            FarFailure::OldRemoteAcpd => {
                "the far side's acpd is too old: it has no `acpd supervise`"
            }
            FarFailure::FarCommand => {
                "acpd supervise could not start the provider's command on the far side"
            }
            FarFailure::FarSetup => {
                "acpd supervise rejected its setup on the far side (cwd missing there?)"
            }
        }
    }
}

/// Classifies a local `ssh`/launcher process that ended before the child answered. `None`
/// when the facts point at the far command itself (it started and then failed like any
/// local child would).
pub(crate) fn classify(ssh: bool, exit_code: Option<i32>, stderr: &[String]) -> Option<FarFailure> {
    let code = exit_code?;
    let said = |phrase: &str| stderr.iter().any(|l| l.contains(phrase));
    if stderr.iter().any(|l| l.starts_with(SUPERVISE_MARK)) {
        return match code {
            126 | 127 => Some(FarFailure::FarCommand),
            125 => Some(FarFailure::FarSetup),
            _ => None,
        };
    }
    if ssh && code == 255 {
        let failure = if said("Could not resolve hostname") || said("Name or service not known") {
            FarFailure::Unresolved
        } else if said("Connection refused") {
            FarFailure::Refused
        } else if said("timed out") || said("No route to host") || said("Network is unreachable") {
            FarFailure::TimedOut
        } else if said("Host key verification failed") || said("HOST IDENTIFICATION HAS CHANGED") {
            FarFailure::HostKey
        } else if said("Permission denied") || said("Too many authentication failures") {
            FarFailure::AuthRefused
        } else {
            FarFailure::SshFailed
        };
        return Some(failure);
    }
    match code {
        126 | 127 => Some(FarFailure::NoRemoteAcpd),
        // clap's usage error, from an acpd that predates `supervise`.
        2 if said("unrecognized subcommand 'supervise'") => Some(FarFailure::OldRemoteAcpd),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn ssh_phrases_map_to_what_failed() {
        let cases = [
            (
                "ssh: Could not resolve hostname nowhere.invalid: Name or service not known",
                FarFailure::Unresolved,
            ),
            (
                "ssh: connect to host 127.0.0.1 port 9: Connection refused",
                FarFailure::Refused,
            ),
            (
                "ssh: connect to host 10.255.255.1 port 22: Connection timed out",
                FarFailure::TimedOut,
            ),
            (
                "root@127.0.0.1: Permission denied (publickey).",
                FarFailure::AuthRefused,
            ),
            ("Host key verification failed.", FarFailure::HostKey),
            (
                "kex_exchange_identification: read: Connection reset by peer",
                FarFailure::SshFailed,
            ),
        ];
        for (stderr, want) in cases {
            assert_eq!(
                classify(true, Some(255), &lines(stderr)),
                Some(want),
                "{stderr}"
            );
        }
    }

    #[test]
    fn a_missing_acpd_is_not_a_missing_command() {
        let shell = lines("bash: line 1: /nonexistent: No such file or directory");
        assert_eq!(
            classify(true, Some(127), &shell),
            Some(FarFailure::NoRemoteAcpd)
        );
        assert_eq!(
            classify(false, Some(126), &[]),
            Some(FarFailure::NoRemoteAcpd)
        );
        let ours = lines("acpd supervise: cannot start `nope`: No such file or directory");
        assert_eq!(
            classify(true, Some(127), &ours),
            Some(FarFailure::FarCommand)
        );
        let old = lines("error: unrecognized subcommand 'supervise'");
        assert_eq!(
            classify(true, Some(2), &old),
            Some(FarFailure::OldRemoteAcpd)
        );
        let setup = lines("acpd supervise: the cwd /x is not a directory here");
        assert_eq!(
            classify(true, Some(125), &setup),
            Some(FarFailure::FarSetup)
        );
    }

    #[test]
    fn the_far_commands_own_exits_are_left_alone() {
        assert_eq!(classify(true, Some(3), &lines("anything")), None);
        assert_eq!(
            classify(false, Some(255), &lines("Permission denied")),
            None
        );
        assert_eq!(classify(true, None, &[]), None);
        let ours = lines("acpd supervise: stdout closed");
        assert_eq!(classify(true, Some(1), &ours), None);
    }
}
