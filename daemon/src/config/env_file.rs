//! `env_file`: a provider's credentials in a `KEY=VALUE` file, added to its child's
//! environment — the way a daemon gets an API key without it being in its unit, its config or
//! the environment of every process it starts.
//!
//! The key is written as an absolute path, or as `${CREDENTIALS_DIRECTORY}/NAME`: a systemd
//! credential (`LoadCredential=NAME:/etc/acpd/NAME` in the unit), which systemd copies into a
//! directory only the service can read and names in `$CREDENTIALS_DIRECTORY`. Only that one
//! variable is expanded, and only as the first component.
//!
//! The file is read at every spawn (a new key takes effect without a reload) and must be a
//! regular file, not a symlink, owned by acpd's user (or root), with no access for anyone
//! else: mode 0600 or 0400. A systemd credential is root's, readable by the service through
//! an ACL, so it shows as 0440; inside `$CREDENTIALS_DIRECTORY` group read is accepted.
//! Anything else is refused with what to run. Values never appear in an error, a log line,
//! `acpd status` or a trace: [`Secrets`] prints names only.

use std::ffi::OsString;
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// The variable systemd sets for a unit with `LoadCredential=`.
pub(crate) const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// The most an env file may hold: credentials are short, and a larger file is a mistake.
pub(crate) const MAX_ENV_FILE: u64 = 64 * 1024;

/// Where a provider's env file is, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvFile {
    /// An absolute path.
    Path(PathBuf),
    /// A file name in `$CREDENTIALS_DIRECTORY`, resolved when the file is read.
    Credential(String),
}

impl std::fmt::Display for EnvFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvFile::Path(p) => write!(f, "{}", p.display()),
            EnvFile::Credential(name) => write!(f, "${{{CREDENTIALS_DIRECTORY}}}/{name}"),
        }
    }
}

/// Why an env file was not used. No variant carries a value from the file.
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    #[error(
        "env_file {file}: $CREDENTIALS_DIRECTORY is not set; systemd sets it for a unit with \
         LoadCredential= (systemd/system/acpd.service), so outside that unit name the file by \
         its absolute path"
    )]
    NoCredentialsDirectory { file: String },
    #[error(
        "env_file {}: is a symlink; acpd reads credentials only from the file itself: point \
         env_file at it",
        path.display()
    )]
    Symlink { path: PathBuf },
    #[error("env_file {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("env_file {}: {why}", path.display())]
    Unsafe { path: PathBuf, why: String },
    #[error("env_file {}:{line}: {why} (the line is not shown: it may hold a secret)", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        why: &'static str,
    },
}

/// Variables read from an env file. Its `Debug` shows the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(Vec<(String, String)>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Secrets {
    /// The variable names, in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// True when `name` is in the file with a non-empty value.
    pub fn is_set(&self, name: &str) -> bool {
        self.0.iter().any(|(k, v)| k == name && !v.is_empty())
    }

    /// True when the file sets `name` to exactly `value` (so where `value` shows, the file
    /// is named instead).
    pub fn gives(&self, name: &str, value: &std::ffi::OsStr) -> bool {
        self.0.iter().any(|(k, v)| k == name && value == v.as_str())
    }

    /// `env` with these variables set over it (a name already there is replaced).
    pub fn over(&self, env: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
        let mut out: Vec<(OsString, OsString)> = env
            .iter()
            .filter(|(k, _)| !self.0.iter().any(|(n, _)| k == n.as_str()))
            .cloned()
            .collect();
        out.extend(self.0.iter().map(|(k, v)| (k.into(), v.into())));
        out
    }
}

impl EnvFile {
    /// The configured text checked: an absolute path, or `${CREDENTIALS_DIRECTORY}/NAME`.
    pub fn parse(text: &str) -> Result<EnvFile, String> {
        if text.contains('\0') {
            return Err("must not contain NUL".into());
        }
        let braced = format!("${{{CREDENTIALS_DIRECTORY}}}/");
        let bare = format!("${CREDENTIALS_DIRECTORY}/");
        if let Some(name) = text
            .strip_prefix(&braced)
            .or_else(|| text.strip_prefix(&bare))
        {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(format!(
                    "after ${{{CREDENTIALS_DIRECTORY}}}/ comes one file name (the credential's \
                     name in LoadCredential=), got {name:?}"
                ));
            }
            return Ok(EnvFile::Credential(name.to_owned()));
        }
        if text.contains('$') {
            return Err(format!(
                "only ${{{CREDENTIALS_DIRECTORY}}} is expanded, as the first component; got {text:?}"
            ));
        }
        if !Path::new(text).is_absolute() {
            return Err(format!("must be an absolute path, got {text:?}"));
        }
        Ok(EnvFile::Path(PathBuf::from(text)))
    }

    /// The file's path, `$CREDENTIALS_DIRECTORY` looked up in `env`.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, EnvFileError> {
        match self {
            EnvFile::Path(p) => Ok(p.clone()),
            EnvFile::Credential(name) => env(CREDENTIALS_DIRECTORY)
                .map(PathBuf::from)
                .filter(|d| d.is_absolute())
                .map(|d| d.join(name))
                .ok_or_else(|| EnvFileError::NoCredentialsDirectory {
                    file: self.to_string(),
                }),
        }
    }

    /// Reads and checks the file (see the module doc) in this process's environment.
    pub fn read(&self) -> Result<Secrets, EnvFileError> {
        let path = self.resolve(|k| std::env::var_os(k))?;
        read_checked(&path, matches!(self, EnvFile::Credential(_)))
    }
}

