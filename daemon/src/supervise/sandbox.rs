//! The Landlock sandbox of one child's whole tree: writes only beneath the given directories,
//! reads everywhere but a deny list, and optionally no TCP bind/connect (ABI 4+); no signals
//! to processes outside the sandbox and no connection to their abstract Unix sockets (ABI 6+).
//!
//! The ruleset is built in acpd, before the fork (opening every rule's path allocates); the
//! forked child only calls `prctl(PR_SET_NO_NEW_PRIVS)` and `landlock_restrict_self` on its
//! descriptor ([`Sandbox::restrict_in_child`]), two system calls and no allocation. Landlock
//! cannot deny a directory beneath an allowed one, so reads are granted as an allow-list: every
//! directory on the way from `/` to a denied one is opened up entry by entry, siblings allowed,
//! the denied entry left out (and a symlink that leads into a denied directory too).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, path_beneath_rules,
};

/// What a child may do.
#[derive(Debug, Clone, Default)]
pub struct SandboxPlan {
    /// Written (and read) beneath these only. The first is the child's workspace root.
    pub write: Vec<PathBuf>,
    /// Never read or written, even beneath a write directory.
    pub deny: Vec<PathBuf>,
    /// False: no TCP bind or connect at all.
    pub network: bool,
    /// The child's private tmp (acpd made it, 0700): writable, and removed with the sandbox.
    pub tmp: Option<PathBuf>,
    /// The confinement of the child whose tree asked for this one (a nested run): every write
    /// directory must lie in what that child may write, checked on the directory opened for
    /// the rule itself, so a path swapped after the check changes nothing.
    pub limit: Option<Arc<Confinement>>,
    /// The workspace root is a worktree acpd made for this child: outside `limit` by design
    /// (acpd makes worktrees under its own data directory), allowed because the repository
    /// it was made from was checked against `limit` before.
    pub own_root: bool,
}

/// What a sandboxed child may write, as the kernel enforces it: the directories its write
/// rules were made from (resolved, as opened; a denied directory inside a write directory is
/// already left out of them, entry by entry), and whether it may use TCP. A run started from
/// inside that child's tree is held within it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    pub write: Vec<PathBuf>,
    pub network: bool,
}

impl Confinement {
    /// Whether `path` (resolved: no symlink, no `..`) lies where this child may write.
    pub fn permits_write(&self, path: &Path) -> bool {
        self.write.iter().any(|w| path.starts_with(w))
    }

    /// The write directories, for an error that names the limit.
    pub fn describe(&self) -> String {
        const SHOWN: usize = 8;
        let dirs: Vec<&PathBuf> = self
            .write
            .iter()
            .filter(|w| !w.starts_with("/dev"))
            .collect();
        let mut shown: Vec<String> = dirs
            .iter()
            .take(SHOWN)
            .map(|w| w.display().to_string())
            .collect();
        if dirs.len() > SHOWN {
            shown.push(format!("and {} more", dirs.len() - SHOWN));
        }
        format!(
            "it may write only beneath {}{}",
            shown.join(", "),
            if self.network {
                ""
            } else {
                ", with no network"
            }
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("this kernel does not enforce Landlock (not built in, or not in the `lsm=` boot list)")]
    Unsupported,
    #[error("`network = false` needs Landlock ABI 4 (Linux 6.7); this kernel has ABI {0}")]
    NoNetwork(u32),
    #[error("cannot build the Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error(
        "the workspace {} lies outside what the child that asked for this run may write ({})",
        path.display(),
        limit.describe()
    )]
    Outside {
        path: PathBuf,
        limit: Arc<Confinement>,
    },
    #[error("cannot open the workspace {}: {source}", path.display())]
    Root {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A built ruleset, ready to be applied in a forked child.
#[derive(Debug)]
pub struct Sandbox {
    fd: OwnedFd,
    /// The Landlock ABI the kernel enforces it with.
    pub abi: u32,
    tmp: Option<PathBuf>,
    confinement: Arc<Confinement>,
}

impl Drop for Sandbox {
    /// Removes the tmp, then the owner marker beside it (`<tmp>.owner`, which the startup
    /// sweep reads when an acpd dies before this runs).
    fn drop(&mut self) {
        let Some(tmp) = &self.tmp else { return };
        match std::fs::remove_dir_all(tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!("cannot remove a child's tmp {}: {e}", tmp.display());
                return;
            }
            _ => {}
        }
        let mut marker = tmp.clone().into_os_string();
        marker.push(".owner");
        let _ = std::fs::remove_file(marker);
    }
}

