//! cgroup v2 groups: the one containment that catches every descendant, however it detached
//! (`setsid`, double fork, a new process group). Process groups cannot: a member that calls
//! `setsid` leaves its group, and `killpg` no longer reaches it.
//!
//! Layout: acpd's own group `G` (the `0::` line of `/proc/self/cgroup`, under the cgroup2
//! mount found in `/proc/self/mountinfo`) gets one *base* group per acpd process,
//! `G/acpd-<pid>-<starttime>`, and each child its own `…/child-<n>` under it. Named by pid and
//! start time, a base whose owner is dead is recognised by any later acpd, which kills what is
//! left in it and removes it ([`sweep`]). In a non-root `G` (a systemd service with
//! `Delegate=yes`) acpd first moves itself into the leaf `G/daemon`: with the "no internal
//! processes" rule, only a group without processes of its own may hand controllers (memory,
//! pids) down to its children. The root group is exempt, so there acpd stays put.
//!
//! Entering happens between fork and exec: the parent opens the group's `cgroup.procs`, the
//! forked child writes `0` (itself) to it before `exec`, so nothing the child ever starts runs
//! outside the group. Teardown ends with `cgroup.kill` (Linux ≥ 5.14), then a wait for
//! `cgroup.events` to say `populated 0`, then `rmdir`.
//!
//! This is a plain filesystem API, usable by any supervisor (`acpd supervise` too):
//! [`Cgroup::create`], [`Cgroup::procs_fd`] + [`enter_in_child`], [`Cgroup::kill`],
//! [`Cgroup::wait_empty`], [`Cgroup::remove`].

