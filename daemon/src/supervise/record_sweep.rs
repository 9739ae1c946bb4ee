//! The sweep a starting acpd runs over the records directory: a record whose owner is dead is
//! read (only if acpd's uid wrote it) and the process groups it names are killed, each only
//! if it is still the group that was recorded (see `records.rs`).

use std::path::Path;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::procfs;
use super::records::start_time;

/// What a sweep did.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    pub records: usize,
    pub killed: usize,
}

pub(super) fn sweep(dir: &Path) -> Sweep {
    let mut result = Sweep::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return result;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((pid, start)) = parse_tmp_name(&name) {
            // A temp file a dead owner never renamed (killed between write and rename).
            if start_time(pid) != Some(start) {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        let Some((pid, start)) = parse_name(&name) else {
            continue;
        };
        if start_time(pid) == Some(start) {
            continue; // its owner is alive
        }
        // Only a record this uid wrote is believed: it names process groups to SIGKILL.
        let Some(text) = read_own_record(&entry.path()) else {
            tracing::warn!(record = %entry.path().display(),
                "not acpd's own record (a link, not a regular file, another uid's, or too large): left alone");
            continue;
        };
        result.records += 1;
        let record = serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default();
        let same_boot = record["bootId"].as_str() == Some(procfs::boot_id().as_str());
        let session = record["sid"].as_i64().unwrap_or(-1) as i32;
        let groups = record["groups"].as_array().cloned().unwrap_or_default();
        for g in groups.iter().filter(|_| same_boot) {
            let (Some(pgid), Some(child_start)) = (g["pgid"].as_i64(), g["start"].as_u64()) else {
                continue;
            };
            result.killed += kill_members(pgid as i32, child_start, session);
        }
        if same_boot {
            // Escapees of its process groups that kept their tree token (containment fallback).
            for escapee in super::contain::prefix_bearers(&format!("{pid}-{start}-")) {
                let _ = nix::sys::signal::kill(Pid::from_raw(escapee), Signal::SIGKILL);
                result.killed += 1;
            }
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

/// The longest record read: one acpd's live groups, with room to spare.
const MAX_RECORD: u64 = 4 * 1024 * 1024;

/// The text of the record at `path` when it is one acpd's uid wrote: a regular file with one
/// link, owned by this effective uid, opened without following a link or waiting on a FIFO,
/// read up to [`MAX_RECORD`]. Anything else was planted (say, in a state dir that was
/// group-writable before acpd tightened it) and could name another user's processes.
fn read_own_record(path: &Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt as _;
    let file = crate::private_fs::open_regular(path, crate::private_fs::Links::Refuse).ok()?;
    let meta = file.metadata().ok()?;
    let own = meta.nlink() == 1
        && meta.uid() == nix::unistd::geteuid().as_raw()
        && meta.len() <= MAX_RECORD;
    if !own {
        return None;
    }
    let mut text = String::new();
    file.take(MAX_RECORD).read_to_string(&mut text).ok()?;
    Some(text)
}

fn parse_name(name: &str) -> Option<(i32, u64)> {
    let rest = name.strip_prefix("acpd-")?.strip_suffix(".json")?;
    let (pid, start) = rest.split_once('-')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// The owner of a temp file `.acpd-PID-START.json.PID.SEQ.tmp` (see `replace`).
fn parse_tmp_name(name: &str) -> Option<(i32, u64)> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (record, _) = rest.split_once(".json.")?;
    parse_name(&format!("{record}.json"))
}

/// Kills members of `pgid` in `session` that started no earlier than the recorded child did.
/// A pgid stays reserved while any member lives, so if the leader's pid now names a process
/// with another start time, the old group is gone and this one is someone else's.
pub(super) fn kill_members(pgid: i32, child_start: u64, session: i32) -> usize {
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
        assert_eq!(
            parse_tmp_name(".acpd-12-345.json.12.7.tmp"),
            Some((12, 345))
        );
        assert_eq!(parse_name(".acpd-12-345.json.12.7.tmp"), None);
    }
}

#[cfg(test)]
mod planted {
    use super::*;
    use std::os::unix::process::CommandExt as _;

    /// A record naming `victim`'s process group, as a dead acpd would have written it.
    fn record_of(victim: i32) -> String {
        let stat = procfs::stat(victim).unwrap();
        serde_json::json!({"bootId": procfs::boot_id(), "sid": stat.session,
            "groups": [{"pgid": victim, "start": stat.start}]})
        .to_string()
    }

    /// What was planted in the records directory before acpd made it private (a state dir that
    /// was group-writable, tightened at start) is not acpd's record: a symlink to a record, a
    /// FIFO, a file another uid owns are never read, so the sweep neither blocks on them nor
    /// kills the process group they name.
    #[test]
    fn the_sweep_reads_only_acpds_own_regular_records() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("records");
        std::fs::create_dir(&dir).unwrap();
        let mut victim = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = victim.id() as i32;
        let outside = tmp.path().join("forged.json");
        std::fs::write(&outside, record_of(pid)).unwrap();
        // Owners above any pid_max: dead, so their records are swept.
        std::os::unix::fs::symlink(&outside, dir.join("acpd-2100000001-1.json")).unwrap();
        nix::unistd::mkfifo(
            &dir.join("acpd-2100000002-1.json"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        if nix::unistd::Uid::effective().is_root() {
            let foreign = dir.join("acpd-2100000003-1.json");
            std::fs::write(&foreign, record_of(pid)).unwrap();
            nix::unistd::chown(&foreign, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        }
        let (done, swept) = std::sync::mpsc::channel();
        let at = dir.clone();
        std::thread::spawn(move || done.send(sweep(&at).killed));
        let killed = swept.recv_timeout(std::time::Duration::from_secs(20));
        let alive = victim.try_wait().unwrap().is_none();
        let _ = victim.kill();
        let _ = victim.wait();
        assert_eq!(killed, Ok(0), "the sweep blocked or killed");
        assert!(alive, "the sweep killed the group a planted record named");
    }
}