/// The Landlock ABI version this kernel enforces; 0 when it enforces none.
pub(crate) fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: nix::libc::c_uint = 1;
    // SAFETY: the documented version query: no ruleset attribute, size 0, the version flag.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).unwrap_or(0)
}

fn abi_of(v: u32) -> ABI {
    match v {
        0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        _ => ABI::V6,
    }
}

impl Sandbox {
    /// Builds the ruleset for `plan` (blocking: it opens every rule's path).
    pub fn build(plan: &SandboxPlan) -> Result<Sandbox, SandboxError> {
        let version = landlock_abi();
        if version == 0 {
            return Err(SandboxError::Unsupported);
        }
        if !plan.network && version < 4 {
            return Err(SandboxError::NoNetwork(version));
        }
        let abi = abi_of(version);
        let deny: Vec<PathBuf> = plan
            .deny
            .iter()
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .collect();
        let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi))?;
        if !plan.network {
            ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
        }
        if version >= 6 {
            // Abstract Unix sockets are reached by name, not path, so no file rule covers
            // them: a session bus or X server listening on one would run what the child
            // asks, outside the sandbox.
            ruleset = ruleset.scope(Scope::Signal | Scope::AbstractUnixSocket)?;
        }
        let mut reads = Vec::new();
        allow_except(Path::new("/"), &deny, &mut reads);
        let mut writes: Vec<Opened> = Vec::new();
        for (i, w) in plan.write.iter().chain(&plan.tmp).enumerate() {
            let root = i == 0 && !plan.write.is_empty();
            // The child's own: its worktree (checked as a repository before acpd made it) and
            // the private tmp acpd made for it.
            let own = (root && plan.own_root) || plan.tmp.as_ref() == Some(w);
            let opened = match Opened::open(w) {
                Ok(o) => o,
                Err(source) if root => {
                    return Err(SandboxError::Root {
                        path: w.clone(),
                        source,
                    });
                }
                Err(_) => continue,
            };
            if let Some(limit) = plan.limit.as_ref().filter(|_| !own)
                && !limit.permits_write(&opened.real)
            {
                if root {
                    return Err(SandboxError::Outside {
                        path: opened.real,
                        limit: limit.clone(),
                    });
                }
                // A preset's state directory the asking child could not write: left out.
                tracing::info!(
                    "a nested child's write directory {} lies outside its parent's; left out",
                    opened.real.display()
                );
                continue;
            }
            // Only what is denied inside a write directory matters to it: the child's own
            // worktree lies in acpd's (denied) worktree directory.
            let inside: Vec<PathBuf> = deny
                .iter()
                .filter(|d| d.starts_with(&opened.real) && **d != opened.real)
                .cloned()
                .collect();
            if inside.is_empty() {
                writes.push(opened);
            } else {
                let mut paths = Vec::new();
                allow_except(&opened.real, &inside, &mut paths);
                let limit = plan.limit.as_deref().filter(|_| !own);
                // An entry is granted where it really is: a symlink planted in the directory
                // that leads out of it grants nothing there.
                writes.extend(
                    paths
                        .iter()
                        .filter_map(|p| Opened::open(p).ok())
                        .filter(|o| o.real.starts_with(&opened.real))
                        .filter(|o| limit.is_none_or(|l| l.permits_write(&o.real))),
                );
            }
        }
        let all = AccessFs::from_all(abi);
        let file = AccessFs::from_file(abi);
        let confinement = Arc::new(Confinement {
            write: writes.iter().map(|o| o.real.clone()).collect(),
            network: plan.network,
        });
        let write_rules = writes.into_iter().map(|o| {
            let access: BitFlags<AccessFs> = if o.dir { all } else { all & file };
            Ok::<_, landlock::RulesetError>(PathBeneath::new(o.fd, access))
        });
        let created = ruleset
            .create()?
            .add_rules(path_beneath_rules(&reads, AccessFs::from_read(abi)))?
            .add_rules(write_rules)?;
        let fd: Option<OwnedFd> = created.into();
        let fd = fd.ok_or(SandboxError::Unsupported)?;
        Ok(Sandbox {
            fd,
            abi: version,
            tmp: plan.tmp.clone(),
            confinement,
        })
    }

    /// What this sandbox lets its child write, for the runs started from inside its tree.
    pub fn confinement(&self) -> &Arc<Confinement> {
        &self.confinement
    }

    /// The descriptor the forked child restricts itself with.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Between fork and exec: no new privileges, then the ruleset on this process and
    /// everything it will start. Two system calls, nothing allocated.
    pub(super) fn restrict_in_child(fd: RawFd) -> std::io::Result<()> {
        nix::sys::prctl::set_no_new_privs()?;
        // SAFETY: landlock_restrict_self(ruleset_fd, flags = 0) on a descriptor acpd opened.
        let r = unsafe { nix::libc::syscall(nix::libc::SYS_landlock_restrict_self, fd, 0u32) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// A write directory opened for its rule: the rule is made from this descriptor, and `real`
/// is where it really is, so what is checked is what is granted.
struct Opened {
    fd: OwnedFd,
    real: PathBuf,
    dir: bool,
}

impl Opened {
    fn open(path: &Path) -> std::io::Result<Opened> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_PATH | nix::libc::O_CLOEXEC)
            .open(path)?;
        let fd = OwnedFd::from(file);
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let dir = nix::sys::stat::fstat(&fd)
            .map(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR)
            .map_err(std::io::Error::from)?;
        Ok(Opened { fd, real, dir })
    }
}

