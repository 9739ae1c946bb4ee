//! Where the config file is looked for, and what is refused before it is read.
use super::*;
use crate::config::defaults::ETC_CONFIG;

#[test]
fn missing_or_unreadable_files_name_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.toml");
    let err = Config::load(Some(&missing), echo_command()).expect_err("missing file");
    assert!(matches!(err, ConfigError::Missing { .. }), "{err:?}");
    assert_eq!(err.path(), missing);
    let err = Config::load(Some(dir.path()), echo_command()).expect_err("a directory");
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}: ", dir.path().display())),
        "{shown}"
    );
}

/// A FIFO nobody writes (or a device) would block the read forever: refused at once, by
/// name. Before, the read blocked; the deadline turns that into a failure, not a hang.
#[test]
fn a_config_that_is_not_a_regular_file_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("config.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Config::load(Some(&path), echo_command()));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("reading a FIFO config blocked")
        .expect_err("a FIFO");
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains("not a regular file (it is a FIFO)"),
        "{shown}"
    );
    assert!(
        shown.starts_with(&format!("{}: ", fifo.display())),
        "{shown}"
    );
    let err = Config::load(Some(Path::new("/dev/zero")), echo_command()).expect_err("a device");
    assert!(
        err.to_string()
            .contains("not a regular file (it is a device)"),
        "{err}"
    );
    // A regular file too large to be a config (sparse: costs no disk) is refused unread.
    let huge = dir.path().join("huge.toml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let err = Config::load(Some(&huge), echo_command()).expect_err("a huge file");
    assert!(
        err.to_string().contains("larger than 16777216 bytes"),
        "{err}"
    );
}

/// Runs discovery with `vars` as the environment and `existing` as the
/// only files; renders the outcome as the path, "" for none, or the error.
fn found(explicit: Option<&str>, vars: &[(&str, &str)], existing: &[&str]) -> String {
    let vars: HashMap<&str, &str> = vars.iter().copied().collect();
    let env = |k: &str| vars.get(k).map(|v| v.to_string());
    let exists = |p: &Path| existing.iter().any(|e| Path::new(e) == p);
    match Config::discover(explicit.map(Path::new), env, exists) {
        Ok(path) => path.map(|p| p.display().to_string()).unwrap_or_default(),
        Err(err) => err.to_string(),
    }
}

#[test]
fn discovery_order() {
    let vars = [
        ("ACPD_CONFIG", "/e.toml"),
        ("XDG_CONFIG_HOME", "/x"),
        ("HOME", "/h"),
    ];
    let home = "/h/.config/acpd/config.toml";
    let all = [
        "/f.toml",
        "/e.toml",
        "/x/acpd/config.toml",
        home,
        ETC_CONFIG,
    ];
    assert_eq!(found(Some("/f.toml"), &vars, &all), "/f.toml");
    assert_eq!(found(None, &vars, &all), "/e.toml");
    assert_eq!(found(None, &vars[1..], &all), "/x/acpd/config.toml");
    // XDG_CONFIG_HOME replaces ~/.config rather than adding to it.
    assert_eq!(found(None, &vars[1..], &all[3..]), ETC_CONFIG);
    let empty = [("ACPD_CONFIG", ""), ("XDG_CONFIG_HOME", ""), ("HOME", "/h")];
    assert_eq!(found(None, &empty, &all), home);
    assert_eq!(
        found(None, &[("XDG_CONFIG_HOME", "rel"), ("HOME", "/h")], &all),
        home
    );
    assert_eq!(found(None, &vars[2..], &all[4..]), ETC_CONFIG);
    assert_eq!(found(None, &[], &all[4..]), ETC_CONFIG);
    assert_eq!(found(None, &vars[1..], &[]), "");
}

#[test]
fn explicitly_named_files_must_exist() {
    let err = found(Some("/f.toml"), &[], &[ETC_CONFIG]);
    let next = "; create it (`acpd init` writes one) or name another";
    assert_eq!(
        err,
        format!("/f.toml: config file named by --config does not exist{next}")
    );
    let err = found(None, &[("ACPD_CONFIG", "/e.toml")], &[ETC_CONFIG]);
    assert_eq!(
        err,
        format!("/e.toml: config file named by ACPD_CONFIG does not exist{next}")
    );
}
