//! Which containment this acpd uses, chosen once at start ([`contain`]), and where each child
//! goes: its own cgroup under acpd's base group, or (the fallback) its own process group plus
//! a tree token in its environment.
//!
//! The token (`ACPD_TREE=<acpd pid>-<acpd start>-<n>`) is how the fallback finds the
//! descendants that left the process group: a `setsid` + double fork keeps the environment,
//! and acpd, as subreaper, adopts the orphans; at teardown every live process below acpd
//! carrying the run's token is killed (found by walking down from acpd's children, so the cost
//! does not grow with the host's processes; a kernel that does not list children gets a scan of
//! all of `/proc`). A process that replaces its whole environment escapes it — the
//! documented limit of the fallback, which cgroups do not have.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::cgroup::{self, Cgroup, CgroupError};
use super::{procfs, records, sentinel};

/// The config's `containment` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContainmentSetting {
    /// cgroups when acpd can create them, else process groups.
    #[default]
    Auto,
    /// cgroups, or acpd does not start.
    Cgroup,
    /// Process groups (and tree tokens), even where cgroups would work.
    ProcessGroup,
}

/// The containment in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Mode {
    Cgroup,
    ProcessGroup,
}

/// What `_acpd/status` and `acpd doctor` report: the mode, why, and the base group.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Containment {
    pub mode: Mode,
    pub reason: String,
    /// The base cgroup (cgroup mode).
    pub path: Option<PathBuf>,
    /// Controllers acpd can set limits with (`memory`, `pids`) for its children.
    pub controllers: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ContainError {
    #[error("containment = \"cgroup\", but acpd cannot use cgroups here: {0}")]
    CgroupUnavailable(CgroupError),
}

struct Active {
    report: Containment,
    base: Option<Cgroup>,
    /// `<pid>-<start>-`: every child's token starts with it.
    token_prefix: String,
}

static ACTIVE: OnceLock<Active> = OnceLock::new();
static NEXT_CHILD: AtomicU64 = AtomicU64::new(1);

/// The environment variable carrying a child's tree token (process-group mode).
pub(crate) const TREE_VAR: &str = "ACPD_TREE";
/// Controllers a provider's limits need.
const LIMIT_CONTROLLERS: [&str; 2] = ["memory", "pids"];

/// Chooses and sets up containment once; later calls return the first answer. Starts the
/// sentinel that tears every tree down if acpd dies without doing it, and sweeps cgroups left
/// by dead acpds. `limits` says whether any provider sets `memory_max` / `pids_max`: only then
/// are controllers enabled, because a group that hands controllers down may hold no process
/// itself, and systemd before 254 puts `ExecReload=` processes into the service's own group.
pub(crate) fn contain(
    setting: ContainmentSetting,
    limits: bool,
) -> Result<&'static Containment, ContainError> {
    if let Some(active) = ACTIVE.get() {
        return Ok(&active.report);
    }
    let me = std::process::id() as i32;
    let start = records::start_time(me).unwrap_or(0);
    let token_prefix = format!("{me}-{start}-");
    let (report, base) = match setting {
        ContainmentSetting::ProcessGroup => (
            fallback("configured: containment = \"process-group\"".into()),
            None,
        ),
        ContainmentSetting::Auto | ContainmentSetting::Cgroup => {
            match setup_cgroup(me, start, limits) {
                Ok((report, base)) => (report, Some(base)),
                Err(e) if setting == ContainmentSetting::Cgroup => {
                    return Err(ContainError::CgroupUnavailable(e));
                }
                Err(e) => (fallback(format!("auto: cgroups unavailable ({e})")), None),
            }
        }
    };
    sentinel::start(base.as_ref().map(Cgroup::path), &token_prefix);
    let active = ACTIVE.get_or_init(|| Active {
        report,
        base,
        token_prefix,
    });
    tracing::info!(mode = ?active.report.mode, reason = %active.report.reason, "containment");
    Ok(&active.report)
}

/// The containment in force, if [`contain`] ran.
pub(crate) fn current() -> Option<&'static Containment> {
    ACTIVE.get().map(|a| &a.report)
}

