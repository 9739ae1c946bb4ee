//! `acpd init [PRESET…]`: a first config, written where acpd will read it, the presets' agents
//! installed, `acpd doctor` run over them, and what is still missing said (a key, where to put
//! it for a daemon).
//!
//! The file is created 0600 in a directory of the user's (created 0700 if missing), never
//! through a symlink, and never over an existing file without `--force` (which replaces it by
//! an atomic rename, so a reader sees the old file or the new one).

use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::credentials::{ChildView, missing};
use super::{EXIT_USAGE, stdout_failed};
use crate::config::Config;
use crate::config::presets::{self, Preset, Source};

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Agents to configure and install: claude, codex, gemini, goose, opencode. None: a config
    /// for the built-in echo agent only.
    #[arg(value_name = "PRESET")]
    presets: Vec<String>,
    /// Replace an existing config file.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    pub(super) config: super::ConfigArg,
}

/// Why the config was not written.
#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error("no place for the config: set XDG_CONFIG_HOME or HOME, or give --config FILE")]
    NoPath,
    #[error(
        "{} already exists; acpd init never replaces a config: check it with `acpd doctor`, \
         or run `acpd init --force …` to replace it",
        path.display()
    )]
    Exists { path: PathBuf },
    #[error("{}: {why}", dir.display())]
    UnsafeDir { dir: PathBuf, why: String },
    #[error("refused: {0}")]
    Untrusted(#[from] crate::trusted_path::Untrusted),
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> InitError + 'a {
    move |source| InitError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

pub(super) async fn init(config: Option<&Path>, args: InitArgs) -> u8 {
    let mut chosen: Vec<&'static Preset> = Vec::new();
    for name in &args.presets {
        let Some(preset) = presets::find(name) else {
            errln!(
                "acpd: unknown preset {name:?} (valid: {})",
                presets::names().join(", ")
            );
            return EXIT_USAGE;
        };
        if !chosen.contains(&preset) {
            chosen.push(preset);
        }
    }
    let written = target(config).and_then(|path| {
        let text = render(&chosen, path.parent().unwrap_or(Path::new("/")));
        write_config(&path, &text, args.force).map(|()| path)
    });
    let path = match written {
        Ok(path) => path,
        Err(e) => {
            errln!("acpd: init: {e}");
            return 1;
        }
    };
    if let Err(e) = outln!("wrote {}", path.display()) {
        return stdout_failed(&e);
    }
    let installed = match install(&chosen) {
        Ok(ok) => ok,
        Err(e) => return stdout_failed(&e),
    };
    if let Err(e) = outln!("\nacpd doctor:") {
        return stdout_failed(&e);
    }
    let doctor = super::daemon::doctor(Some(&path), None, false).await;
    let summary = next_steps(&path, &chosen, doctor == 0 && installed);
    match summary {
        Ok(()) if installed => doctor,
        Ok(()) => 1,
        Err(e) => stdout_failed(&e),
    }
}

/// `--config FILE`, else `$ACPD_CONFIG`, else the user's XDG config path: where acpd reads.
fn target(explicit: Option<&Path>) -> Result<PathBuf, InitError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let path = explicit
        .map(Path::to_path_buf)
        .or_else(|| env("ACPD_CONFIG").map(PathBuf::from))
        .or_else(|| Config::user_path(env))
        .ok_or(InitError::NoPath)?;
    std::path::absolute(&path).map_err(io_err("resolve", &path))
}

