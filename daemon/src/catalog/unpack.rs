//! Unpacking an agent archive (tar or zip) into a fresh directory without ever writing,
//! linking or chmodding outside it: the archive is a registry's word, not ours.
//!
//! The rules, the same for both formats:
//! - an entry's name is relative and has no `..` (an absolute or climbing name is refused,
//!   not stripped);
//! - no entry is written through a symbolic link: every directory on the way is checked with
//!   `lstat`, and a file is created with `O_CREAT|O_EXCL|O_NOFOLLOW` after whatever the
//!   archive put at its name before is removed (so a later entry never writes through an
//!   earlier hard or soft link);
//! - a symbolic link's target is relative, and once everything is unpacked every link must
//!   resolve (the kernel's own resolution, chains included) to something inside the
//!   directory — a link out, or to nothing, fails the install;
//! - a hard link names a regular file the archive already put inside the directory;
//! - devices, FIFOs and other special entries are refused;
//! - modes are `0755` (any execute bit in the archive) or `0644`: no setuid, no
//!   world-writable files.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// An archive that unpacks to more than this is refused (a decompression bomb would fill the
/// data directory's disk).
const MAX_UNPACKED: u64 = 8 << 30;
/// A symbolic link's target is a path, not a payload.
const MAX_LINK_TARGET: u64 = 4096;

/// What one archive entry is.
enum Kind<'a> {
    Dir,
    File { mode: u32, body: &'a mut dyn Read },
    Symlink(PathBuf),
    HardLink(PathBuf),
}

/// Writes entries into `dest` by the rules above; [`Unpacker::finish`] checks the links.
struct Unpacker<'a> {
    dest: &'a Path,
    written: u64,
    has_links: bool,
}

impl<'a> Unpacker<'a> {
    fn new(dest: &'a Path) -> Self {
        Unpacker {
            dest,
            written: 0,
            has_links: false,
        }
    }

    fn entry(&mut self, name: &Path, kind: Kind<'_>) -> Result<(), String> {
        let Some(rel) = inside_name(name) else {
            return Err(format!(
                "entry {name:?} is not a relative path inside the archive"
            ));
        };
        if rel.as_os_str().is_empty() {
            // `./`: the directory itself.
            return Ok(());
        }
        let shown = rel.display().to_string();
        let parent = rel.parent().unwrap_or(Path::new(""));
        let at = self.dirs(parent, &shown)?;
        let to = at.join(rel.file_name().unwrap_or_default());
        let existing = std::fs::symlink_metadata(&to).ok();
        if let Kind::Dir = kind {
            return match existing {
                Some(m) if m.file_type().is_dir() => Ok(()),
                Some(_) => Err(format!("entry {shown:?} is a directory and a file")),
                None => std::fs::create_dir(&to).map_err(|e| format!("{shown}: {e}")),
            };
        }
        // A later entry of the same name replaces the earlier one: the name is freed first so
        // the new file is a new inode, never written through what was there.
        match existing {
            Some(m) if m.file_type().is_dir() => {
                return Err(format!("entry {shown:?} is a directory and a file"));
            }
            Some(_) => std::fs::remove_file(&to).map_err(|e| format!("{shown}: {e}"))?,
            None => {}
        }
        match kind {
            Kind::Dir => Ok(()),
            Kind::File { mode, body } => self.file(&to, &shown, mode, body),
            Kind::Symlink(target) => {
                if !lexically_inside(parent, &target) {
                    return Err(format!(
                        "entry {shown:?} is a link to {}, outside the archive",
                        target.display()
                    ));
                }
                self.has_links = true;
                std::os::unix::fs::symlink(&target, &to).map_err(|e| format!("{shown}: {e}"))
            }
            Kind::HardLink(target) => {
                let Some(source) = inside_name(&target).filter(|t| !t.as_os_str().is_empty())
                else {
                    return Err(format!(
                        "entry {shown:?} is a hard link to {}, outside the archive",
                        target.display()
                    ));
                };
                let source_dir = self.existing_dirs(source.parent().unwrap_or(Path::new("")));
                let source = source_dir
                    .map(|d| d.join(source.file_name().unwrap_or_default()))
                    .filter(|s| std::fs::symlink_metadata(s).is_ok_and(|m| m.is_file()))
                    .ok_or_else(|| {
                        format!(
                            "entry {shown:?} is a hard link to {}, which is not a file the \
                             archive holds",
                            target.display()
                        )
                    })?;
                // linkat(2) without AT_SYMLINK_FOLLOW: the source was just checked to be a
                // regular file, and a link is never followed anyway.
                std::fs::hard_link(&source, &to).map_err(|e| format!("{shown}: {e}"))
            }
        }
    }

