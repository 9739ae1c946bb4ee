//! A binary distribution installed once per version, its command never reached through a link.
use super::*;

/// An agent `id` 1.0.0 whose archive is `archive` and whose `cmd` is `cmd`.
fn binary_agent(archive: &Path, cmd: &str) -> Agent {
    Agent {
        id: "bin-agent".into(),
        name: String::new(),
        version: "1.0.0".into(),
        description: String::new(),
        distribution: Distribution {
            binary: [(
                "linux-x86_64".to_owned(),
                BinaryTarget {
                    archive: format!("file://{}", archive.display()),
                    cmd: cmd.into(),
                    args: vec![],
                    env: Default::default(),
                    sha256: None,
                },
            )]
            .into(),
            ..Default::default()
        },
    }
}

#[test]
fn the_command_is_never_chmodded_or_run_through_a_link_out() {
    let s = Scene::new();
    let data = s.tmp.path().join("out/data");
    let secret = s.secret().display().to_string();
    // The archive's own link out is refused at install.
    let archive = write(
        s.tmp.path(),
        "a.tar",
        &raw_tar(&[Raw::Symlink("agent", &secret)]),
    );
    let err = resolve_agent(
        &binary_agent(&archive, "agent"),
        "linux-x86_64",
        Some(&data),
        |_| true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("outside the archive"), "{err}");
    assert!(!data.join("registry/bin-agent/1.0.0").exists());
    // An install already there (an older acpd, a hand edit) with a link out: refused, by the
    // direct name and by the search below.
    for cmd in ["agent", "nested"] {
        let dir = data.join("registry/bin-agent/1.0.0");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("top")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("agent")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("top/nested")).unwrap();
        let err = resolve_agent(
            &binary_agent(&archive, cmd),
            "linux-x86_64",
            Some(&data),
            |_| true,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("outside the install directory"),
            "{err}"
        );
    }
    // The version directory itself a link to elsewhere: refused.
    let dir = data.join("registry/bin-agent/1.0.0");
    std::fs::remove_dir_all(&dir).unwrap();
    let elsewhere = s.tmp.path().join("out/elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("agent"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    let err = resolve_agent(
        &binary_agent(&archive, "agent"),
        "linux-x86_64",
        Some(&data),
        |_| true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("is a symbolic link"), "{err}");
    std::fs::remove_file(&dir).unwrap();
    s.untouched();
    // A link inside is run by its real path.
    let archive = write(
        s.tmp.path(),
        "a.tar",
        &raw_tar(&[
            Raw::File("lib/real", b"#!/bin/sh\n"),
            Raw::Symlink("agent", "lib/real"),
        ]),
    );
    let r = resolve_agent(
        &binary_agent(&archive, "agent"),
        "linux-x86_64",
        Some(&data),
        |_| true,
    )
    .unwrap();
    let real = std::fs::canonicalize(data.join("registry/bin-agent/1.0.0/lib/real")).unwrap();
    assert_eq!(r.command, [real.to_string_lossy().as_ref()]);
}

#[test]
fn a_binary_installs_once_per_version_and_runs_from_there() {
    let tmp = tempfile::tempdir().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_bytes(&[("top/agent", b"#!/bin/sh\n", 0o644)]))
        .unwrap();
    let archive = write(tmp.path(), "agent.tar.gz", &gz.finish().unwrap());
    let url = format!("file://{}", archive.display());
    let agent = Agent {
        id: "bin-agent".into(),
        name: String::new(),
        version: "1.0.0".into(),
        description: String::new(),
        distribution: Distribution {
            binary: [(
                "linux-x86_64".to_owned(),
                BinaryTarget {
                    archive: url.clone(),
                    cmd: "./agent".into(),
                    args: vec!["serve".into()],
                    env: Default::default(),
                    sha256: None,
                },
            )]
            .into(),
            ..Default::default()
        },
    };
    let data = tmp.path().join("data");
    let r = resolve_agent(&agent, "linux-x86_64", Some(&data), |_| true).unwrap();
    let exe = data.join("registry/bin-agent/1.0.0/top/agent");
    assert_eq!(r.command, [exe.to_string_lossy().as_ref(), "serve"]);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&exe).unwrap().permissions().mode();
    assert_eq!(mode & 0o111, 0o111, "made executable");
    // Installed: the archive is not needed again.
    std::fs::remove_file(&archive).unwrap();
    assert_eq!(
        resolve_agent(&agent, "linux-x86_64", Some(&data), |_| true).unwrap(),
        r
    );
    // Nothing half-done is left beside it.
    let left: Vec<_> = std::fs::read_dir(data.join("registry/bin-agent"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["1.0.0"]);

    // A wrong checksum is refused and installs nothing.
    let mut bad = agent.clone();
    bad.version = "2.0.0".into();
    let target = bad.distribution.binary.get_mut("linux-x86_64").unwrap();
    std::fs::write(&archive, b"whatever").unwrap();
    target.sha256 = Some("00".repeat(32));
    let err = resolve_agent(&bad, "linux-x86_64", Some(&data), |_| true).unwrap_err();
    assert!(matches!(err, CatalogError::Checksum { .. }), "{err}");
    assert!(!data.join("registry/bin-agent/2.0.0").exists());
    // A cmd that climbs out is refused before anything is fetched.
    let target = bad.distribution.binary.get_mut("linux-x86_64").unwrap();
    target.cmd = "../../bin/sh".into();
    let err = resolve_agent(&bad, "linux-x86_64", Some(&data), |_| true).unwrap_err();
    assert!(matches!(err, CatalogError::BadCmd { .. }), "{err}");
}
