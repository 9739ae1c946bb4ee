//! A `binary` distribution, installed once per agent version into
//! `<data dir>/registry/<id>/<version>/`: downloaded (its SHA-256 checked when the entry
//! gives one), extracted into a scratch directory beside it, and renamed into place only when
//! complete, so an interrupted install is never mistaken for a finished one.

use std::io::Read;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use sha2::Digest;

use super::fetch::{hex, open};
use super::unpack;
use super::{BinaryTarget, CatalogError, shown};

/// Agent archives are large (a bundled runtime), but not this large.
const MAX_ARCHIVE: u64 = 2 << 30;
const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How deep the search for a `cmd` not at its stated place goes.
const SEARCH_DEPTH: usize = 6;

/// One install at a time in this process: two starts of a new agent download it once.
static INSTALLING: Mutex<()> = Mutex::new(());

/// What kind of file the archive URL names (by its path's ending, query ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Zip,
    TarGz,
    TarBz2,
    Tar,
    Raw,
}

impl Kind {
    pub(super) fn of(url: &str) -> Kind {
        let path = url
            .split(['?', '#'])
            .next()
            .unwrap_or(url)
            .to_ascii_lowercase();
        if path.ends_with(".zip") {
            Kind::Zip
        } else if path.ends_with(".tar.gz") || path.ends_with(".tgz") {
            Kind::TarGz
        } else if path.ends_with(".tar.bz2") || path.ends_with(".tbz2") {
            Kind::TarBz2
        } else if path.ends_with(".tar") {
            Kind::Tar
        } else {
            Kind::Raw
        }
    }
}

/// The installed command's path: installs the archive first unless this version is there.
pub(super) fn ensure(
    data: &Path,
    id: &str,
    version: &str,
    target: &BinaryTarget,
) -> Result<PathBuf, CatalogError> {
    let cmd = relative_cmd(id, &target.cmd)?;
    let dir = data.join("registry").join(id).join(version);
    // acpd makes this directory itself (a rename): a link there is not its install.
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(CatalogError::Extract {
            url: shown(&target.archive),
            reason: format!("the install directory {} is a symbolic link", dir.display()),
        });
    }
    if !dir.is_dir() {
        let _one = INSTALLING.lock().unwrap_or_else(|p| p.into_inner());
        if !dir.is_dir() {
            install(&dir, target, &cmd)?;
        }
    }
    let exe = find_cmd(&dir, &cmd).map_err(|reason| CatalogError::Extract {
        url: shown(&target.archive),
        reason,
    })?;
    make_executable(&exe).map_err(|e| CatalogError::Io {
        what: "make the agent executable",
        path: exe.clone(),
        reason: e.to_string(),
    })?;
    Ok(exe)
}

/// `cmd` as a path inside the install directory: relative, without `..` (`./x` is `x`).
fn relative_cmd(id: &str, cmd: &str) -> Result<PathBuf, CatalogError> {
    let path = Path::new(cmd);
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => {
                return Err(CatalogError::BadCmd {
                    id: id.to_owned(),
                    cmd: cmd.to_owned(),
                });
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(CatalogError::BadCmd {
            id: id.to_owned(),
            cmd: cmd.to_owned(),
        });
    }
    Ok(out)
}

fn install(dir: &Path, target: &BinaryTarget, cmd: &Path) -> Result<(), CatalogError> {
    let url = &target.archive;
    let parent = dir.parent().unwrap_or(dir);
    let io = |what: &'static str, path: &Path| {
        let path = path.to_owned();
        move |e: std::io::Error| CatalogError::Io {
            what,
            path,
            reason: e.to_string(),
        }
    };
    std::fs::create_dir_all(parent).map_err(io("create the install directory", parent))?;
    let stamp = format!(
        ".partial-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    );
    let scratch = parent.join(format!(
        "{}{stamp}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("v")
    ));
    let download = parent.join(format!("{stamp}.download"));
    let result = (|| {
        fetch_to(url, &download, target.sha256.as_deref())?;
        std::fs::create_dir(&scratch).map_err(io("create the install directory", &scratch))?;
        extract(Kind::of(url), &download, &scratch, cmd).map_err(|reason| {
            CatalogError::Extract {
                url: shown(url),
                reason,
            }
        })?;
        match std::fs::rename(&scratch, dir) {
            Ok(()) => Ok(()),
            // Another acpd finished the same version first: theirs is as good.
            Err(_) if dir.is_dir() => Ok(()),
            Err(e) => Err(io("move the install into place", dir)(e)),
        }
    })();
    let _ = std::fs::remove_file(&download);
    if scratch.exists() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    result
}

