//! Why a child's program could not be started, in words a person can act on: the program, the
//! PATH searched, the OS error by name, and what to do next. The kernel's error alone is
//! ambiguous — `ENOENT` for a script whose `#!` interpreter is missing although the script is
//! there, `EACCES` for a directory — so the file is looked at again after the failure.
//!
//! Only the operator's own facts appear here (the configured command, the agent's PATH, the
//! file's mode and first line); never the child's output.

use std::ffi::OsStr;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

/// The longest `#!` line read back.
const SHEBANG_MAX: usize = 256;

/// What the failed start was asked to run, captured before the spawn consumed it.
#[derive(Debug, Clone)]
pub(super) struct Program {
    /// `command[0]` as configured.
    pub name: String,
    /// `PATH` in the child's environment (what `execvp` searches).
    pub path_var: Option<std::ffi::OsString>,
    /// The env_file that gave that PATH: then it is named, and neither PATH nor a file found
    /// on it is shown.
    path_from: Option<String>,
    pub cwd: PathBuf,
}

impl Program {
    pub(super) fn of(
        argv0: &str,
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cwd: &Path,
    ) -> Self {
        Program {
            name: argv0.to_string(),
            path_var: env
                .iter()
                .rev()
                .find(|(k, _)| k == OsStr::new("PATH"))
                .map(|(_, v)| v.clone()),
            path_from: None,
            cwd: cwd.to_path_buf(),
        }
    }

    /// This program, its PATH given by the env_file `file`.
    pub(super) fn with_path_from(mut self, file: String) -> Self {
        self.path_from = Some(file);
        self
    }

    /// How `file` (the one [`Program::file`] found) is shown: not where it is when that is a
    /// directory of an env_file's PATH.
    fn shown_file(&self, file: &Path) -> String {
        match &self.path_from {
            Some(env_file) if self.searches_path() => {
                format!(
                    "{:?} (found on the PATH from env_file {env_file})",
                    self.name
                )
            }
            _ => shown(file),
        }
    }

    fn searches_path(&self) -> bool {
        !self.name.contains('/')
    }

    fn shown_path(&self) -> String {
        if let Some(env_file) = &self.path_from {
            return format!("the PATH from env_file {env_file} (value not shown)");
        }
        match &self.path_var {
            Some(p) if !p.is_empty() => p.to_string_lossy().into_owned(),
            _ => "(unset: the C library's default, /bin:/usr/bin)".into(),
        }
    }

    /// The directories `execvp` tries, in order: an empty entry is the cwd, a relative one is
    /// relative to it.
    fn dirs(&self) -> Vec<PathBuf> {
        let raw = match &self.path_var {
            Some(p) if !p.is_empty() => p.to_string_lossy().into_owned(),
            _ => "/bin:/usr/bin".into(),
        };
        raw.split(':')
            .map(|d| {
                if d.is_empty() {
                    self.cwd.clone()
                } else {
                    self.cwd.join(d)
                }
            })
            .collect()
    }

    /// The file the start would have run: the first PATH entry holding the name (anything at
    /// all, even a dangling symlink or a directory, as `execvp` would try it), or the path as
    /// given.
    fn file(&self) -> Option<PathBuf> {
        if !self.searches_path() {
            // `components` drops the `.` of `./agent`, so the path reads as the file's.
            return Some(self.cwd.join(&self.name).components().collect());
        }
        self.dirs()
            .into_iter()
            .map(|d| d.join(&self.name))
            .find(|f| f.symlink_metadata().is_ok())
    }
}

/// One sentence (a few clauses) for a spawn that failed with `err`.
pub(super) fn spawn_failed(program: &Program, err: &std::io::Error) -> String {
    let errno = err.raw_os_error().map(Errno::from_raw);
    let os = match errno {
        Some(e) => format!("{e:?}: {}", e.desc()),
        None => err.to_string(),
    };
    let searched = if program.searches_path() {
        format!("; PATH searched: {}", program.shown_path())
    } else {
        String::new()
    };
    let (why, next) = explain(program, errno);
    format!(
        "cannot start {:?}: {why} ({os}{searched}); {next}",
        program.name
    )
}

/// A program that started and ended before answering `initialize`: if the file is one the
/// kernel cannot run (`execvp` then hands it to `/bin/sh`, which runs it as a script), why.
pub(super) fn exited_early(program: &Program) -> Option<String> {
    let file = program.file()?;
    let head = head(&file)?;
    if head.is_empty() {
        return Some(format!(
            "{} is an empty file: it has no #! line, so /bin/sh ran it and it did nothing; \
             point the provider's command at the agent's real executable",
            program.shown_file(&file)
        ));
    }
    if !head.starts_with(b"#!") && !head.starts_with(b"\x7fELF") && head.contains(&0) {
        return Some(format!(
            "{} is not an executable for this machine (no #! line, not ELF): /bin/sh could \
             not run it; point the provider's command at the agent's real executable",
            program.shown_file(&file)
        ));
    }
    None
}

