//! A provider's `sandbox` turned into one child's Landlock plan: it writes only in its
//! workspace (or cwd), a private tmp acpd makes for it, a few devices and the directories its
//! preset names; it reads everything but the deny list (credentials, acpd's own state and
//! other children's worktrees). What the kernel can enforce decides between `landlock`, `auto`
//! and a start error.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::RegistryError;
use crate::config::{ProviderConfig, SandboxMode, presets};
use crate::supervise::{Confinement, Sandbox, SandboxError, SandboxPlan, landlock_abi};

/// Under `$HOME`: never read or written by a sandboxed child.
const DENY_HOME: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".config/gcloud",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
];

/// Devices any program writes to.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/random",
    "/dev/urandom",
];

/// What `_acpd/providers`, `acpd status` and `acpd doctor` say is enforced for `provider`:
/// `landlock (ABI N)`, or `none` (with why, when a sandbox was asked for).
pub(crate) fn enforced(provider: &ProviderConfig) -> String {
    let abi = landlock_abi();
    match (provider.sandbox, abi) {
        (SandboxMode::None, _) => "none".into(),
        (_, 0) if provider.sandbox == SandboxMode::Auto => {
            "none (auto: this kernel does not enforce Landlock)".into()
        }
        (_, 0) => "unavailable (sandbox = \"landlock\": this kernel does not enforce Landlock; starts fail)".into(),
        (_, abi) if !provider.network && abi < 4 => {
            format!("landlock (ABI {abi}) without network rules (they need ABI 4)")
        }
        (_, abi) if !provider.network => format!("landlock (ABI {abi}), no TCP"),
        (_, abi) => format!("landlock (ABI {abi})"),
    }
}

/// Where a run started from inside a sandboxed child's tree may go, before anything is made:
/// a provider that is sandboxed here (never `sandbox = "none"`, never a far host), with no
/// network the child lacks, in a cwd that, resolved (symlinks, `..`), lies where the child
/// may write. Returns that resolved cwd, which the run is started in (a path swapped after
/// this check is caught again where the sandbox opens its workspace).
///
/// A `none` provider is refused rather than run under the asking child's ruleset: its agent
/// was configured to write its own state where it likes, so it would fail in ways nobody
/// could read, and the ruleset would also forbid the worktree acpd makes for it.
pub(super) fn confine(
    provider: &ProviderConfig,
    cwd: &Path,
    limit: &Arc<Confinement>,
) -> Result<PathBuf, RegistryError> {
    let refuse = |reason: String| RegistryError::Confined {
        reason,
        limit: limit.clone(),
    };
    let name = &provider.name;
    if provider.remote.is_some() {
        return Err(refuse(format!(
            "provider \"{name}\" runs on another host, beyond the sandbox of the child asking \
             ({}); delegate to a local provider with sandbox = \"landlock\"",
            limit.describe()
        )));
    }
    if provider.sandbox == SandboxMode::None {
        return Err(refuse(format!(
            "provider \"{name}\" runs unsandboxed (sandbox = \"none\"), and the child asking is \
             sandboxed ({}); delegate to a provider with sandbox = \"landlock\"",
            limit.describe()
        )));
    }
    if provider.network && !limit.network {
        return Err(refuse(format!(
            "provider \"{name}\" may use the network (network = true), and the child asking \
             may not ({}); delegate to a provider with network = false",
            limit.describe()
        )));
    }
    let real = std::fs::canonicalize(cwd).map_err(|e| RegistryError::InvalidCwd {
        reason: format!("cannot resolve {:?}: {e}", cwd.to_string_lossy()),
    })?;
    if !limit.permits_write(&real) {
        return Err(refuse(format!(
            "the cwd {:?} (resolved: {:?}) lies outside what the child asking may write ({}); \
             give a cwd beneath one of those",
            cwd.to_string_lossy(),
            real.to_string_lossy(),
            limit.describe()
        )));
    }
    Ok(real)
}

