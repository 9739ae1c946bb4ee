//! acpd's own CPU scheduling: a relay between two busy processes should not preempt them.
//!
//! Under the default policy (`SCHED_OTHER`) a task that wakes preempts the one running, so an
//! acpd woken by every line a streaming agent writes takes the CPU from that agent (or from the
//! editor reading) once per line: on a machine whose cores are all busy, a forwarded stream
//! then ran at 0.55× the speed of the same two processes on a direct pipe, and a C relay that
//! parses nothing at 0.65×. `SCHED_BATCH` differs from `SCHED_OTHER` only there: a waking
//! batch task waits for the running one's slice (a few ms at most) instead of preempting it,
//! and reads the lines that arrived meanwhile in one go. With an idle core it runs at once, as
//! before; its share of the CPU and its nice value are unchanged.
//!
//! acpd switches only from the default policy, so a policy an operator chose (systemd's
//! `CPUSchedulingPolicy=`, `chrt`) stays, and every process acpd starts gets the policy acpd
//! was started with back before it executes: agents are scheduled as if run directly.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::libc;

/// Whether [`favour_throughput`] changed the policy (what children must get back).
static SWITCHED: AtomicBool = AtomicBool::new(false);

/// Moves the calling thread, and every thread it starts afterwards, from `SCHED_OTHER` to
/// `SCHED_BATCH`. Call it before the runtime starts its threads. Any other policy is left.
pub fn favour_throughput() {
    // SAFETY: plain syscalls on the calling thread with a valid, initialised parameter.
    let switched = unsafe {
        libc::sched_getscheduler(0) == libc::SCHED_OTHER
            && libc::sched_setscheduler(
                0,
                libc::SCHED_BATCH,
                &libc::sched_param { sched_priority: 0 },
            ) == 0
    };
    if switched {
        SWITCHED.store(true, Ordering::Relaxed);
    }
}

/// Gives a forked child the policy acpd was started with. Async-signal-safe: one syscall,
/// no allocation, so it may run between fork and exec.
pub(crate) fn restore_in_child() -> std::io::Result<()> {
    if !SWITCHED.load(Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: a plain syscall on the calling (child) process with a valid parameter.
    let r = unsafe {
        libc::sched_setscheduler(
            0,
            libc::SCHED_OTHER,
            &libc::sched_param { sched_priority: 0 },
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_name(pid: i32) -> &'static str {
        // SAFETY: a plain syscall; an unknown pid answers -1.
        match unsafe { libc::sched_getscheduler(pid) } {
            libc::SCHED_OTHER => "other",
            libc::SCHED_BATCH => "batch",
            _ => "another",
        }
    }

    /// What `cmd` prints; a leader while it runs, so the stray reaper of other tests in this
    /// process leaves it be.
    fn policy_line_of(cmd: &mut std::process::Command) -> String {
        let child = {
            let mut leaders = super::super::reaper::leaders();
            let child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
            leaders.insert(child.id() as i32);
            child
        };
        let pid = child.id() as i32;
        let out = child.wait_with_output().unwrap();
        super::super::reaper::leaders().remove(&pid);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// On a thread of its own, so the test harness's other threads keep their policy.
    #[test]
    fn a_default_thread_becomes_batch_and_its_forked_child_gets_other_back() {
        std::thread::spawn(|| {
            if policy_name(0) != "other" {
                // Started under a chosen policy: acpd must leave it.
                let before = policy_name(0);
                favour_throughput();
                assert_eq!(policy_name(0), before);
                return;
            }
            favour_throughput();
            assert_eq!(policy_name(0), "batch");
            let inherited = std::thread::spawn(|| policy_name(0)).join().unwrap();
            assert_eq!(inherited, "batch", "threads started later inherit it");
            let mut cmd = std::process::Command::new("sh");
            cmd.args(["-c", "grep -E '^policy' /proc/self/sched"]);
            // SAFETY: restore_in_child is async-signal-safe.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, restore_in_child);
            }
            let text = policy_line_of(&mut cmd);
            assert!(text.trim().ends_with(" 0"), "the child's policy: {text}");
            let mut plain = std::process::Command::new("sh");
            plain.args(["-c", "grep -E '^policy' /proc/self/sched"]);
            let text = policy_line_of(&mut plain);
            assert!(
                text.trim().ends_with(" 3"),
                "without the reset it inherits: {text}"
            );
        })
        .join()
        .unwrap();
    }
}