/// Downloads `url` to `dest`, checking the size cap and the SHA-256 when given.
fn fetch_to(url: &str, dest: &Path, sha256: Option<&str>) -> Result<(), CatalogError> {
    let failed = |reason: String| CatalogError::Download {
        url: shown(url),
        reason,
    };
    let mut reader = open(url, MAX_ARCHIVE, ARCHIVE_TIMEOUT).map_err(|e| match e {
        CatalogError::Fetch { reason, .. } => failed(reason),
        e => e,
    })?;
    // A fresh file at a fresh name: nothing planted there is written through.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .mode(0o600)
        .open(dest)
        .map_err(|e| CatalogError::Io {
            what: "write the download",
            path: dest.to_owned(),
            reason: e.to_string(),
        })?;
    let mut hasher = sha2::Sha256::new();
    let mut total: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).map_err(|e| failed(e.to_string()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > MAX_ARCHIVE {
            return Err(failed(format!("larger than {MAX_ARCHIVE} bytes")));
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(|e| CatalogError::Io {
            what: "write the download",
            path: dest.to_owned(),
            reason: e.to_string(),
        })?;
    }
    file.sync_all().map_err(|e| failed(e.to_string()))?;
    if total == 0 {
        return Err(failed("the archive is empty".into()));
    }
    if let Some(expected) = sha256 {
        let actual = hex(&hasher.finalize());
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(CatalogError::Checksum {
                url: shown(url),
                expected: expected.to_ascii_lowercase(),
                actual,
            });
        }
    }
    Ok(())
}

/// Unpacks `archive` into `dest` by [`super::unpack`]'s rules: nothing written, linked or
/// chmodded outside it, and no link that resolves out of it.
pub(super) fn extract(kind: Kind, archive: &Path, dest: &Path, cmd: &Path) -> Result<(), String> {
    let file = std::fs::File::open(archive).map_err(|e| e.to_string())?;
    match kind {
        Kind::Zip => unpack::unzip(file, dest),
        Kind::TarGz => unpack::untar(&mut flate2::read::GzDecoder::new(file), dest),
        Kind::TarBz2 => unpack::untar(&mut bzip2::read::BzDecoder::new(file), dest),
        Kind::Tar => unpack::untar(&mut { file }, dest),
        // A raw binary is saved under the entry's own `cmd` (the registry's verifier does the
        // same).
        Kind::Raw => unpack::raw(archive, dest, cmd),
    }
}

/// The file to run: `cmd` where the entry says, else a file or link whose path ends with it
/// anywhere below (archives often wrap their contents in one top directory) — resolved by the
/// kernel to a regular file inside `dir`, and named by that real path, so nothing is ever
/// chmodded or run through a link (nor through one that an older install let out).
fn find_cmd(dir: &Path, cmd: &Path) -> Result<PathBuf, String> {
    let direct = dir.join(cmd);
    if std::fs::symlink_metadata(&direct).is_ok() {
        return inside(dir, &direct, cmd);
    }
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    let mut found: Vec<PathBuf> = Vec::new();
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth < SEARCH_DEPTH {
                stack.push((path, depth + 1));
            } else if (kind.is_file() || kind.is_symlink()) && path.ends_with(cmd) {
                found.push(path);
            }
        }
    }
    // The shallowest match, then the first by name: the same answer every time.
    found.sort_by_key(|p| (p.components().count(), p.clone()));
    match found.into_iter().next() {
        Some(path) => inside(dir, &path, cmd),
        None => Err(format!("the archive has no {}", cmd.display())),
    }
}

/// `path`'s real location when it is a regular file inside `dir` (links followed by the
/// kernel, then checked); an error naming `cmd` otherwise.
fn inside(dir: &Path, path: &Path, cmd: &Path) -> Result<PathBuf, String> {
    let root = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let real = std::fs::canonicalize(path)
        .map_err(|e| format!("{} does not resolve to a file ({e})", cmd.display()))?;
    if !real.starts_with(&root) {
        return Err(format!(
            "{} resolves to {}, outside the install directory",
            cmd.display(),
            real.display()
        ));
    }
    if !std::fs::symlink_metadata(&real).is_ok_and(|m| m.is_file()) {
        return Err(format!("{} is not a regular file", cmd.display()));
    }
    Ok(real)
}

/// Adds the execute bits to `path`, opened without following a link (and without blocking on
/// a FIFO swapped in), and changed through that descriptor only when it is a regular file.
fn make_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let file = crate::private_fs::open_regular(path, crate::private_fs::Links::Refuse)?;
    let mode = file.metadata()?.permissions().mode();
    if mode & 0o111 == 0o111 {
        return Ok(());
    }
    // fchmod(2): the file just checked, whatever its name points at now.
    file.set_permissions(std::fs::Permissions::from_mode((mode | 0o755) & 0o777))
}