/// Whether a worktree of the repository whose git directories are `dirs` may be made for a
/// run asked for from inside a sandboxed child's tree: acpd runs git there outside any
/// sandbox, and git runs whatever programs its configuration names (a `filter` driver runs on
/// every checkout and `add`, whichever file `.gitattributes` or `info/attributes` gives it
/// to). So no configuration git reads may lie where the asking child may write: neither the
/// repository's git directories nor the user's global git config.
pub(super) fn confine_repository(
    cwd: &Path,
    dirs: &[PathBuf],
    limit: &Arc<Confinement>,
) -> Result<(), RegistryError> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".config")));
    let global = [
        home.map(|h| h.join(".gitconfig")),
        xdg.map(|x| x.join("git")),
    ];
    let read = dirs.iter().cloned().chain(
        global
            .into_iter()
            .flatten()
            .map(|p| crate::private_fs::resolved_as_far_as_it_exists(&p)),
    );
    for path in read {
        if limit.permits_write(&path) {
            return Err(RegistryError::Confined {
                reason: format!(
                    "a worktree of the repository of {:?} would have acpd run git, outside \
                     any sandbox, under configuration the child asking may write ({:?}, which \
                     may name programs for git to run; {}); ask for workspace \"shared\", or \
                     for a repository whose git directory lies outside what the child may write",
                    cwd.to_string_lossy(),
                    path.to_string_lossy(),
                    limit.describe()
                ),
                limit: limit.clone(),
            });
        }
    }
    Ok(())
}

/// The sandbox for a child of `provider` whose workspace is `root` (`own_root`: a worktree
/// acpd made for it), held within `limit` when a sandboxed child asked for it, with its env's
/// `TMPDIR` pointed at a private tmp; `None` when the provider has none (or `auto` found no
/// Landlock).
pub(super) async fn sandbox_for(
    provider: &ProviderConfig,
    (root, own_root): (&Path, bool),
    limit: Option<&Arc<Confinement>>,
    id: &str,
    env: &mut Vec<(OsString, OsString)>,
) -> Result<Option<Arc<Sandbox>>, RegistryError> {
    if provider.sandbox == SandboxMode::None || provider.remote.is_some() {
        return Ok(None);
    }
    let failed = |reason: String| RegistryError::Sandbox {
        provider: provider.name.clone(),
        reason,
    };
    if landlock_abi() == 0 {
        if provider.sandbox == SandboxMode::Auto {
            tracing::warn!(provider = %provider.name, "sandbox = \"auto\": this kernel does not enforce Landlock; the child runs unsandboxed");
            return Ok(None);
        }
        return Err(failed(
            "sandbox = \"landlock\", and this kernel does not enforce Landlock".into(),
        ));
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let data = presets::data_dir();
    let tmp = match &data {
        Some(d) => d.join("tmp").join(tmp_name(id)),
        None => {
            return Err(failed(
                "no data directory for the child's tmp (set HOME)".into(),
            ));
        }
    };
    let mut plan = plan(
        provider,
        root,
        home.as_deref(),
        data.as_deref(),
        tmp.clone(),
    );
    if let Some(limit) = limit {
        plan.network &= limit.network;
        plan.limit = Some(limit.clone());
        plan.own_root = own_root;
    }
    let marker = match tmp.parent() {
        Some(parent) => {
            crate::private_fs::private_dir(parent).map_err(|e| failed(e.to_string()))?;
            // Before the tmp: an acpd killed in between leaves the marker to the sweep.
            let name = tmp.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            Some(crate::workspace::mark_tmp(parent, name).map_err(|e| failed(e.to_string()))?)
        }
        None => None,
    };
    if let Err(e) = crate::private_fs::private_dir(&tmp) {
        if let Some(m) = &marker {
            let _ = std::fs::remove_file(m);
        }
        return Err(failed(e.to_string()));
    }
    let built = tokio::task::spawn_blocking(move || Sandbox::build(&plan)).await;
    match built {
        Ok(Ok(sandbox)) => {
            env.retain(|(k, _)| k != "TMPDIR");
            env.push(("TMPDIR".into(), tmp.into_os_string()));
            Ok(Some(Arc::new(sandbox)))
        }
        Ok(Err(SandboxError::Outside { path, limit })) => {
            discard(&tmp, marker.as_deref());
            Err(RegistryError::Confined {
                reason: format!(
                    "the workspace {:?} lies outside what the child asking may write ({}); \
                     give a cwd beneath one of those",
                    path.to_string_lossy(),
                    limit.describe()
                ),
                limit,
            })
        }
        Ok(Err(e)) => {
            discard(&tmp, marker.as_deref());
            Err(failed(e.to_string()))
        }
        Err(e) => {
            discard(&tmp, marker.as_deref());
            Err(failed(e.to_string()))
        }
    }
}

/// The name of a child's tmp: its id (a run or session id, `probe-<provider>`) cut to what a
/// marker may be named, and a random tail, so two children of one id (two probes of a
/// provider at once) never share one, nor does one's removal take the other's.
fn tmp_name(id: &str) -> String {
    let head: String = id
        .chars()
        .take(60)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let tail = uuid::Uuid::new_v4().simple().to_string();
    format!("{head}-{}", &tail[..12])
}

/// A tmp no sandbox came to own, and its marker.
fn discard(tmp: &Path, marker: Option<&Path>) {
    let _ = std::fs::remove_dir_all(tmp);
    if let Some(m) = marker {
        let _ = std::fs::remove_file(m);
    }
}

fn plan(
    provider: &ProviderConfig,
    root: &Path,
    home: Option<&Path>,
    data: Option<&Path>,
    tmp: PathBuf,
) -> SandboxPlan {
    let mut write: Vec<PathBuf> = vec![root.to_path_buf()];
    write.extend(DEVICES.iter().map(PathBuf::from));
    if let Some(home) = home {
        let preset = provider.preset.as_deref().and_then(presets::find);
        for dir in preset.map_or(&[][..], |p| p.sandbox_dirs) {
            let dir = home.join(dir);
            // Made (0700) when missing, so the agent can keep its state there.
            if !dir.exists() {
                let _ = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir);
            }
            write.push(dir);
        }
    }
    SandboxPlan {
        deny: denied(home, data),
        write,
        network: provider.network,
        tmp: Some(tmp),
        ..SandboxPlan::default()
    }
}