fn read_checked(path: &Path, credential: bool) -> Result<Secrets, EnvFileError> {
    let unsafe_ = |why: String| EnvFileError::Unsafe {
        path: path.to_path_buf(),
        why,
    };
    // O_NOFOLLOW: a symlink is refused, not followed; O_NONBLOCK: a FIFO cannot block the open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| {
            if source.raw_os_error() == Some(nix::libc::ELOOP) {
                EnvFileError::Symlink {
                    path: path.to_path_buf(),
                }
            } else {
                EnvFileError::Open {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
    let meta = file.metadata().map_err(|source| EnvFileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(unsafe_(format!(
            "is {what}, not a regular file: write the KEY=VALUE lines to a file"
        )));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(unsafe_(format!(
            "is owned by uid {}, not by acpd's user (uid {me}) or root; another user could \
             change the key: run `chown {me} {}`",
            meta.uid(),
            path.display()
        )));
    }
    let mode = meta.mode() & 0o7777;
    // A systemd credential is root's 0400 with an ACL for the service: its mask shows as 0440.
    let allowed = if credential && meta.uid() == 0 {
        0o740
    } else {
        0o700
    };
    if mode & !allowed & 0o777 != 0 {
        return Err(unsafe_(format!(
            "has mode {mode:04o}, so others may read or change the key: run `chmod 600 {}`",
            path.display()
        )));
    }
    // The directories above it too: another user who can write one can swap the file.
    match crate::trusted_path::check(path) {
        Ok(()) | Err(crate::trusted_path::Untrusted::Io { .. }) => {}
        Err(e) => return Err(unsafe_(format!("is not acpd's user's alone: {e}"))),
    }
    if meta.len() > MAX_ENV_FILE {
        return Err(unsafe_(format!(
            "is larger than {MAX_ENV_FILE} bytes; an env file holds a few KEY=VALUE lines"
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ENV_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| EnvFileError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_ENV_FILE {
        return Err(unsafe_(format!(
            "is larger than {MAX_ENV_FILE} bytes; an env file holds a few KEY=VALUE lines"
        )));
    }
    parse_lines(&bytes).map_err(|(line, why)| EnvFileError::Syntax {
        path: path.to_path_buf(),
        line,
        why,
    })
}

/// `KEY=VALUE` lines; blank lines and `#` comments skipped; `export ` before a key allowed;
/// the value trimmed, one pair of matching surrounding quotes removed, nothing else
/// interpreted. A later line for the same key wins. Errors are (line, why), never the text.
fn parse_lines(bytes: &[u8]) -> Result<Secrets, (usize, &'static str)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for (i, raw) in bytes.split(|b| *b == b'\n').enumerate() {
        let line = i + 1;
        if raw.contains(&0) {
            return Err((line, "contains a NUL byte"));
        }
        let text = std::str::from_utf8(raw).map_err(|_| (line, "is not UTF-8"))?;
        let text = text.strip_suffix('\r').unwrap_or(text).trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let text = text.strip_prefix("export ").unwrap_or(text);
        let Some((key, value)) = text.split_once('=') else {
            return Err((line, "expected KEY=VALUE"));
        };
        let key = key.trim();
        let good_key = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !good_key {
            return Err((
                line,
                "the name before '=' must be letters, digits and '_', not starting with a digit",
            ));
        }
        if key.starts_with("ACPD_") {
            return Err((line, "names starting with ACPD_ are acpd's own"));
        }
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| {
                value
                    .strip_prefix(*q)
                    .and_then(|v| v.strip_suffix(*q))
                    .filter(|_| value.len() >= 2)
            })
            .unwrap_or(value);
        vars.retain(|(k, _)| k != key);
        vars.push((key.to_owned(), value.to_owned()));
    }
    Ok(Secrets(vars))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn write(dir: &Path, name: &str, text: &[u8], mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn read(path: &Path) -> Result<Secrets, EnvFileError> {
        EnvFile::Path(path.to_path_buf()).read()
    }

    #[test]
    fn the_configured_text_is_a_path_or_a_credential_name() {
        assert_eq!(
            EnvFile::parse("/etc/acpd/a.env"),
            Ok(EnvFile::Path("/etc/acpd/a.env".into()))
        );
        let cred = EnvFile::parse("${CREDENTIALS_DIRECTORY}/anthropic").unwrap();
        assert_eq!(cred, EnvFile::Credential("anthropic".into()));
        assert_eq!(cred.to_string(), "${CREDENTIALS_DIRECTORY}/anthropic");
        assert_eq!(
            EnvFile::parse("$CREDENTIALS_DIRECTORY/a"),
            Ok(EnvFile::Credential("a".into()))
        );
        for bad in [
            "a.env",
            "${CREDENTIALS_DIRECTORY}/../x",
            "${CREDENTIALS_DIRECTORY}/a/b",
            "${CREDENTIALS_DIRECTORY}/",
            "${HOME}/a.env",
            "/a\0b",
        ] {
            assert!(EnvFile::parse(bad).is_err(), "{bad}");
        }
        let unset = cred.resolve(|_| None).unwrap_err().to_string();
        assert!(unset.contains("LoadCredential="), "{unset}");
        assert_eq!(
            cred.resolve(|_| Some("/run/credentials/acpd.service".into()))
                .unwrap(),
            Path::new("/run/credentials/acpd.service/anthropic")
        );
    }

    #[test]
    fn lines_are_key_value_and_errors_never_show_the_line() {
        let s = parse_lines(
            b"# comment\n\nA=1\nexport B = \"two words\" \r\nC='x'\nD=\nA=3\nE=a=b\nF=\"\n",
        )
        .unwrap();
        let got: Vec<(&str, &str)> = s.0.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        assert_eq!(
            got,
            [
                ("B", "two words"),
                ("C", "x"),
                ("D", ""),
                ("A", "3"),
                ("E", "a=b"),
                ("F", "\"")
            ]
        );
        assert!(s.is_set("A") && !s.is_set("D") && !s.is_set("Z"));
        assert_eq!(format!("{s:?}"), r#"["B", "C", "D", "A", "E", "F"]"#);
        assert_eq!(
            parse_lines(b"A=1\nsk-ant-secret\n"),
            Err((2, "expected KEY=VALUE"))
        );
        assert_eq!(parse_lines(b"A=se\0cret"), Err((1, "contains a NUL byte")));
        assert!(parse_lines(b"1A=x").is_err());
        assert!(parse_lines(b"A B=x").is_err());
        assert!(parse_lines(b"A=\xff").is_err());
        assert!(parse_lines(b"ACPD_DEPTH=0").is_err());
    }

    #[test]
    fn only_a_private_regular_file_of_acpds_user_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let good = write(dir.path(), "good", b"ANTHROPIC_API_KEY=sk-1\n", 0o600);
        assert!(read(&good).unwrap().is_set("ANTHROPIC_API_KEY"));
        let ro = write(dir.path(), "ro", b"A=1\n", 0o400);
        assert!(read(&ro).is_ok());
        for mode in [0o644, 0o640, 0o604, 0o620, 0o660] {
            let p = write(dir.path(), "open", b"A=sk-secret\n", mode);
            let e = read(&p).unwrap_err().to_string();
            assert!(e.contains("chmod 600") && !e.contains("sk-secret"), "{e}");
        }
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = read(&link).unwrap_err();
        assert!(matches!(e, EnvFileError::Symlink { .. }), "{e}");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read(&fifo).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
        let huge = write(
            dir.path(),
            "huge",
            &vec![b'#'; MAX_ENV_FILE as usize + 1],
            0o600,
        );
        let e = read(&huge).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        let e = read(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("No such file"), "{e}");
        let e = read(&write(dir.path(), "bad", b"A=1\nB\n", 0o600))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(":2: expected KEY=VALUE (the line is not shown: it may hold a secret)"),
            "{e}"
        );
    }

    #[test]
    fn a_file_of_another_user_is_refused() {
        // Only root can make a file another user owns; skipped otherwise.
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "theirs", b"A=1\n", 0o600);
        nix::unistd::chown(&p, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
        // A root-owned credential may be group-readable (systemd's ACL mask); a path may not.
        let cred = write(dir.path(), "cred", b"A=1\n", 0o440);
        assert!(read_checked(&cred, true).is_ok());
        assert!(read_checked(&cred, false).is_err());
    }

    #[test]
    fn the_files_variables_replace_the_same_names() {
        let s = Secrets(vec![("K".into(), "new".into())]);
        let env = vec![("K".into(), "old".into()), ("P".into(), "/bin".into())];
        let out = s.over(&env);
        assert_eq!(out.len(), 2);
        assert!(out.contains(&("K".into(), "new".into())));
        assert!(out.contains(&("P".into(), "/bin".into())));
    }
}