/// Whether `pid` is in one of this acpd's child groups (cgroup containment only), however it
/// got there: a double fork that left its parent's tree is still in its cgroup. Only ever a
/// reason to refuse: a child may move itself into another child's group, so membership does
/// not say whose it is.
pub(crate) fn in_child_group(pid: i32) -> bool {
    let Some(base) = ACTIVE.get().and_then(|a| a.base.as_ref()) else {
        return false;
    };
    let group = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|text| cgroup::own_group(&text));
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|text| cgroup::find_mount(&text));
    let (Some(group), Some((mount, root))) = (group, mount) else {
        return false;
    };
    let below = if root == "/" {
        Some(group.as_str())
    } else {
        group.strip_prefix(root.as_str())
    };
    below.is_some_and(|below| {
        let dir = mount.join(below.trim_start_matches('/'));
        dir.strip_prefix(base.path())
            .is_ok_and(|rest| rest.components().next().is_some())
    })
}

/// Containment as `_acpd/status` reports it (process groups when [`contain`] never ran).
pub(crate) fn status() -> acpd_protocol::methods::StatusContainment {
    use acpd_protocol::methods::StatusContainment;
    match current() {
        Some(c) => StatusContainment {
            mode: c.mode.name().to_owned(),
            reason: c.reason.clone(),
            path: c.path.as_ref().map(|p| p.display().to_string()),
            controllers: c.controllers.clone(),
        },
        None => StatusContainment {
            mode: Mode::ProcessGroup.name().to_owned(),
            reason: "containment was not set up in this process".to_owned(),
            path: None,
            controllers: Vec::new(),
        },
    }
}

impl Mode {
    /// `cgroup` or `process-group`, as in the config and in `_acpd/status`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Cgroup => "cgroup",
            Mode::ProcessGroup => "process-group",
        }
    }
}

fn fallback(reason: String) -> Containment {
    Containment {
        mode: Mode::ProcessGroup,
        reason,
        path: None,
        controllers: Vec::new(),
    }
}

fn setup_cgroup(me: i32, start: u64, limits: bool) -> Result<(Containment, Cgroup), CgroupError> {
    let own = cgroup::own_dir()?;
    let at_root = own
        .join("cgroup.type")
        .try_exists()
        .map(|exists| !exists)
        .unwrap_or(false);
    // The sweep looks where this acpd's own base goes: beside the `daemon` leaf.
    let parent = Cgroup::at(&own);
    let base = Cgroup::create(&own, &cgroup::base_name(me, start))?;
    if !base.path().join("cgroup.kill").exists() {
        let _ = base.remove();
        return Err(CgroupError::NoKill(own));
    }
    if !at_root {
        // Leave the service's own group for a leaf, so the group may hand controllers down.
        let leaf = Cgroup::create(&own, "daemon")?;
        if let Err(e) = leaf.enter(0) {
            let _ = base.remove();
            return Err(e);
        }
    }
    cgroup::sweep(parent.path(), Some(base.path()));
    let controllers = if limits {
        enable_limits(&parent, &base)
    } else {
        Vec::new()
    };
    let reason = if at_root {
        format!("cgroup v2 writable at {}", own.display())
    } else {
        format!(
            "cgroup v2 delegated at {} (acpd moved itself into its `daemon` leaf)",
            own.display()
        )
    };
    Ok((
        Containment {
            mode: Mode::Cgroup,
            reason,
            path: Some(base.path().to_path_buf()),
            controllers,
        },
        base,
    ))
}

/// Enables the memory and pids controllers down to the children where the kernel offers them
/// and acpd may; returns the ones its children can use.
fn enable_limits(parent: &Cgroup, base: &Cgroup) -> Vec<String> {
    let mut usable = Vec::new();
    for controller in LIMIT_CONTROLLERS {
        if !base.controllers().iter().any(|c| c == controller) {
            if !parent.controllers().iter().any(|c| c == controller) {
                continue;
            }
            if let Err(e) = parent.enable_for_children(&[controller]) {
                tracing::debug!("cannot enable {controller} for acpd's group: {e}");
                continue;
            }
        }
        match base.enable_for_children(&[controller]) {
            Ok(()) => usable.push(controller.to_owned()),
            Err(e) => tracing::debug!("cannot enable {controller} for acpd's children: {e}"),
        }
    }
    usable
}

