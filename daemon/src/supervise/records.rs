//! Crash safety outside systemd. If acpd is SIGKILLed, its direct children die by PDEATHSIG,
//! but grandchildren in their process groups survive. So each acpd process keeps a record of
//! the process groups it owns — a file named by its pid and start time in the state directory —
//! and a starting acpd sweeps only records whose owner is dead. A reused pid or pgid is never
//! hit: a record from another boot (start times restart) is dropped unread; a group whose
//! leader's pid now names a process with another start time was reused and is skipped; and only
//! members in the dead acpd's own session that started no earlier than the recorded child are
//! killed. Several acpd processes share the directory safely.
//!
//! This file keeps the live groups and this process's record; `record_sweep.rs` reads dead owners'
//! records and kills what they name.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::watch;

use super::procfs;
use super::record_sweep::{Sweep, sweep};
use crate::private_fs::PrivateError;

/// Live groups (pgid → leader start time), kept whether or not a state directory is used: the
/// emergency kill of a second shutdown signal walks them too.
static LIVE: Mutex<BTreeMap<i32, u64>> = Mutex::new(BTreeMap::new());
static FILE: OnceLock<PathBuf> = OnceLock::new();

fn live() -> MutexGuard<'static, BTreeMap<i32, u64>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where acpd keeps its records: `$STATE_DIRECTORY` (systemd), else `$XDG_STATE_HOME/acpd`,
/// else `~/.local/state/acpd`.
pub(crate) fn default_state_dir() -> Option<PathBuf> {
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
pub(crate) fn enable_default() {
    let Some(dir) = default_state_dir() else {
        tracing::debug!("no state directory (no STATE_DIRECTORY, XDG_STATE_HOME or HOME)");
        return;
    };
    if let Err(e) = enable(&dir) {
        tracing::warn!("cannot keep child records in {}: {e}", dir.display());
    }
}

/// Sweeps dead owners' records in `dir`, then starts this process's own record there. The
/// directory is made private (0700, created or tightened; a symlink or another uid's
/// directory is refused): the records name acpd's process groups, which the next acpd kills.
pub(super) fn enable(dir: &Path) -> Result<Sweep, PrivateError> {
    crate::private_fs::private_dir(dir)?;
    let sweep = sweep(dir);
    let me = std::process::id() as i32;
    let start = start_time(me).unwrap_or(0);
    let _ = FILE.set(dir.join(format!("acpd-{me}-{start}.json")));
    write();
    start_writer();
    Ok(sweep)
}

/// Files a new group. The returned [`Written`] resolves once a write covering it was tried.
pub(super) fn add(pgid: i32) -> Written {
    let start = start_time(pgid).unwrap_or(0);
    let generation = {
        let mut live = live();
        live.insert(pgid, start);
        next_generation()
    };
    super::sentinel::add_group(pgid, start);
    changed(generation)
}

/// Forgets the group whose leader started at `start`. A pgid is freed when its group is
/// reaped, before this runs, so a new child may already hold it: that child's entry (another
/// start time) stays.
pub(super) fn remove(pgid: i32, start: u64) -> Written {
    let generation = {
        let mut live = live();
        if live.get(&pgid).is_some_and(|s| *s != start) {
            return Written(None);
        }
        live.remove(&pgid);
        next_generation()
    };
    super::sentinel::remove_group(pgid);
    changed(generation)
}

/// Whether `pid`, started at `start`, is a child this process spawned and has not reaped: the
/// leader of one of its live groups (a reused pid has another start time).
pub(crate) fn is_own_child(pid: i32, start: u64) -> bool {
    live().get(&pid) == Some(&start)
}

/// SIGKILLs every live group (and, in cgroup mode, every child's cgroup) at once (the second
/// shutdown signal).
pub(crate) fn kill_all() {
    for pgid in live().keys() {
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    super::contain::kill_all();
}

/// Removes this process's record on a clean exit, and lets the sentinel finish first.
pub(crate) fn forget() {
    // No write (a retry included) may bring the record back after this.
    FORGOTTEN.store(true, Ordering::Release);
    {
        let _writer = WRITER.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = FILE.get() {
            let _ = std::fs::remove_file(path);
        }
    }
    super::sentinel::finish();
}

/// Serialises snapshot + write + rename: with one writer at a time, the file that lands last
/// is always the newest snapshot, so no group is lost to a stale rename (concurrent starts
/// used to race on one shared temp file and could leave an older snapshot in place).
static WRITER: Mutex<()> = Mutex::new(());
/// Makes each temp file name unique even if two processes ever shared a record name.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);
/// Set by [`forget`]: the process is exiting cleanly and its record is gone for good.
static FORGOTTEN: AtomicBool = AtomicBool::new(false);

/// The generation of `LIVE`: bumped under its lock by every change, so a snapshot taken under
/// that lock holds exactly the changes up to the generation read with it.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Set when a change awaits the writer thread; it waits on `WAKE`.
static PENDING: Mutex<bool> = Mutex::new(false);
static WAKE: Condvar = Condvar::new();
/// The newest generation a write attempt covered (landed, or failed and left to the retries).
static SETTLED: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));
/// Whether the writer thread runs (started by [`enable`]); without it changes are written
/// by whoever made them.
static WRITER_THREAD: OnceLock<bool> = OnceLock::new();

