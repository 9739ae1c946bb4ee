//! The acpd process that left something on disk, named so that a later acpd can tell whether
//! it still runs: its pid, its start time and the boot it ran in. What an acpd makes outside
//! its own lifetime's reach (a worktree, its delegation socket's directory, a child's private
//! tmp) carries a marker with an [`Owner`]; a starting acpd removes what a SIGKILLed one left,
//! and never what a live one uses: a pid reused by another process has another start time,
//! start times count from boot, so a marker from another boot names nobody alive, and a pid
//! means something only in its own pid namespace.

use serde::{Deserialize, Serialize};

use super::procfs;

/// One acpd process, told apart from a later one with the same pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub pid: i32,
    /// Clock ticks since boot (`/proc/PID/stat` field 22); 0 when it could not be read.
    pub start: u64,
    /// `/proc/sys/kernel/random/boot_id`; empty in markers written before it was recorded
    /// (then pid and start time alone decide).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot: String,
    /// The pid namespace the pid is counted in (`/proc/self/ns/pid`'s link, `pid:[N]`): an
    /// acpd in another namespace sharing the directory (a container, an agent's own sandbox)
    /// sees other pids, and cannot tell whether this owner runs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pid_ns: String,
}

impl Owner {
    /// This process.
    pub(crate) fn me() -> Owner {
        let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        Owner {
            pid,
            start: super::start_time(pid).unwrap_or(0),
            boot: procfs::boot_id(),
            pid_ns: pid_namespace(),
        }
    }

    /// Whether that process is certainly gone, so what it left may be removed: it ran in
    /// another boot, or (seen from its own pid namespace) no process has its pid and start
    /// time, or that process is a zombie (which only waits for its parent to reap it). An
    /// owner whose start time was unknown counts as gone; one in another pid namespace never
    /// does. Markers without a boot or namespace are judged by what they hold.
    pub(crate) fn gone(&self) -> bool {
        if !self.boot.is_empty() && self.boot != procfs::boot_id() {
            return true;
        }
        if !self.pid_ns.is_empty() && self.pid_ns != pid_namespace() {
            return false;
        }
        self.start == 0
            || !procfs::stat(self.pid).is_some_and(|s| s.start == self.start && s.state != 'Z')
    }
}

/// This process's pid namespace, as `/proc/self/ns/pid` names it; empty when unreadable.
fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_changed_start_boot_or_pid_is_gone() {
        let me = Owner::me();
        assert!(!me.gone());
        assert!(me.pid_ns.starts_with("pid:["), "{me:?}");
        let text = serde_json::to_string(&me).unwrap();
        assert_eq!(serde_json::from_str::<Owner>(&text).unwrap(), me);
        for other in [
            Owner {
                start: me.start + 1,
                ..me.clone()
            },
            Owner {
                boot: "another-boot".into(),
                ..me.clone()
            },
            Owner {
                start: 0,
                ..me.clone()
            },
            Owner {
                pid: i32::MAX,
                ..me.clone()
            },
        ] {
            assert!(other.gone(), "{other:?}");
        }
    }

    #[test]
    fn an_owner_in_another_pid_namespace_is_never_gone() {
        let elsewhere = Owner {
            pid: i32::MAX,
            pid_ns: "pid:[1]".into(),
            ..Owner::me()
        };
        assert!(!elsewhere.gone());
    }

    #[test]
    fn a_marker_without_boot_or_namespace_is_judged_by_pid_and_start() {
        let me = Owner::me();
        let old = format!(r#"{{"pid":{},"start":{}}}"#, me.pid, me.start);
        let owner: Owner = serde_json::from_str(&old).unwrap();
        assert!(owner.boot.is_empty() && owner.pid_ns.is_empty());
        assert!(!owner.gone());
        let dead = format!(r#"{{"pid":{},"start":{}}}"#, me.pid, me.start + 1);
        assert!(serde_json::from_str::<Owner>(&dead).unwrap().gone());
    }
}