/// What went wrong and what to do about it.
fn explain(program: &Program, errno: Option<Errno>) -> (String, String) {
    let fix_command = "fix the first word of the provider's command";
    if !program.cwd.is_dir() {
        return (
            format!(
                "its working directory {} is not an existing directory",
                shown(&program.cwd)
            ),
            "create it, or give the run another cwd".into(),
        );
    }
    let Some(file) = program.file() else {
        return if program.searches_path() {
            (
                "no such program in any directory of PATH".into(),
                "install it, or put its absolute path in the provider's command".into(),
            )
        } else {
            ("no such file".into(), fix_command.into())
        };
    };
    let at = program.shown_file(&file);
    let meta = std::fs::metadata(&file);
    if let Err(e) = &meta {
        if e.raw_os_error() == Some(Errno::ELOOP as i32) {
            return (
                format!("{at} is a symbolic link loop"),
                "fix the links, or point the provider's command at the real file".into(),
            );
        }
        if let Ok(target) = std::fs::read_link(&file) {
            // Where it points is as secret as the env_file's PATH it was found on.
            let to = match &program.path_from {
                Some(_) if program.searches_path() => "a file".to_string(),
                _ => shown(&target),
            };
            return (
                format!("{at} is a symbolic link to {to}, which does not exist"),
                "reinstall the agent, or fix the link".into(),
            );
        }
    }
    if meta.as_ref().is_ok_and(|m| m.is_dir()) {
        return (
            format!("{at} is a directory, not a program"),
            fix_command.into(),
        );
    }
    match errno {
        Some(Errno::EACCES) => {
            let mode = meta
                .as_ref()
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0);
            if nix::unistd::access(&file, nix::unistd::AccessFlags::X_OK).is_err() {
                return (
                    format!("{at} is not executable (mode {mode:04o})"),
                    format!("make it executable: chmod +x {at}"),
                );
            }
            if let Some(interp) = interpreter(&file) {
                return (
                    format!(
                        "the script's interpreter {} is not executable",
                        shown(Path::new(&interp))
                    ),
                    "fix the script's #! line".into(),
                );
            }
            (
                format!(
                    "{at} may not be executed here (a filesystem mounted noexec, or a security policy)"
                ),
                "move the agent to a filesystem that allows execution".into(),
            )
        }
        Some(Errno::ENOENT) => match interpreter(&file) {
            Some(interp) if interp.ends_with('\r') => (
                format!(
                    "the script's interpreter {:?} was not found: its #! line ends in a carriage \
                     return (Windows line endings)",
                    interp
                ),
                format!("convert {at} to Unix line endings (dos2unix)"),
            ),
            Some(interp) => (
                format!(
                    "the script's interpreter {} was not found ({at} exists; its #! line names it)",
                    shown(Path::new(&interp))
                ),
                "install the interpreter, or fix the script's #! line".into(),
            ),
            None if head(&file).is_some_and(|h| h.starts_with(b"\x7fELF")) => (
                format!(
                    "{at} is a binary whose dynamic loader is missing (built for another system?)"
                ),
                "install the build of the agent made for this system".into(),
            ),
            None => ("no such file".into(), fix_command.into()),
        },
        Some(Errno::ENOEXEC) => (
            format!(
                "{at} is not a program this machine can run (no #! line, not an executable for it)"
            ),
            fix_command.into(),
        ),
        Some(Errno::ENOTDIR) => (
            format!("a component of {at} is not a directory"),
            fix_command.into(),
        ),
        Some(Errno::ETXTBSY) => (
            format!("{at} is being written"),
            "wait for the install to finish, then retry".into(),
        ),
        _ => (format!("{at} could not be run"), fix_command.into()),
    }
}