/// The paths no sandboxed child reads or runs anything from: credentials, acpd's own state,
/// its children's worktrees and tmps.
fn denied(home: Option<&Path>, data: Option<&Path>) -> Vec<PathBuf> {
    let mut deny: Vec<PathBuf> = Vec::new();
    if let Some(home) = home {
        deny.extend(DENY_HOME.iter().map(|d| home.join(d)));
    }
    if let Some(data) = data {
        // Other children's worktrees and tmps; a child's own are write roots of its own.
        deny.push(data.join("worktrees"));
        deny.push(data.join("tmp"));
    }
    deny.extend(crate::supervise::default_state_dir());
    deny
}

/// Whether a sandboxed child could run the program at `path`: a regular file, executable by
/// this user, not beneath anything the sandbox denies (checked resolved, as the kernel would
/// find it).
pub(super) fn runnable_in_sandbox(path: &Path) -> Result<PathBuf, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", real.display()));
    }
    nix::unistd::access(&real, nix::unistd::AccessFlags::X_OK)
        .map_err(|e| format!("{} is not executable: {}", real.display(), e.desc()))?;
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let data = presets::data_dir();
    let denied = denied(home.as_deref(), data.as_deref())
        .into_iter()
        .filter_map(|d| std::fs::canonicalize(d).ok())
        .find(|d| real.starts_with(d));
    match denied {
        Some(d) => Err(format!(
            "{} lies in {}, which a sandboxed child may not read",
            real.display(),
            d.display()
        )),
        None => Ok(real),
    }
}

use std::os::unix::fs::DirBuilderExt as _;