use std::io::Write as _;
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::procfs;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup2 filesystem is mounted (none in /proc/self/mountinfo)")]
    NotMounted,
    #[error("acpd's own cgroup v2 group is unknown (no `0::` line in /proc/self/cgroup)")]
    NoOwnGroup,
    #[error("acpd's group {group} is outside the cgroup2 mount at {mount}")]
    OutsideMount { group: String, mount: PathBuf },
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel has no cgroup.kill (Linux 5.14 or later is needed) in {0}")]
    NoKill(PathBuf),
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// One cgroup v2 directory. Dropping it does nothing: removal is explicit, after the kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// An existing group (nothing is checked).
    pub(crate) fn at(path: impl Into<PathBuf>) -> Self {
        Cgroup { path: path.into() }
    }

    /// Creates `parent/name`; an existing one is reused as it is (callers name groups so that
    /// only a dead owner's can exist, and sweep those first).
    pub(crate) fn create(parent: &Path, name: &str) -> Result<Self, CgroupError> {
        let path = parent.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create", &path)(e)),
        }
        Ok(Cgroup { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs`, opened for writing (close-on-exec): a forked child that writes `0` to it
    /// with [`enter_in_child`] moves itself into this group before it execs.
    pub(crate) fn procs_fd(&self) -> Result<OwnedFd, CgroupError> {
        let path = self.path.join("cgroup.procs");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io("open", &path))?;
        Ok(OwnedFd::from(file))
    }

    /// Moves a running process (the caller: `0`) into this group.
    pub(crate) fn enter(&self, pid: u32) -> Result<(), CgroupError> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Kills every process in the group and its descendants at once (`cgroup.kill`).
    pub(crate) fn kill(&self) -> Result<(), CgroupError> {
        let path = self.path.join("cgroup.kill");
        if !path.exists() {
            return Err(CgroupError::NoKill(self.path.clone()));
        }
        self.write("cgroup.kill", "1")
    }

    /// True while any process lives in the group or below it (`cgroup.events`). A group that
    /// is gone counts as empty.
    pub(crate) fn populated(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.events"))
            .map(|events| parse_populated(&events))
            .unwrap_or(false)
    }

    /// Waits until the group is empty or `deadline` passes; true when empty.
    pub(crate) async fn wait_empty(&self, deadline: Instant) -> bool {
        super::poll_until(deadline, || !self.populated()).await
    }

    /// The same wait, blocking the calling thread (for the sentinel, which has no runtime).
    pub(crate) fn wait_empty_blocking(&self, timeout: Duration) -> bool {
        let deadline = crate::durations::deadline_std(timeout);
        let mut delay = Duration::from_millis(1);
        while self.populated() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_millis(20));
        }
        true
    }

    /// The pids in this group itself (not below it).
    pub(crate) fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// The pids in this group and every group below it.
    pub(crate) fn all_members(&self) -> Vec<i32> {
        let mut pids = self.members();
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pids.extend(Cgroup::at(entry.path()).all_members());
                }
            }
        }
        pids
    }

    /// Removes the group and every group below it, deepest first. Fails (EBUSY) while a
    /// process is left; a group already gone is fine.
    pub(crate) fn remove(&self) -> Result<(), CgroupError> {
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    Cgroup::at(entry.path()).remove()?;
                }
            }
        }
        match std::fs::remove_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove", &self.path)(e)),
        }
    }

    /// Kill, wait (up to `timeout`) for the group to empty, remove: the end of every ladder.
    pub(crate) async fn kill_and_remove(&self, timeout: Duration) -> Result<(), CgroupError> {
        if self.path.exists() {
            self.kill()?;
            if !self.wait_empty(crate::durations::deadline(timeout)).await {
                tracing::warn!(cgroup = %self.path.display(), "cgroup still populated after cgroup.kill");
            }
        }
        self.remove()
    }

    /// The controllers this group may use (`cgroup.controllers`).
    pub(crate) fn controllers(&self) -> Vec<String> {
        std::fs::read_to_string(self.path.join("cgroup.controllers"))
            .map(|t| t.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Enables `controllers` for this group's children (`+memory +pids` in
    /// `cgroup.subtree_control`).
    pub(crate) fn enable_for_children(&self, controllers: &[&str]) -> Result<(), CgroupError> {
        let line: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
        self.write("cgroup.subtree_control", &line.join(" "))
    }

    /// Writes one control file (`memory.max`, `pids.max`, …).
    pub(crate) fn write(&self, file: &'static str, value: &str) -> Result<(), CgroupError> {
        let path = self.path.join(file);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(value.as_bytes()))
            .map_err(io("write", &path))
    }

    /// Reads one counter of a flat-keyed file (`memory.events` `oom_kill`, `pids.events`
    /// `max`); 0 when the file or key is missing.
    pub(crate) fn counter(&self, file: &str, key: &str) -> u64 {
        std::fs::read_to_string(self.path.join(file))
            .map(|text| parse_counter(&text, key))
            .unwrap_or(0)
    }
}

/// Between fork and exec: writes `0` (the calling process) to `procs`, an fd from
/// [`Cgroup::procs_fd`]. Async-signal-safe: one `write`, no allocation.
pub(crate) fn enter_in_child(procs: RawFd) -> std::io::Result<()> {
    // SAFETY: `procs` is an open descriptor owned by the parent for the duration of the spawn;
    // `write` is async-signal-safe and the buffer is a static byte string.
    let written = unsafe { nix::libc::write(procs, b"0".as_ptr().cast(), 1) };
    if written == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A raw fd for [`enter_in_child`], kept valid by the caller holding the [`OwnedFd`].
pub(crate) fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

fn parse_populated(events: &str) -> bool {
    parse_counter(events, "populated") != 0
}

fn parse_counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The cgroup2 mount point and the root it shows (`/` unless a subtree is bind-mounted), from
/// a `/proc/self/mountinfo` text.
pub(crate) fn find_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        Some((
            PathBuf::from(unescape(fields.get(4)?)),
            unescape(fields.get(3)?),
        ))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|s| u8::from_str_radix(s, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The v2 group path from a `/proc/PID/cgroup` text (`0::/a/b`).
pub(crate) fn own_group(proc_cgroup: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        l.strip_prefix("0::")
            .map(|p| p.trim_end_matches(" (deleted)").to_owned())
    })
}

/// acpd's own group as a directory: mount point + the group's path below the mount's root.
pub fn own_dir() -> Result<PathBuf, CgroupError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(io("read", Path::new("/proc/self/mountinfo")))?;
    let (mount, root) = find_mount(&mountinfo).ok_or(CgroupError::NotMounted)?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(io("read", Path::new("/proc/self/cgroup")))?;
    let group = own_group(&cgroup).ok_or(CgroupError::NoOwnGroup)?;
    let below = if root == "/" {
        Some(group.as_str())
    } else {
        group.strip_prefix(root.as_str())
    };
    let below = below.ok_or_else(|| CgroupError::OutsideMount {
        group: group.clone(),
        mount: mount.clone(),
    })?;
    let below = below.trim_start_matches('/');
    Ok(if below.is_empty() {
        mount
    } else {
        mount.join(below)
    })
}

/// The base group's name for the acpd process `pid` that started at `start`.
pub(crate) fn base_name(pid: i32, start: u64) -> String {
    format!("acpd-{pid}-{start}")
}

fn parse_base_name(name: &str) -> Option<(i32, u64)> {
    let (pid, start) = name.strip_prefix("acpd-")?.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// What a sweep of dead acpds' groups did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    pub groups: usize,
    pub killed: usize,
}

/// Kills and removes every `acpd-<pid>-<start>` group in `parent` whose owner is dead (no
/// process `pid` with that start time), except `keep`. Blocking: it waits a moment for each
/// killed group to empty.
pub(crate) fn sweep(parent: &Path, keep: Option<&Path>) -> Swept {
    let mut swept = Swept::default();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return swept;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = parse_base_name(&name) else {
            continue;
        };
        if procfs::stat(pid).is_some_and(|s| s.start == start)
            || Some(entry.path().as_path()) == keep
        {
            continue; // its owner is alive
        }
        let group = Cgroup::at(entry.path());
        swept.groups += 1;
        if group.populated() {
            swept.killed += count_below(&group);
            let _ = group.kill();
            group.wait_empty_blocking(Duration::from_secs(2));
        }
        if let Err(e) = group.remove() {
            tracing::warn!("cannot remove a dead acpd's cgroup: {e}");
        }
    }
    if swept.groups > 0 {
        tracing::warn!(
            groups = swept.groups,
            killed = swept.killed,
            "swept cgroups left by a dead acpd"
        );
    }
    swept
}

fn count_below(group: &Cgroup) -> usize {
    group.all_members().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_and_own_group() {
        let mountinfo = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n\
            41 31 0:38 / /sys/fs/cgroup/un\\040ified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            find_mount(mountinfo),
            Some((PathBuf::from("/sys/fs/cgroup/un ified"), "/".to_owned()))
        );
        assert_eq!(find_mount("1 2 0:1 / / rw - ext4 /dev/x rw\n"), None);
        let cg = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/acpd.service\n";
        assert_eq!(own_group(cg).as_deref(), Some("/system.slice/acpd.service"));
        assert_eq!(own_group("1:cpu:/\n"), None);
    }

    #[test]
    fn parses_events_and_names() {
        assert!(parse_populated("populated 1\nfrozen 0\n"));
        assert!(!parse_populated("populated 0\nfrozen 0\n"));
        assert_eq!(
            parse_counter("low 0\nhigh 3\nmax 2\noom 1\noom_kill 1\n", "oom_kill"),
            1
        );
        assert_eq!(parse_counter("max 0\n", "oom_kill"), 0);
        assert_eq!(parse_base_name("acpd-12-345"), Some((12, 345)));
        assert_eq!(parse_base_name(&base_name(7, 9)), Some((7, 9)));
        assert_eq!(parse_base_name("daemon"), None);
        assert_eq!(parse_base_name("acpd-x-1"), None);
    }
}