/// A change to the record, pending until a write attempt covers it. Dropping it does not undo
/// or hurry anything: a group missing from the record only for a moment, or a gone group still
/// in it (the sweep checks each group's start time), is harmless.
pub(crate) struct Written(Option<u64>);

impl Written {
    /// Waits, blocking the thread, until a write attempt covered this change.
    #[cfg(test)]
    pub(crate) fn wait(self) {
        if let Some(generation) = self.0 {
            let mut settled = SETTLED.subscribe();
            let _ = futures::executor::block_on(settled.wait_for(|s| *s >= generation));
        }
    }

    /// Waits, without blocking the thread, until a write attempt covered this change.
    pub(crate) async fn landed(self) {
        if let Some(generation) = self.0 {
            let mut settled = SETTLED.subscribe();
            let _ = settled.wait_for(|s| *s >= generation).await;
        }
    }
}

/// Called under `LIVE`'s lock by every change: the generation that includes it.
fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::AcqRel) + 1
}

/// Hands the change of `generation` to the writer thread (or, without one, writes it here).
fn changed(generation: u64) -> Written {
    if FILE.get().is_none() {
        return Written(None);
    }
    if WRITER_THREAD.get() == Some(&true) {
        *PENDING.lock().unwrap_or_else(|p| p.into_inner()) = true;
        WAKE.notify_one();
    } else {
        write();
    }
    Written(Some(generation))
}

/// How long the writer waits before trying a failed write again, at first and at most.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Starts the thread that writes the record after changes: one write covers every change made
/// before its snapshot, so a burst of K starts or ends costs a few writes instead of K whole
/// rewrites one after another (each as long as the number of live groups), and no async
/// worker thread waits on the file system. A failed write is tried again, backing off from
/// 50 ms to 2 s, until one lands.
fn start_writer() {
    WRITER_THREAD.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("acpd-records".into())
            .spawn(|| {
                let mut retry: Option<Duration> = None;
                loop {
                    {
                        let mut pending = PENDING.lock().unwrap_or_else(|p| p.into_inner());
                        match retry {
                            None => {
                                while !*pending {
                                    pending = WAKE.wait(pending).unwrap_or_else(|p| p.into_inner());
                                }
                            }
                            Some(wait) if !*pending => {
                                pending = WAKE
                                    .wait_timeout(pending, wait)
                                    .map_or_else(|p| p.into_inner().0, |(g, _)| g);
                            }
                            Some(_) => {}
                        }
                        *pending = false;
                    }
                    retry = match write() {
                        true => None,
                        false => Some(retry.map_or(RETRY_FIRST, |w| (w * 2).min(RETRY_MAX))),
                    };
                }
            });
        if let Err(e) = &spawned {
            tracing::warn!("cannot start the child record writer: {e}; writing in place");
        }
        spawned.is_ok()
    });
}

/// One group as the record holds it.
#[derive(serde::Serialize)]
struct Group {
    pgid: i32,
    start: u64,
}

/// The record: read by `record_sweep.rs` of the next acpd.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Record<'a> {
    boot_id: &'a str,
    sid: i32,
    groups: Vec<Group>,
}

/// Writes the newest snapshot (up to [`WRITE_ATTEMPTS`] tries), then publishes the generation
/// it covered; false when it did not land (the caller tries again later).
fn write() -> bool {
    let Some(path) = FILE.get() else { return true };
    let _writer = WRITER.lock().unwrap_or_else(|p| p.into_inner());
    // The snapshot and its generation, taken together under the live lock, after the writer
    // lock: any change made before this point is in it.
    let (groups, generation) = {
        let live = live();
        let groups: Vec<Group> = live
            .iter()
            .map(|(&pgid, &start)| Group { pgid, start })
            .collect();
        (groups, GENERATION.load(Ordering::Acquire))
    };
    if FORGOTTEN.load(Ordering::Acquire) {
        SETTLED.send_replace(generation);
        return true;
    }
    static BOOT_ID: LazyLock<String> = LazyLock::new(procfs::boot_id);
    let session = nix::unistd::getsid(None).map_or(0, |s| s.as_raw());
    let record = Record {
        boot_id: &BOOT_ID,
        sid: session,
        groups,
    };
    let body = serde_json::to_vec(&record).unwrap_or_default();
    // A failed write (no fd or inode left for the temp file, an obstacle at the name) is
    // tried again at once with a fresh temp file, then by the writer thread until it lands:
    // a group missing from the record is a group the next acpd never sweeps.
    let mut result = replace(path, &body);
    for _ in 1..WRITE_ATTEMPTS {
        if result.is_ok() {
            break;
        }
        result = replace(path, &body);
    }
    SETTLED.send_if_modified(|s| {
        let newer = generation > *s;
        *s = (*s).max(generation);
        newer
    });
    match result {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "cannot write the child record {}: {e}; retrying in the background",
                path.display()
            );
            false
        }
    }
}