/// Per-provider resource limits (`memory_max`, `pids_max`); applied in cgroup mode where the
/// controller is enabled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChildLimits {
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
}

impl ChildLimits {
    /// The controllers these limits need that this acpd cannot use: a warning, not a failure.
    pub fn missing_controllers(&self) -> Vec<&'static str> {
        let usable = current().map(|c| c.controllers.clone()).unwrap_or_default();
        let mut missing = Vec::new();
        for (set, name) in [
            (self.memory_max.is_some(), "memory"),
            (self.pids_max.is_some(), "pids"),
        ] {
            if set && !usable.iter().any(|c| c == name) {
                missing.push(name);
            }
        }
        missing
    }
}

/// Where one child goes, decided just before it is forked.
pub(super) enum Placement {
    /// Its own cgroup; the child enters it through `procs` between fork and exec.
    Cgroup {
        group: Cgroup,
        procs: std::os::fd::OwnedFd,
    },
    /// Its own process group, plus this token in its environment.
    Token(String),
    /// Neither cgroup nor token: [`contain`] never ran (in-process tests).
    Group,
    /// `acpd supervise`'s one command: its tree is every descendant of this process (a
    /// subreaper), and where we can create one, its own cgroup beside ours, which it enters
    /// before exec or not at all (not fatal: it is still our descendant).
    Standalone(Option<(Cgroup, std::os::fd::OwnedFd)>),
}

/// The standalone command's cgroup: `acpd-<pid>-<start>` beside ours (the name acpd's sweep
/// knows), with its `cgroup.procs` open for the child to enter before exec; `None` where we
/// cannot create one (no cgroup2, no permission, no `cgroup.kill`). Sweeps the groups of dead
/// supervisors and acpds in the same parent first, so a SIGKILLed supervise's tree ends at
/// the next start.
pub(super) fn place_standalone() -> Placement {
    let own_group = || {
        let own = cgroup::own_dir().ok()?;
        let me = std::process::id() as i32;
        let start = procfs::stat(me)?.start;
        let group = Cgroup::create(&own, &cgroup::base_name(me, start)).ok()?;
        let usable = group.path().join("cgroup.kill").exists();
        let procs = group.procs_fd().ok().filter(|_| usable);
        let Some(procs) = procs else {
            let _ = group.remove();
            return None;
        };
        cgroup::sweep(&own, Some(group.path()));
        Some((group, procs))
    };
    Placement::Standalone(own_group())
}

/// Creates the next child's group (with its limits) or its token.
pub(super) fn place(limits: &ChildLimits) -> Result<Placement, CgroupError> {
    let Some(active) = ACTIVE.get() else {
        return Ok(Placement::Group);
    };
    let n = NEXT_CHILD.fetch_add(1, Ordering::Relaxed);
    let Some(base) = &active.base else {
        return Ok(Placement::Token(format!("{}{n}", active.token_prefix)));
    };
    let group = Cgroup::create(base.path(), &format!("child-{n}"))?;
    let usable = &active.report.controllers;
    if (limits.memory_max.is_some() && !usable.iter().any(|c| c == "memory"))
        || (limits.pids_max.is_some() && !usable.iter().any(|c| c == "pids"))
    {
        // Said per provider at start; this catches limits a reload added.
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "a child's memory_max / pids_max is not applied: acpd's cgroup has no such controller enabled (it enables them at start when the config asks)"
            );
        });
    }
    let set = |controller: &str, file: &'static str, value: Option<u64>| {
        if let Some(v) = value
            && usable.iter().any(|c| c == controller)
            && let Err(e) = group.write(file, &v.to_string())
        {
            tracing::warn!("cannot set {file}: {e}");
        }
    };
    set("memory", "memory.max", limits.memory_max);
    set("pids", "pids.max", limits.pids_max);
    match group.procs_fd() {
        Ok(procs) => Ok(Placement::Cgroup { group, procs }),
        Err(e) => {
            let _ = group.remove();
            Err(e)
        }
    }
}

