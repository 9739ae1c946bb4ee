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
use crate::supervise::{Sandbox, SandboxPlan, landlock_abi};

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

/// The sandbox for a child of `provider` whose workspace is `root`, with its env's `TMPDIR`
/// pointed at a private tmp; `None` when the provider has none (or `auto` found no Landlock).
pub(super) async fn sandbox_for(
    provider: &ProviderConfig,
    root: &Path,
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
    let plan = plan(
        provider,
        root,
        home.as_deref(),
        data.as_deref(),
        tmp.clone(),
    );
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
    let mut deny: Vec<PathBuf> = Vec::new();
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
        deny.extend(DENY_HOME.iter().map(|d| home.join(d)));
    }
    if let Some(data) = data {
        // Other children's worktrees and tmps; a child's own are write roots of its own.
        deny.push(data.join("worktrees"));
        deny.push(data.join("tmp"));
    }
    deny.extend(crate::supervise::default_state_dir());
    SandboxPlan {
        write,
        deny,
        network: provider.network,
        tmp: Some(tmp),
    }
}

use std::os::unix::fs::DirBuilderExt as _;