/// Immediate attempts per write before the writer thread tries again later.
const WRITE_ATTEMPTS: usize = 3;

/// Atomic replace: a unique temp file in the same directory (not named `acpd-*.json`, so a
/// sweeper never mistakes it for a record), then rename over the record. A sweeper reads the
/// old record or the new one, never half of one.
fn replace(path: &Path, body: &[u8]) -> Result<(), PrivateError> {
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    // A new 0600 file, never an existing name (O_EXCL|O_NOFOLLOW): nothing planted is
    // written through.
    let written = crate::private_fs::create_new_private(&tmp).and_then(|mut f| {
        f.write_all(body)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|source| PrivateError::Io {
                what: "write",
                path: tmp.clone(),
                source,
            })
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22).
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    procfs::stat(pid).map(|s| s.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(path: &Path) -> std::collections::BTreeSet<i64> {
        let text = std::fs::read_to_string(path).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("a torn record ({e}): {text:?}"));
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["pgid"].as_i64().unwrap())
            .collect()
    }

    /// 64 starts and then 64 ends at once, from 64 threads, while a sweeper-like reader keeps
    /// reading the record: every read parses, the record lists all 64 groups after the starts
    /// and none of them after the ends, and no temp file is left behind.
    /// This test process's record directory (`FILE` is set once per process), and the lock
    /// that runs the tests using it one at a time.
    fn fixture() -> (MutexGuard<'static, ()>, &'static Path) {
        static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
        static SERIAL: Mutex<()> = Mutex::new(());
        let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let dir = DIR.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            enable(dir.path()).unwrap();
            dir
        });
        (guard, dir.path())
    }

    #[test]
    fn concurrent_starts_lose_no_group() {
        let (_serial, dir) = fixture();
        let path = FILE.get().unwrap().clone();
        assert_eq!(path.parent(), Some(dir));
        // Above any pid_max, so no real process is named (kill_all would get ESRCH).
        let fake: Vec<i32> = (0..64).map(|i| 0x7000_0000 + i).collect();
        let all = |pgids: &[i32]| pgids.iter().map(|&p| i64::from(p)).collect::<Vec<_>>();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    recorded(&path);
                    reads += 1;
                }
                reads
            })
        };
        for round in [true, false] {
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(fake.len()));
            let threads: Vec<_> = fake
                .iter()
                .map(|&pgid| {
                    let barrier = barrier.clone();
                    std::thread::spawn(move || {
                        barrier.wait();
                        if round {
                            add(pgid).wait()
                        } else {
                            remove(pgid, 0).wait()
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let groups = recorded(&path);
            for pgid in all(&fake) {
                assert_eq!(
                    groups.contains(&pgid),
                    round,
                    "group {pgid} after round {round}"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        let names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "only the record itself: {names:?}");
    }

    /// Issue 18: a write that failed (here an obstacle at the record's name) left a live
    /// group out of the record until some later start or end happened to write it again.
    #[test]
    fn a_failed_write_is_retried_until_it_lands() {
        let (_serial, _dir) = fixture();
        let path = FILE.get().unwrap().clone();
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("obstacle"), b"").unwrap();
        let pgid = 0x7000_1000;
        add(pgid).wait();
        assert!(path.is_dir(), "the write cannot land yet");
        std::fs::remove_dir_all(&path).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let landed = loop {
            let groups = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .map(|_| recorded(&path));
            if groups
                .as_ref()
                .is_some_and(|g| g.contains(&i64::from(pgid)))
            {
                break true;
            }
            if std::time::Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(landed, "the live group never reached the record");
        remove(pgid, 0).wait();
        assert!(!recorded(&path).contains(&i64::from(pgid)));
    }

    /// A pgid freed by a reaped group and taken by a new child: the old group's late removal
    /// must not drop the new child from the record.
    #[test]
    fn removing_a_reused_pgid_keeps_the_new_group() {
        let (_serial, _dir) = fixture();
        let path = FILE.get().unwrap().clone();
        let pgid = 0x7000_2000;
        live().insert(pgid, 7);
        write();
        remove(pgid, 3).wait();
        assert!(recorded(&path).contains(&i64::from(pgid)));
        remove(pgid, 7).wait();
        assert!(!recorded(&path).contains(&i64::from(pgid)));
    }

    /// The records' directory is private however it came to exist, and a symlink there is
    /// refused, never written through.
    #[test]
    fn the_records_dir_is_private_and_never_a_symlink() {
        use std::os::unix::fs::PermissionsExt as _;
        let (_serial, _dir) = fixture();
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("state");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        enable(&open).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&open), 0o700);
        let fresh = tmp.path().join("a/b");
        enable(&fresh).unwrap();
        assert_eq!((mode(&fresh), mode(&tmp.path().join("a"))), (0o700, 0o700));
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = enable(&link).unwrap_err();
        assert!(e.to_string().contains(&link.display().to_string()), "{e}");
        assert_eq!(mode(&target), 0o755);
    }
}