    /// `dest/<parent>`, creating the directories on the way; none may be a link.
    fn dirs(&self, parent: &Path, shown: &str) -> Result<PathBuf, String> {
        let mut at = self.dest.to_path_buf();
        for part in parent.components() {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!(
                        "entry {shown:?} passes through the link {}",
                        at.strip_prefix(self.dest).unwrap_or(&at).display()
                    ));
                }
                Ok(_) => {
                    return Err(format!(
                        "entry {shown:?} passes through {}, which is not a directory",
                        at.strip_prefix(self.dest).unwrap_or(&at).display()
                    ));
                }
                Err(_) => std::fs::create_dir(&at).map_err(|e| format!("{shown}: {e}"))?,
            }
        }
        Ok(at)
    }

    /// `dest/<parent>` when every directory on the way exists and none is a link.
    fn existing_dirs(&self, parent: &Path) -> Option<PathBuf> {
        let mut at = self.dest.to_path_buf();
        for part in parent.components() {
            at.push(part);
            if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_dir()) {
                return None;
            }
        }
        Some(at)
    }

    fn file(
        &mut self,
        to: &Path,
        shown: &str,
        mode: u32,
        body: &mut dyn Read,
    ) -> Result<(), String> {
        let mode = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .mode(mode)
            .open(to)
            .map_err(|e| format!("{shown}: {e}"))?;
        let budget = MAX_UNPACKED.saturating_sub(self.written);
        let n = std::io::copy(&mut body.take(budget.saturating_add(1)), &mut out)
            .map_err(|e| format!("{shown}: {e}"))?;
        self.written = self.written.saturating_add(n);
        if self.written > MAX_UNPACKED {
            return Err(format!(
                "the archive unpacks to more than {MAX_UNPACKED} bytes"
            ));
        }
        out.flush().map_err(|e| format!("{shown}: {e}"))
    }

    /// Every link in `dest` resolves (by the kernel, chains included) inside it.
    fn finish(self) -> Result<(), String> {
        if !self.has_links {
            return Ok(());
        }
        let root = std::fs::canonicalize(self.dest).map_err(|e| e.to_string())?;
        let mut stack = vec![self.dest.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| e.to_string())?;
            for entry in entries {
                let entry = entry.map_err(|e| e.to_string())?;
                let kind = entry.file_type().map_err(|e| e.to_string())?;
                let path = entry.path();
                if kind.is_dir() {
                    stack.push(path);
                } else if kind.is_symlink() {
                    let shown = path.strip_prefix(self.dest).unwrap_or(&path).display();
                    let target = std::fs::read_link(&path)
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    match std::fs::canonicalize(&path) {
                        Ok(real) if real.starts_with(&root) => {}
                        Ok(real) => {
                            return Err(format!(
                                "entry \"{shown}\" is a link to {target}, which resolves to {}, \
                                 outside the archive",
                                real.display()
                            ));
                        }
                        Err(e) => {
                            return Err(format!(
                                "entry \"{shown}\" is a link to {target}, which does not \
                                 resolve inside the archive ({e})"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// `name` without `./` parts when it is relative and never climbs (`..`); `None` otherwise.
pub(super) fn inside_name(name: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Whether link `target`, read from directory `parent` (relative to the archive's root),
/// stays inside the root by its text alone. Chains through other links are checked after
/// unpacking, by the kernel's resolution.
fn lexically_inside(parent: &Path, target: &Path) -> bool {
    if target.as_os_str().is_empty() {
        return false;
    }
    let mut depth: usize = parent.components().count();
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Unpacks a tar stream into `dest`.
pub(super) fn untar(reader: &mut dyn Read, dest: &Path) -> Result<(), String> {
    use tar::EntryType;
    let mut tar = tar::Archive::new(reader);
    let mut out = Unpacker::new(dest);
    for entry in tar.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let name = entry.path().map_err(|e| e.to_string())?.into_owned();
        let kind = match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let mode = entry.header().mode().unwrap_or(0o644);
                out.entry(
                    &name,
                    Kind::File {
                        mode,
                        body: &mut entry,
                    },
                )?;
                continue;
            }
            EntryType::Directory => Kind::Dir,
            EntryType::Symlink => Kind::Symlink(link_name(&entry)?),
            EntryType::Link => Kind::HardLink(link_name(&entry)?),
            // Metadata for the reader, not files.
            EntryType::XGlobalHeader | EntryType::XHeader => continue,
            other => {
                return Err(format!(
                    "entry {:?} is a {other:?}, not a file, directory or link",
                    name.display().to_string()
                ));
            }
        };
        out.entry(&name, kind)?;
    }
    out.finish()
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>) -> Result<PathBuf, String> {
    Ok(entry
        .link_name()
        .map_err(|e| e.to_string())?
        .map(|l| l.into_owned())
        .unwrap_or_default())
}

/// Unpacks a zip file into `dest`.
pub(super) fn unzip(file: File, dest: &Path) -> Result<(), String> {
    let mut zip = zip::ZipArchive::new(file).map_err(|e| e.to_string())?;
    let mut out = Unpacker::new(dest);
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| e.to_string())?;
        let name = PathBuf::from(entry.name().map_err(|e| e.to_string())?.into_owned());
        if entry.is_dir() {
            out.entry(&name, Kind::Dir)?;
        } else if entry.is_symlink() {
            let mut target = Vec::new();
            (&mut entry)
                .take(MAX_LINK_TARGET)
                .read_to_end(&mut target)
                .map_err(|e| e.to_string())?;
            use std::os::unix::ffi::OsStringExt;
            let target = PathBuf::from(std::ffi::OsString::from_vec(target));
            out.entry(&name, Kind::Symlink(target))?;
        } else {
            let mode = entry.unix_mode().unwrap_or(0o644);
            out.entry(
                &name,
                Kind::File {
                    mode,
                    body: &mut entry,
                },
            )?;
        }
    }
    out.finish()
}

/// Saves a raw binary as `dest/<cmd>` (by the same rules: a fresh file, no link followed).
pub(super) fn raw(archive: &Path, dest: &Path, cmd: &Path) -> Result<(), String> {
    let mut file = File::open(archive).map_err(|e| e.to_string())?;
    let mut out = Unpacker::new(dest);
    out.entry(
        cmd,
        Kind::File {
            mode: 0o755,
            body: &mut file,
        },
    )?;
    out.finish()
}
