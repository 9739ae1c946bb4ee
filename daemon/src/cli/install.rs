//! `acpd install PRESET` and `acpd providers --presets`: the pinned package of a preset,
//! installed once into acpd's data directory so a spawn needs neither `npx` nor the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::output::Col;
use super::{EXIT_USAGE, stdout_failed};
use crate::config::presets::{self, Preset, Source};

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// The preset whose pinned package to install (claude, codex, gemini, opencode).
    #[arg(value_name = "PRESET")]
    preset: String,
    /// Install again even when this version is already installed.
    #[arg(long)]
    force: bool,
    /// No status line on stderr while npm runs (and npm's own output, which the status line
    /// holds back on a terminal until it fails, goes straight to stderr).
    #[arg(long, short)]
    quiet: bool,
}

/// Why an install failed (each maps to exit code 1 with one line on stderr).
#[derive(Debug, thiserror::Error)]
pub(super) enum InstallError {
    #[error("no data directory: set XDG_DATA_HOME or HOME")]
    NoDataDir,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run npm (is node installed?): {0}")]
    Spawn(std::io::Error),
    #[error("`npm install {spec}` failed ({status})")]
    Npm {
        spec: String,
        status: std::process::ExitStatus,
    },
    #[error("npm finished but {} is missing", path.display())]
    NoBin { path: PathBuf },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |source| InstallError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn install(args: InstallArgs) -> u8 {
    let Some(preset) = presets::find(&args.preset) else {
        let hint = crate::config::suggest::did_you_mean(&args.preset, presets::names())
            .map_or_else(String::new, |h| format!("{h} "));
        errln!(
            "acpd: unknown preset {:?}; {hint}(valid: {})",
            args.preset,
            presets::names().join(", ")
        );
        return EXIT_USAGE;
    };
    if let Source::Path { program } = preset.source {
        errln!(
            "acpd: {} is not published to npm: install its release binary so `{program}` is on \
             PATH (https://github.com/aaif-goose/goose/releases), then use `preset = \"{}\"`",
            preset.name,
            preset.name
        );
        return 1;
    }
    let Some(data) = presets::data_dir() else {
        errln!("acpd: install {}: {}", preset.name, InstallError::NoDataDir);
        return 1;
    };
    let spec = preset.package_spec().unwrap_or_default();
    // The install directory is the version's, renamed into place only once npm succeeded:
    // its executable there means this very version is installed.
    let (done, result) = match preset.installed_bin(&data) {
        Some(bin) if !args.force => ("already installed", Ok(bin)),
        _ => {
            let progress = super::progress::Progress::new(!args.quiet);
            progress.set(format!("installing {spec} (npm install)…"));
            let result = install_into(preset, &data, &progress);
            progress.done();
            ("installed", result)
        }
    };
    match result {
        Ok(bin) => {
            let printed = outln!(
                "{done} {spec} as {}\nadd to config.toml:\n\n[providers.{}]\npreset = \"{}\"",
                bin.display(),
                preset.name,
                preset.name
            );
            match printed {
                Ok(()) => 0,
                Err(e) => stdout_failed(&e),
            }
        }
        Err(e) => {
            errln!("acpd: install {}: {e}", preset.name);
            1
        }
    }
}

/// Installs into a fresh sibling directory and renames it into place, so a failed or
/// interrupted install never looks installed. npm's own output goes to stderr: at once, or,
/// under a status line, only when npm fails.
pub(super) fn install_into(
    preset: &Preset,
    data: &Path,
    progress: &super::progress::Progress,
) -> Result<PathBuf, InstallError> {
    let (Some(dir), Some(spec)) = (preset.install_dir(data), preset.package_spec()) else {
        return Err(InstallError::NoDataDir);
    };
    let parent = dir.parent().unwrap_or(data);
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let staging = parent.join(format!(".{}-{}.tmp", preset.name, std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(io(&staging))?;
    }
    std::fs::create_dir_all(&staging).map_err(io(&staging))?;
    let stderr = std::io::stderr();
    let to_stderr = std::os::fd::AsFd::as_fd(&stderr)
        .try_clone_to_owned()
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    let mut npm = Command::new("npm");
    npm.args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&staging)
        .arg(&spec)
        .stdin(Stdio::null());
    let status = if progress.active() {
        npm.output().map(|out| {
            if !out.status.success() {
                super::write_stderr(format_args!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            out.status
        })
    } else {
        npm.stdout(to_stderr).status()
    };
    let cleanup = |e| {
        let _ = std::fs::remove_dir_all(&staging);
        e
    };
    let status = status.map_err(InstallError::Spawn).map_err(cleanup)?;
    if !status.success() {
        return Err(cleanup(InstallError::Npm { spec, status }));
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(io(&dir))
            .map_err(cleanup)?;
    }
    std::fs::rename(&staging, &dir)
        .map_err(io(&dir))
        .map_err(cleanup)?;
    preset
        .installed_bin(data)
        .ok_or_else(|| InstallError::NoBin {
            path: dir.join("node_modules/.bin"),
        })
}

/// `acpd providers --presets [--json]`.
pub(super) fn list_presets(json: bool) -> u8 {
    let data = presets::data_dir();
    let installed = |p: &Preset| data.as_deref().and_then(|d| p.installed_bin(d));
    let printed = if json {
        let list: Vec<_> = presets::PRESETS
            .iter()
            .map(|p| {
                serde_json::json!({
                    "name": p.name,
                    "description": p.description,
                    "source": p.source,
                    "args": p.args,
                    "command": p.command(data.as_deref()),
                    "envPassthrough": p.env_passthrough,
                    "auth": p.auth,
                    "installed": installed(p).map(|b| b.to_string_lossy().into_owned()),
                })
            })
            .collect();
        outln!("{}", serde_json::json!({ "presets": list }))
    } else {
        let mut grid = super::output::Grid::new(&[
            ("PRESET", Col::Whole),
            ("DESCRIPTION", Col::Text(30)),
            ("PACKAGE", Col::Whole),
            ("STATE", Col::Text(32)),
            ("ENV", Col::Text(40)),
            ("AUTH", Col::Text(50)),
        ]);
        for p in presets::PRESETS {
            let what = match p.source {
                Source::Npm {
                    package, version, ..
                } => format!("{package}@{version}"),
                Source::Path { program } => format!("{program} on PATH"),
            };
            let state = match (p.source, installed(p)) {
                (_, Some(_)) => "installed",
                (Source::Npm { .. }, None) => "not installed (runs through npx)",
                (Source::Path { .. }, None) => "install its release binary",
            };
            let auth: Vec<String> = p
                .auth
                .iter()
                .map(|h| format!("{}: {}", h.method.unwrap_or("(none advertised)"), h.how))
                .collect();
            grid.row([
                p.name.to_owned(),
                p.description.to_owned(),
                what,
                state.to_owned(),
                p.env_passthrough.join(", "),
                auth.join("; "),
            ]);
        }
        grid.print()
    };
    match printed {
        Ok(()) => 0,
        Err(e) => stdout_failed(&e),
    }
}