/// The file's first bytes, up to the end of a `#!` line; `None` for anything but a regular
/// file (a FIFO planted at the command's path must not block this thread).
fn head(file: &Path) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(SHEBANG_MAX);
    crate::private_fs::open_regular(file, crate::private_fs::Links::Follow)
        .ok()?
        .take(SHEBANG_MAX as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// The interpreter a `#!` line names, as the kernel reads it: after `#!` and blanks, up to the
/// next blank or the newline (a carriage return stays part of it, as it does for the kernel).
fn interpreter(file: &Path) -> Option<String> {
    let head = head(file)?;
    let line = head.strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next().unwrap_or(line);
    let start = line.iter().position(|b| *b != b' ' && *b != b'\t')?;
    let word = line[start..]
        .split(|b| *b == b' ' || *b == b'\t')
        .next()
        .unwrap_or_default();
    (!word.is_empty()).then(|| String::from_utf8_lossy(word).into_owned())
}

/// A path as shown in a cause: quoted and escaped, so a control character in a name cannot
/// reach a terminal raw.
fn shown(p: &Path) -> String {
    format!("{:?}", p.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn program(name: &str, path: &Path, cwd: &Path) -> Program {
        Program {
            name: name.into(),
            path_var: Some(path.as_os_str().to_owned()),
            path_from: None,
            cwd: cwd.to_path_buf(),
        }
    }

    fn enoent() -> std::io::Error {
        std::io::Error::from_raw_os_error(Errno::ENOENT as i32)
    }

    fn eacces() -> std::io::Error {
        std::io::Error::from_raw_os_error(Errno::EACCES as i32)
    }

    #[test]
    fn a_missing_program_names_the_path_searched() {
        let d = tempfile::tempdir().unwrap();
        let said = spawn_failed(
            &program("nosuch-acp", Path::new("/a:/b"), d.path()),
            &enoent(),
        );
        assert!(
            said.starts_with("cannot start \"nosuch-acp\": no such program"),
            "{said}"
        );
        assert!(said.contains("ENOENT"), "{said}");
        assert!(said.contains("PATH searched: /a:/b"), "{said}");
        assert!(said.contains("install it"), "{said}");
    }

    #[test]
    fn a_path_from_an_env_file_is_named_by_the_file_and_never_shown() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret-dir");
        std::fs::create_dir_all(secret.join("agent")).unwrap();
        let p = program("agent", &secret, d.path()).with_path_from("/etc/acpd/x.env".into());
        let eacces = std::io::Error::from_raw_os_error(Errno::EACCES as i32);
        let said = spawn_failed(&p, &eacces);
        assert!(
            said.contains(
                "PATH searched: the PATH from env_file /etc/acpd/x.env (value not shown)"
            ),
            "{said}"
        );
        assert!(
            said.contains(
                "\"agent\" (found on the PATH from env_file /etc/acpd/x.env) is a directory"
            ),
            "{said}"
        );
        assert!(!said.contains("secret-dir"), "{said}");
    }

    /// A dangling link found on an env_file's PATH: where it points is inside that PATH's
    /// directories as often as not, so it is not shown either.
    #[test]
    fn a_dangling_link_on_an_env_file_s_path_does_not_show_its_target() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret-dir");
        std::fs::create_dir_all(&secret).unwrap();
        std::os::unix::fs::symlink(secret.join("gone"), secret.join("agent")).unwrap();
        let p = program("agent", &secret, d.path()).with_path_from("/etc/acpd/x.env".into());
        let enoent = std::io::Error::from_raw_os_error(Errno::ENOENT as i32);
        let said = spawn_failed(&p, &enoent);
        assert!(said.contains("symbolic link"), "{said}");
        assert!(!said.contains("secret-dir"), "{said}");
    }

    #[test]
    fn a_script_with_a_missing_or_crlf_interpreter_says_so() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("agent");
        std::fs::write(&f, "#!/nonexistent/interp -x\necho\n").unwrap();
        let said = spawn_failed(&program("agent", d.path(), d.path()), &enoent());
        assert!(
            said.contains("the script's interpreter \"/nonexistent/interp\" was not found"),
            "{said}"
        );
        std::fs::write(&f, "#!/bin/sh\r\necho\r\n").unwrap();
        let said = spawn_failed(&program(f.to_str().unwrap(), d.path(), d.path()), &enoent());
        assert!(said.contains("carriage return"), "{said}");
        assert!(said.contains("dos2unix"), "{said}");
        assert!(!said.contains("PATH searched"), "{said}");
    }

    #[test]
    fn eacces_tells_a_directory_from_a_file_without_x() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("agent");
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let said = spawn_failed(&program(f.to_str().unwrap(), d.path(), d.path()), &eacces());
        if !nix::unistd::geteuid().is_root() {
            assert!(said.contains("is not executable (mode 0644)"), "{said}");
            assert!(said.contains("chmod +x"), "{said}");
        }
        let said = spawn_failed(
            &program(d.path().to_str().unwrap(), d.path(), d.path()),
            &eacces(),
        );
        assert!(said.contains("is a directory"), "{said}");
    }

    #[test]
    fn links_that_loop_or_dangle_are_named() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        symlink(&b, &a).unwrap();
        symlink(&a, &b).unwrap();
        let eloop = std::io::Error::from_raw_os_error(Errno::ELOOP as i32);
        let said = spawn_failed(&program("a", d.path(), d.path()), &eloop);
        assert!(said.contains("symbolic link loop"), "{said}");
        symlink("/nonexistent/target", d.path().join("c")).unwrap();
        let said = spawn_failed(&program("c", d.path(), d.path()), &enoent());
        assert!(said.contains("which does not exist"), "{said}");
    }

    #[test]
    fn a_relative_path_entry_is_relative_to_the_cwd() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("bin")).unwrap();
        std::fs::write(d.path().join("bin/agent"), "#!/nonexistent/sh\n").unwrap();
        let said = spawn_failed(&program("agent", Path::new("bin"), d.path()), &enoent());
        assert!(said.contains("interpreter \"/nonexistent/sh\""), "{said}");
    }

    #[test]
    fn an_empty_file_is_named_after_it_ran_as_a_script() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("agent"), "").unwrap();
        let said = exited_early(&program("agent", d.path(), d.path())).unwrap();
        assert!(said.contains("is an empty file"), "{said}");
        std::fs::write(d.path().join("agent"), "#!/bin/sh\nexit 1\n").unwrap();
        assert!(exited_early(&program("agent", d.path(), d.path())).is_none());
    }
}