/// Creates `path` 0600 with `text`: the directory (made 0700 if missing) must be the user's
/// and writable by nobody else; the file is opened relative to it with `O_NOFOLLOW` and
/// `O_EXCL`, or with `force` written beside it and renamed over it.
fn write_config(path: &Path, text: &str, force: bool) -> Result<(), InitError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(InitError::NoPath);
    };
    // Every directory above, as far as they exist, before anything is made: one another
    // user can write lets them swap the config acpd (root's, too) later runs.
    if let Some(existing) = dir.ancestors().find(|d| d.exists()) {
        crate::trusted_path::check(existing)?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err("create", dir))?;
    // A symlinked directory is followed (dotfiles are often linked); what it leads to must be
    // the user's own, so nobody else can swap the file.
    let dir_fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC)
        .open(dir)
        .map_err(io_err("open", dir))?;
    let meta = dir_fd.metadata().map_err(io_err("stat", dir))?;
    let me = nix::unistd::geteuid().as_raw();
    let unsafe_dir = |why: String| InitError::UnsafeDir {
        dir: dir.to_path_buf(),
        why,
    };
    if meta.uid() != me {
        return Err(unsafe_dir(format!(
            "is owned by uid {}, not by you (uid {me}); acpd writes its config only into a \
             directory of yours: give --config a path in one",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        // A shared sticky directory (/tmp) is meant to stay writable: never advise a chmod.
        let next = if meta.mode() & 0o1000 != 0 {
            "give --config a path in a directory of your own"
        } else {
            "`chmod go-w` it or give --config another path"
        };
        return Err(unsafe_dir(format!(
            "is writable by others (mode {:04o}); acpd writes its config only into a directory \
             nobody else can change: {next}",
            meta.mode() & 0o7777
        )));
    }
    // Where a symlinked directory leads, and everything above it.
    crate::trusted_path::check(dir)?;
    let create = |file: &std::ffi::OsStr| -> Result<File, InitError> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        nix::fcntl::openat(&dir_fd, file, flags, Mode::from_bits_truncate(0o600))
            .map(File::from)
            .map_err(|e| match e {
                nix::errno::Errno::EEXIST => InitError::Exists {
                    path: path.to_path_buf(),
                },
                e => io_err("create", path)(e.into()),
            })
    };
    let fill = |mut file: File, shown: &Path| -> Result<(), InitError> {
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.sync_all())
            .map_err(io_err("write", shown))
    };
    if !force {
        return fill(create(name)?, path);
    }
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(&tmp_name);
    let _ = nix::unistd::unlinkat(
        &dir_fd,
        tmp_name.as_os_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
    let written = create(tmp_name.as_os_str())
        .map_err(|e| match e {
            InitError::Exists { .. } => io_err("create", &tmp)(io::ErrorKind::AlreadyExists.into()),
            e => e,
        })
        .and_then(|file| fill(file, &tmp))
        .and_then(|()| {
            nix::fcntl::renameat(&dir_fd, tmp_name.as_os_str(), &dir_fd, name)
                .map_err(|e| io_err("replace", path)(e.into()))
        });
    if written.is_err() {
        let _ = nix::unistd::unlinkat(
            &dir_fd,
            tmp_name.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    written
}

/// A TOML basic string, every control character escaped: a path with any character stays
/// one value, and a comment line stays one line.
fn quoted(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The commented config for `presets` (the first is the default); `dir` is where it goes.
fn render(presets: &[&Preset], dir: &Path) -> String {
    let mut out = String::from(
        "# acpd's config, written by `acpd init`. acpd reads it at start; a running\n\
         # `acpd serve` re-reads it on `acpd reload`. `acpd doctor` checks the agents below.\n\n",
    );
    match presets.first() {
        Some(first) => out.push_str(&format!(
            "# The provider `acpd run` and editors get when they name none.\n\
             default_provider = {}\n",
            quoted(first.name)
        )),
        None => out.push_str(
            "# No agent yet: the built-in echo agent answers (`acpd run hello`). Add one with\n\
             # `acpd init --force claude` (or codex, gemini, goose, opencode), or a table:\n\
             # [providers.claude]\n\
             # preset = \"claude\"\n",
        ),
    }
    out.push_str(
        "\n# Limits (the defaults):\n\
         # max_children = 256     # child agents alive at once\n\
         # max_depth = 2          # how deep agents may delegate to agents\n\
         # trace_dir = \"/abs/dir\" # one NDJSON trace per run (holds prompts and file contents)\n",
    );
    for p in presets {
        out.push_str(&format!(
            "\n[providers.{}]\n# {}.\npreset = {}\n",
            p.name,
            p.description,
            quoted(p.name)
        ));
        out.push_str(
            "# What to do with the agent's permission requests: forward (ask the editor),\n\
             # allow or reject.\n# permission = \"forward\"\n",
        );
        let names = p.env_passthrough.join(", ");
        let key = p
            .auth
            .iter()
            .flat_map(|h| h.env.iter())
            .next()
            .copied()
            .unwrap_or("KEY");
        let file = dir.join(format!("{}.env", p.name));
        out.push_str(&format!(
            "# acpd passes {names} from its environment to the agent.\n\
             # A daemon (acpd serve) has no shell: put the key in a file, one {key}=… per\n\
             # line, owned by acpd's user, chmod 600, and uncomment:\n\
             # env_file = {}\n\
             # Under systemd, `LoadCredential={}.env:/etc/acpd/{}.env` in acpd.service and:\n\
             # env_file = \"${{CREDENTIALS_DIRECTORY}}/{}.env\"\n",
            quoted(&file.to_string_lossy()),
            p.name,
            p.name,
            p.name
        ));
    }
    out
}

/// Installs each npm preset not installed yet; says which program a PATH preset needs. False
/// when an install failed (said on stderr).
fn install(presets: &[&Preset]) -> io::Result<bool> {
    let mut ok = true;
    let data = presets::data_dir();
    for p in presets {
        match (p.source, data.as_deref()) {
            (Source::Path { program }, _) => {
                let on_path = std::env::var_os("PATH").is_some_and(|path| {
                    std::env::split_paths(&path).any(|d| d.join(program).is_file())
                });
                if !on_path {
                    outln!(
                        "{}: `{program}` is not on PATH: install its release binary \
                         (https://github.com/aaif-goose/goose/releases)",
                        p.name
                    )?;
                }
            }
            (Source::Npm { .. }, None) => {
                errln!("acpd: init: no data directory for the agents: set XDG_DATA_HOME or HOME");
                ok = false;
            }
            (Source::Npm { .. }, Some(data)) => match p.installed_bin(data) {
                Some(bin) => outln!("{}: already installed ({})", p.name, bin.display())?,
                None => {
                    let spec = p.package_spec().unwrap_or_default();
                    errln!("installing {} ({spec}) with npm…", p.name);
                    match super::install::install_into(
                        p,
                        data,
                        &super::progress::Progress::new(true),
                    ) {
                        Ok(bin) => outln!("{}: installed {spec} ({})", p.name, bin.display())?,
                        Err(e) => {
                            errln!("acpd: init: install {}: {e}", p.name);
                            ok = false;
                        }
                    }
                }
            },
        }
    }
    Ok(ok)
}

/// What is still missing (a credential per agent, where to put it), or how to try it.
fn next_steps(path: &Path, presets: &[&Preset], ready: bool) -> io::Result<()> {
    let config = Config::load(Some(path), super::echo_command()).ok();
    let dir = path.parent().unwrap_or(Path::new("/"));
    let mut lines = Vec::new();
    for p in presets {
        let Some(provider) = config.as_ref().and_then(|c| c.provider(p.name)) else {
            continue;
        };
        let secrets = provider.env_file.as_ref().and_then(|f| f.read().ok());
        let view = ChildView::new(provider, secrets.as_ref());
        if let Some(m) = missing(provider, None, &view) {
            let key = m.names.first().copied().unwrap_or("KEY");
            // The preset's first method; `acpd providers --presets` lists every one.
            lines.push(format!(
                "  {}: {},\n    or put {key}=… in {} (chmod 600) and uncomment its env_file line in {}",
                p.name,
                m.how.first().copied().unwrap_or("set a key"),
                dir.join(format!("{}.env", p.name)).display(),
                path.display()
            ));
        }
    }
    if !lines.is_empty() {
        outln!("\nstill missing:\n{}", lines.join("\n"))?;
    } else if ready {
        outln!("\nready: try `acpd run \"hello\"`, or add acpd to your editor (README)")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn every_rendered_config_parses_and_names_its_presets() {
        let dir = Path::new("/home/u/.config/acpd");
        let path = dir.join("config.toml");
        let echo = || vec!["acpd".to_string()];
        let none = Config::parse(&render(&[], dir), &path, echo()).unwrap();
        assert_eq!(none.default_provider, "echo");
        assert_eq!(none.providers.len(), 1);
        let all: Vec<&Preset> = presets::PRESETS.iter().collect();
        let text = render(&all, dir);
        let c = Config::parse(&text, &path, echo()).unwrap();
        assert_eq!(c.default_provider, "claude");
        for p in presets::PRESETS {
            assert_eq!(c.providers[p.name].preset.as_deref(), Some(p.name));
        }
        assert!(
            text.contains("# env_file = \"/home/u/.config/acpd/claude.env\""),
            "{text}"
        );
        // Uncommenting the env_file line gives a valid config too.
        let on = text.replacen("# env_file = \"/home", "env_file = \"/home", 1);
        let c = Config::parse(&on, &path, echo()).unwrap();
        assert!(c.providers["claude"].env_file.is_some());
        let on = text.replacen("# env_file = \"${", "env_file = \"${", 1);
        assert!(Config::parse(&on, &path, echo()).is_ok());
        // A path with a newline stays inside its comment.
        let odd = render(&all[..1], Path::new("/tmp/a\nmax_depth = 9"));
        assert_eq!(Config::parse(&odd, &path, echo()).unwrap().max_depth, 2);
    }

    #[test]
    fn the_file_is_private_and_never_replaced_without_force() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("new/acpd/config.toml");
        write_config(&path, "a = 1\n", false).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let e = write_config(&path, "b = 2\n", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists") && e.contains("--force"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a = 1\n");
        write_config(&path, "b = 2\n", true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b = 2\n");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
        // A symlink at the file's place is never followed, with or without --force.
        let victim = root.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = root.path().join("new/acpd/link.toml");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = write_config(&link, "x", false).unwrap_err().to_string();
        assert!(e.contains("already exists"), "{e}");
        write_config(&link, "x = 1\n", true).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&link).unwrap().is_symlink());
        // A directory others may write is refused.
        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_config(&shared.join("config.toml"), "x", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("writable by every user"), "{e}");
        assert!(e.contains("chmod go-w"), "{e}");
        // A sticky one too (as /tmp): acpd's own config gets a directory of its own.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = write_config(&shared.join("config.toml"), "x", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("writable by others"), "{e}");
    }
}