/// SIGKILLs every child's cgroup at once (the second shutdown signal).
pub(super) fn kill_all() {
    if let Some(base) = ACTIVE.get().and_then(|a| a.base.as_ref()) {
        let _ = base.kill();
    }
}

/// Every live process that carries `token` (exactly) in its environment and started no
/// earlier than `since` (clock ticks since boot), except `skip`.
pub(super) fn token_bearers(token: &str, since: u64, skip: i32) -> Vec<i32> {
    let needle = format!("{TREE_VAR}={token}");
    scan_environ(|value| value == needle.as_bytes(), since, skip)
}

/// [`token_bearers`] among this process's descendants only, found by walking down from its
/// children past the leaders of its other live trees. As a subreaper, acpd holds below it
/// everything its children started, however it detached: once a tree's process group is gone,
/// each of its escapees is a child of acpd or below one of them. So the walk costs one read
/// per child of acpd plus one per stray, where a scan of `/proc` reads every process on the
/// host — at each of K teardowns, with K trees live. Falls back to that scan where the kernel
/// does not list children.
pub(super) fn token_bearers_below(token: &str, since: u64, own_leader: i32, skip: i32) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Some(top) = procfs::children(me) else {
        return token_bearers(token, since, skip);
    };
    let needle = format!("{TREE_VAR}={token}");
    let mut queue: Vec<i32> = {
        let leaders = super::reaper::leaders();
        top.into_iter()
            .filter(|p| *p == own_leader || !leaders.contains(p))
            .collect()
    };
    let mut found = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(pid) = queue.pop() {
        if !seen.insert(pid) {
            continue;
        }
        if pid != skip
            && procfs::stat(pid).is_some_and(|s| s.state != 'Z' && s.start >= since)
            && std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
        {
            found.push(pid);
        }
        match procfs::children(pid) {
            Some(kids) => queue.extend(kids),
            // Gone, or exited meanwhile: nothing below it is left to reach from here. A pid
            // whose children cannot be listed while it lives is the case the scan covers.
            None if procfs::stat(pid).is_none() => {}
            None => return token_bearers(token, since, skip),
        }
    }
    found
}

/// Every live process whose token starts with `prefix` (a whole acpd's trees).
pub(super) fn prefix_bearers(prefix: &str) -> Vec<i32> {
    let needle = format!("{TREE_VAR}={prefix}");
    scan_environ(|value| value.starts_with(needle.as_bytes()), 0, -1)
}

fn scan_environ(matches: impl Fn(&[u8]) -> bool, since: u64, skip: i32) -> Vec<i32> {
    let me = std::process::id() as i32;
    procfs::pids()
        .filter(|&pid| pid != me && pid != skip)
        .filter(|&pid| {
            procfs::stat(pid).is_some_and(|s| s.state != 'Z' && s.start >= since)
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(&matches))
        })
        .collect()
}

/// One line per provider (name, limits) whose limits this acpd cannot apply, saying why.
pub(crate) fn limit_warnings(providers: &[(&str, ChildLimits)]) -> Vec<String> {
    let why = match current() {
        Some(c) if c.mode == Mode::Cgroup => {
            "the controller is not available to acpd's cgroup v2 group"
        }
        Some(_) => "containment is by process groups",
        None => "containment is not set up",
    };
    providers
        .iter()
        .filter_map(|(name, limits)| {
            let missing = limits.missing_controllers();
            (!missing.is_empty()).then(|| {
                format!(
                    "provider {name}: {} not applied ({why}); its children run without that limit",
                    missing
                        .iter()
                        .map(|c| if *c == "memory" {
                            "memory_max"
                        } else {
                            "pids_max"
                        })
                        .collect::<Vec<_>>()
                        .join(" and "),
                )
            })
        })
        .collect()
}
