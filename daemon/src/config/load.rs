//! Where the config file is looked for, and how it is read.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::defaults::ETC_CONFIG;
use super::{Config, ConfigError};
use crate::private_fs::{Links, OpenError, open_regular};

impl Config {
    /// Finds the file per the discovery order (reads env vars `ACPD_CONFIG`,
    /// `XDG_CONFIG_HOME`, `HOME`) and loads it, or returns [`Config::builtin`].
    pub fn load(explicit: Option<&Path>, echo_command: Vec<String>) -> Result<Config, ConfigError> {
        // A path whose existence cannot be determined (e.g. permission denied on
        // a parent) counts as existing, so the read reports the real cause.
        let exists = |p: &Path| p.try_exists().unwrap_or(true);
        match Self::discover(explicit, |k| std::env::var(k).ok(), exists)? {
            None => Ok(Self::builtin(echo_command)),
            Some(path) => {
                let text = read_regular(&path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                // Checked where it is executed: a config another user can swap is theirs.
                crate::trusted_path::check(&path).map_err(|e| ConfigError::Untrusted {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                Self::parse(&text, &path, echo_command)
            }
        }
    }

    /// The discovery order, as a pure function of the given env lookups, for testing.
    ///
    /// Empty variables count as unset. A relative `XDG_CONFIG_HOME` is ignored,
    /// as the XDG Base Directory spec requires, and `$HOME/.config` is used instead.
    pub fn discover(
        explicit: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        exists: impl Fn(&Path) -> bool,
    ) -> Result<Option<PathBuf>, ConfigError> {
        let var = |k: &str| env(k).filter(|v| !v.is_empty());
        let named = explicit
            .map(|p| (p.to_path_buf(), "--config"))
            .or_else(|| var("ACPD_CONFIG").map(|v| (PathBuf::from(v), "ACPD_CONFIG")));
        if let Some((path, origin)) = named {
            return if exists(&path) {
                Ok(Some(path))
            } else {
                Err(ConfigError::Missing { path, origin })
            };
        }
        let user = Self::user_path(env);
        let mut candidates = user.into_iter().chain([PathBuf::from(ETC_CONFIG)]);
        Ok(candidates.find(|p| exists(p)))
    }

    /// The user's own config file: `$XDG_CONFIG_HOME/acpd/config.toml` (absolute only), else
    /// `$HOME/.config/acpd/config.toml`; `None` without either. Where `acpd init` writes.
    pub fn user_path(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
        let var = |k: &str| env(k).filter(|v| !v.is_empty());
        let user_dir = var("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".config")));
        user_dir.map(|d| d.join("acpd").join("config.toml"))
    }
}

/// The most a config file may hold; a larger one is refused rather than read into memory.
const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Reads the config file, refusing anything but a regular file: a FIFO nobody writes (or a
/// device) would block the read forever or never end. Opened with `O_NONBLOCK` so the open
/// itself cannot block on a FIFO, then checked with `fstat` on what was opened.
fn read_regular(path: &Path) -> io::Result<String> {
    use std::io::Read as _;
    let file = open_regular(path, Links::Follow).map_err(|e| match e {
        OpenError::NotRegular(what) => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (it is {what}); point acpd at a regular file"),
        ),
        OpenError::Io(e) => e,
    })?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    Ok(text)
}
