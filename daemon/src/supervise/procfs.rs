//! The few `/proc/PID/stat` fields acpd reads: state, parent, process group, start time.

pub(crate) struct Stat {
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    pub session: i32,
    /// Clock ticks since boot (field 22).
    pub start: u64,
}

/// Parses a `stat` line; the command name may hold spaces and parentheses.
pub(crate) fn parse(line: &str) -> Option<Stat> {
    let fields: Vec<&str> = line[line.rfind(')')? + 1..].split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

pub(crate) fn stat(pid: i32) -> Option<Stat> {
    parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// This boot's id: start times count from boot, so a record from another boot means nothing.
pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Every pid in `/proc`.
pub(crate) fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
}

/// Every live or zombie process below this one, found through `/proc` parent links (one read
/// of each `stat`: `acpd supervise` scans at every teardown, on hosts with many processes).
/// As a subreaper, everything our children started is still below us however it detached.
pub(crate) fn descendants() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut children: std::collections::BTreeMap<i32, Vec<i32>> = Default::default();
    let mut buf = [0u8; 1024];
    for pid in pids() {
        let Ok(mut file) = std::fs::File::open(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Ok(n) = std::io::Read::read(&mut file, &mut buf) else {
            continue;
        };
        if let Some(stat) = std::str::from_utf8(&buf[..n]).ok().and_then(parse) {
            children.entry(stat.ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut queue = std::collections::VecDeque::from([me]);
    while let Some(pid) = queue.pop_front() {
        for &kid in children.get(&pid).into_iter().flatten() {
            found.push(kid);
            queue.push_back(kid);
        }
    }
    found
}

/// `pid`'s children, from every one of its threads' `/proc/PID/task/TID/children`; `None` when
/// the kernel does not offer those files (`CONFIG_PROC_CHILDREN`) or `pid` is gone.
pub(crate) fn children(pid: i32) -> Option<Vec<i32>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut found = Vec::new();
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(text) => found.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            ),
            // A thread that ended meanwhile: its task directory went with it.
            Err(_) if !task.path().exists() => {}
            Err(_) => return None,
        }
    }
    Some(found)
}

/// A process's ancestors as read from `/proc`.
#[derive(Debug, Clone, Default)]
pub struct Ancestry {
    /// The process and its ancestors, nearest first, each with its start time.
    pub chain: Vec<(i32, u64)>,
    /// The walk reached its end — init (pid 1, or 0 outside this pid namespace), or a live
    /// process this one may not read (another user's, under `hidepid`/`ProtectProc=`, which no
    /// child of acpd's own user sits below) — and missed nothing on the way: no process that
    /// exited under the walk, no chain longer than its limit.
    pub complete: bool,
}

/// `pid` and its ancestors, up to init or `limit` steps.
pub(crate) fn ancestry(pid: i32, limit: usize) -> Ancestry {
    let mut chain = Vec::new();
    let mut at = pid;
    while chain.len() < limit {
        if at <= 1 && !chain.is_empty() {
            return Ancestry {
                chain,
                complete: true,
            };
        }
        let Some(stat) = stat(at) else {
            // Alive but unreadable ends the walk as init does; gone means a link is missing.
            let alive = !matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(at), None),
                Err(nix::errno::Errno::ESRCH)
            );
            return Ancestry {
                chain,
                complete: alive && at > 0,
            };
        };
        chain.push((at, stat.start));
        at = stat.ppid;
    }
    Ancestry {
        chain,
        complete: false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_stat_with_odd_names() {
        let line = "123 (a (b) c) Z 45 77 70 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 9876 0 0";
        let s = super::parse(line).unwrap();
        assert_eq!(
            (s.state, s.ppid, s.pgrp, s.session, s.start),
            ('Z', 45, 77, 70, 9876)
        );
        assert!(super::stat(std::process::id() as i32).is_some());
    }
}
