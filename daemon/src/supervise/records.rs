//! Crash safety outside systemd. If acpd is SIGKILLed, its direct children die by PDEATHSIG,
//! but grandchildren in their process groups survive. So each acpd process keeps a record of
//! the process groups it owns — a file named by its pid and start time in the state directory —
//! and a starting acpd sweeps only records whose owner is dead. A reused pid or pgid is never
//! hit: a record from another boot (start times restart) is dropped unread; a group whose
//! leader's pid now names a process with another start time was reused and is skipped; and only
//! members in the dead acpd's own session that started no earlier than the recorded child are
//! killed. Several acpd processes share the directory safely.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::procfs;

/// Live groups (pgid → leader start time), kept whether or not a state directory is used: the
/// emergency kill of a second shutdown signal walks them too.
static LIVE: Mutex<BTreeMap<i32, u64>> = Mutex::new(BTreeMap::new());
static FILE: OnceLock<PathBuf> = OnceLock::new();

fn live() -> MutexGuard<'static, BTreeMap<i32, u64>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a sweep did.
#[derive(Debug, Default)]
pub struct Sweep {
    pub records: usize,
    pub killed: usize,
}

/// Where acpd keeps its records: `$STATE_DIRECTORY` (systemd), else `$XDG_STATE_HOME/acpd`,
/// else `~/.local/state/acpd`.
pub fn default_state_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = env("STATE_DIRECTORY") {
        // systemd may pass several, separated by ':'; the first is ours.
        let first = dir
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        return Some(PathBuf::from(first));
    }
    if let Some(dir) = env("XDG_STATE_HOME").filter(|d| d.is_absolute()) {
        return Some(dir.join("acpd"));
    }
    env("HOME").map(|h| h.join(".local/state/acpd"))
}

/// Keeps records in the default state directory, logging (not failing) when it cannot.
pub fn enable_default() {
    let Some(dir) = default_state_dir() else {
        tracing::debug!("no state directory (no STATE_DIRECTORY, XDG_STATE_HOME or HOME)");
        return;
    };
    if let Err(e) = enable(&dir) {
        tracing::warn!("cannot keep child records in {}: {e}", dir.display());
    }
}

/// Sweeps dead owners' records in `dir`, then starts this process's own record there.
pub fn enable(dir: &Path) -> std::io::Result<Sweep> {
    std::fs::create_dir_all(dir)?;
    let sweep = sweep(dir);
    let me = std::process::id() as i32;
    let start = start_time(me).unwrap_or(0);
    let _ = FILE.set(dir.join(format!("acpd-{me}-{start}.json")));
    write();
    Ok(sweep)
}

pub(super) fn add(pgid: i32) {
    let start = start_time(pgid).unwrap_or(0);
    live().insert(pgid, start);
    write();
}

pub(super) fn remove(pgid: i32) {
    live().remove(&pgid);
    write();
}

/// SIGKILLs every live group at once (the second shutdown signal).
pub fn kill_all() {
    for pgid in live().keys() {
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
}

/// Removes this process's record on a clean exit.
pub fn forget() {
    if let Some(path) = FILE.get() {
        let _ = std::fs::remove_file(path);
    }
}

fn write() {
    let Some(path) = FILE.get() else { return };
    let groups: Vec<serde_json::Value> = live()
        .iter()
        .map(|(pgid, start)| serde_json::json!({ "pgid": pgid, "start": start }))
        .collect();
    let session = nix::unistd::getsid(None).map_or(0, |s| s.as_raw());
    let body = serde_json::json!({ "bootId": procfs::boot_id(), "sid": session, "groups": groups })
        .to_string();
    // Write then rename, so a sweeper never reads half a record.
    let tmp = path.with_extension("tmp");
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(body.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        tracing::warn!("cannot write the child record {}: {e}", path.display());
    }
}

fn sweep(dir: &Path) -> Sweep {
    let mut result = Sweep::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return result;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = parse_name(&name) else {
            continue;
        };
        if start_time(pid) == Some(start) {
            continue; // its owner is alive
        }
        result.records += 1;
        let record = std::fs::read_to_string(entry.path())
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .unwrap_or_default();
        let same_boot = record["bootId"].as_str() == Some(procfs::boot_id().as_str());
        let session = record["sid"].as_i64().unwrap_or(-1) as i32;
        let groups = record["groups"].as_array().cloned().unwrap_or_default();
        for g in groups.iter().filter(|_| same_boot) {
            let (Some(pgid), Some(child_start)) = (g["pgid"].as_i64(), g["start"].as_u64()) else {
                continue;
            };
            result.killed += kill_members(pgid as i32, child_start, session);
        }
        let _ = std::fs::remove_file(entry.path());
    }
    if result.killed > 0 {
        tracing::warn!(
            records = result.records,
            killed = result.killed,
            "swept process groups left by a dead acpd"
        );
    } else if result.records > 0 {
        tracing::info!(
            records = result.records,
            "removed records of dead acpd processes"
        );
    }
    result
}

fn parse_name(name: &str) -> Option<(i32, u64)> {
    let rest = name.strip_prefix("acpd-")?.strip_suffix(".json")?;
    let (pid, start) = rest.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// Kills members of `pgid` in `session` that started no earlier than the recorded child did.
/// A pgid stays reserved while any member lives, so if the leader's pid now names a process
/// with another start time, the old group is gone and this one is someone else's.
fn kill_members(pgid: i32, child_start: u64, session: i32) -> usize {
    if procfs::stat(pgid).is_some_and(|leader| leader.start != child_start) {
        return 0;
    }
    let mut killed = 0;
    for pid in procfs::pids() {
        if let Some(stat) = procfs::stat(pid)
            && stat.pgrp == pgid
            && stat.session == session
            && stat.start >= child_start
        {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            killed += 1;
        }
    }
    killed
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22).
pub fn start_time(pid: i32) -> Option<u64> {
    procfs::stat(pid).map(|s| s.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_and_names() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(parse_name("acpd-12-345.json"), Some((12, 345)));
        assert_eq!(parse_name("acpd-12.json"), None);
        assert_eq!(parse_name("other-1-2.json"), None);
    }
}