/// Adds to `out` what grants `root` except the denied paths: `root` itself when nothing
/// denied is beneath it, else each of its entries the same way. A symlink is kept only when
/// what it leads to neither is nor holds nor lies in a denied path (a rule follows it).
fn allow_except(root: &Path, deny: &[PathBuf], out: &mut Vec<PathBuf>) {
    if deny.iter().any(|d| root.starts_with(d)) {
        return;
    }
    if !deny.iter().any(|d| d.starts_with(root)) {
        out.push(root.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_symlink() {
            let Ok(target) = std::fs::canonicalize(&path) else {
                continue;
            };
            if deny
                .iter()
                .any(|d| target.starts_with(d) || d.starts_with(&target))
            {
                continue;
            }
            out.push(path);
        } else if kind.is_dir() {
            allow_except(&path, deny, out);
        } else {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_leaves_out_denied_dirs_and_links_into_them() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = tmp.path();
        for d in ["home/.ssh", "home/work", "other"] {
            std::fs::create_dir_all(root.join(d)).unwrap_or_else(|e| panic!("{e}"));
        }
        std::os::unix::fs::symlink(root.join("home/.ssh"), root.join("home/link"))
            .unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(root.join("home"), root.join("up"))
            .unwrap_or_else(|e| panic!("{e}"));
        let deny = [root.join("home/.ssh")];
        let mut out = Vec::new();
        allow_except(root, &deny, &mut out);
        out.sort();
        assert_eq!(out, [root.join("home/work"), root.join("other")]);
    }

    /// A write directory holding a denied one is granted entry by entry, each where it really
    /// is; a nested child's root outside its limit is refused, a preset directory outside it
    /// left out.
    #[test]
    fn what_is_granted_is_what_is_checked() {
        if landlock_abi() == 0 {
            eprintln!("skipped: this kernel does not enforce Landlock");
            return;
        }
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = std::fs::canonicalize(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
        for d in ["home/.ssh", "home/work/sub", "outside"] {
            std::fs::create_dir_all(root.join(d)).unwrap_or_else(|e| panic!("{e}"));
        }
        std::os::unix::fs::symlink(root.join("outside"), root.join("home/out"))
            .unwrap_or_else(|e| panic!("{e}"));
        let home = SandboxPlan {
            write: vec![root.join("home")],
            deny: vec![root.join("home/.ssh")],
            network: true,
            ..SandboxPlan::default()
        };
        let sandbox = Sandbox::build(&home).unwrap_or_else(|e| panic!("{e}"));
        let limit = sandbox.confinement().clone();
        assert_eq!(limit.write, [root.join("home/work")]);
        assert!(limit.permits_write(&root.join("home/work/sub")));
        assert!(!limit.permits_write(&root.join("outside")));
        assert!(!limit.permits_write(&root.join("home/.ssh")));
        let nested = |write: Vec<PathBuf>| SandboxPlan {
            write,
            network: true,
            limit: Some(limit.clone()),
            ..SandboxPlan::default()
        };
        match Sandbox::build(&nested(vec![root.join("home/out")])) {
            Err(SandboxError::Outside { path, .. }) => assert_eq!(path, root.join("outside")),
            other => panic!("{other:?}"),
        }
        let inner = Sandbox::build(&nested(vec![
            root.join("home/work/sub"),
            root.join("outside"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(inner.confinement().write, [root.join("home/work/sub")]);
    }
}
