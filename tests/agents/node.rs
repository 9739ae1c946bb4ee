//! The pinned node packages in tests/interop, installed once for the whole binary.
//!
//! Every module here runs node from tests/interop/node_modules, and `npm ci` deletes that
//! directory before it fills it again: were two modules to install at once, or one while
//! another's node runs, they would break each other. So the first module to ask installs
//! (when anything pinned is missing or of another version) and the others wait for that one
//! answer; each module then checks what it needs itself, as before.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

pub fn interop_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/interop")
}

/// Whether node runs here at all.
pub fn present() -> bool {
    static NODE: OnceLock<bool> = OnceLock::new();
    *NODE.get_or_init(|| Command::new("node").arg("--version").output().is_ok())
}

/// Once per binary: `npm ci` in tests/interop when a pinned package is missing or stale.
/// `Err` says why the install failed (the modules decide whether that fails or skips them).
pub fn install() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        if !present() || !stale() {
            return Ok(());
        }
        let dir = interop_dir();
        match Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .output()
        {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!(
                "`npm ci` in {} failed: {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
            Err(e) => Err(format!("npm could not run: {e}")),
        }
    })
    .clone()
}

/// Any package package.json pins that is not installed at its pinned version.
fn stale() -> bool {
    let dir = interop_dir();
    let read = |p: PathBuf| -> Option<Value> {
        serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
    };
    let Some(pins) = read(dir.join("package.json")) else {
        return true;
    };
    let Some(deps) = pins["dependencies"].as_object() else {
        return true;
    };
    deps.iter().any(|(package, version)| {
        let installed = read(dir.join("node_modules").join(package).join("package.json"));
        installed.as_ref().map(|v| &v["version"]) != Some(version)
    })
}
