//! The registry document's parsing, the choice of distribution, archives and the cache.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

use super::install::{Kind, extract};
use super::*;

const DOC: &str = r#"{
  "version": "1.0.0",
  "agents": [
    {"id": "npx-agent", "name": "N", "version": "1.2.3", "description": "d",
     "icon": "x.svg", "authors": ["a"],
     "distribution": {"npx": {"package": "@scope/pkg@1.2.3", "args": ["--acp"], "env": {"A": "1"}}}},
    {"id": "uvx-agent", "name": "U", "version": "0.1.0", "description": "d",
     "distribution": {"uvx": {"package": "py-agent==0.1.0", "args": ["acp"]}}},
    {"id": "both", "name": "B", "version": "2.0.0", "description": "d",
     "distribution": {"npx": {"package": "b@2.0.0"}, "uvx": {"package": "b==2.0.0"},
       "binary": {"linux-aarch64": {"archive": "https://x/b.tar.gz", "cmd": "./b"}}}},
    {"id": "Bad_Id", "name": "X", "version": "1.0.0", "description": "d",
     "distribution": {"npx": {"package": "x"}}},
    {"id": "escape", "name": "X", "version": "../../etc", "description": "d",
     "distribution": {"npx": {"package": "x"}}}
  ]
}"#;

fn doc() -> Document {
    Document::parse(DOC.as_bytes(), "https://example.test/registry.json").unwrap()
}

#[test]
fn the_aggregate_parses_and_bad_entries_are_skipped() {
    let d = doc();
    assert_eq!(d.version.as_deref(), Some("1.0.0"));
    let ids: Vec<&str> = d.agents.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["npx-agent", "uvx-agent", "both"]);
    assert_eq!(d.skipped, ["Bad_Id", "escape"]);
}

#[test]
fn a_lone_agent_json_is_a_document_of_one() {
    let one = r#"{"id": "codex-acp", "name": "Codex", "version": "1.4.0", "description": "d",
        "distribution": {"npx": {"package": "@agentclientprotocol/codex-acp@1.4.0"}}}"#;
    let d = Document::parse(one.as_bytes(), "file:///x/agent.json").unwrap();
    assert_eq!(d.version, None);
    assert_eq!(d.agents[0].id, "codex-acp");
    let err = Document::parse(b"[1]", "https://u:p@h.test/r.json?tok=1").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("https://h.test/r.json"), "{msg}");
    assert!(!msg.contains("tok") && !msg.contains("u:p"), "{msg}");
}

#[test]
fn npx_and_uvx_commands() {
    let d = doc();
    let all = |_: &str| true;
    let npx = resolve_agent(d.agent("npx-agent").unwrap(), "linux-x86_64", None, all).unwrap();
    assert_eq!(npx.command, ["npx", "--yes", "@scope/pkg@1.2.3", "--acp"]);
    assert_eq!(npx.env.get("A").map(String::as_str), Some("1"));
    assert_eq!(npx.distribution, "npx");
    let uvx = resolve_agent(d.agent("uvx-agent").unwrap(), "linux-x86_64", None, all).unwrap();
    assert_eq!(uvx.command, ["uvx", "py-agent==0.1.0", "acp"]);
}

#[test]
fn the_choice_prefers_a_binary_then_an_installed_runner() {
    let d = doc();
    let both = d.agent("both").unwrap();
    assert_eq!(
        both.choose("linux-aarch64", |_| true).unwrap().kind(),
        "binary"
    );
    assert_eq!(both.choose("linux-x86_64", |_| true).unwrap().kind(), "npx");
    assert_eq!(
        both.choose("linux-x86_64", |t| t == "uvx").unwrap().kind(),
        "uvx"
    );
    // Neither runner installed: npx, so the spawn names what is missing.
    assert_eq!(
        both.choose("linux-x86_64", |_| false).unwrap().kind(),
        "npx"
    );
    let only_binary = Agent {
        distribution: Distribution {
            binary: both.distribution.binary.clone(),
            ..Default::default()
        },
        ..both.clone()
    };
    let err = resolve_agent(&only_binary, "linux-x86_64", None, |_| true).unwrap_err();
    assert!(err.to_string().contains("binary:linux-aarch64"), "{err}");
}

#[test]
fn the_platform_key_is_the_registrys() {
    let p = platform();
    let keys = [
        "darwin-aarch64",
        "darwin-x86_64",
        "linux-aarch64",
        "linux-x86_64",
        "windows-aarch64",
        "windows-x86_64",
    ];
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        assert!(keys.contains(&p.as_str()), "{p}");
    }
}

#[test]
fn archive_kinds_by_url() {
    assert_eq!(Kind::of("https://x/a.zip"), Kind::Zip);
    assert_eq!(Kind::of("https://x/a.tar.gz?sig=1"), Kind::TarGz);
    assert_eq!(Kind::of("https://x/a.TGZ"), Kind::TarGz);
    assert_eq!(Kind::of("https://x/a.tar.bz2"), Kind::TarBz2);
    assert_eq!(Kind::of("https://x/a.tbz2"), Kind::TarBz2);
    assert_eq!(Kind::of("https://x/agent-linux"), Kind::Raw);
}

fn tar_bytes(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn zip_tar_bz2_and_raw_extract() {
    let tmp = tempfile::tempdir().unwrap();
    let cmd = Path::new("bin/agent");

    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().unix_permissions(0o755);
    zip.start_file("bin/agent", opts).unwrap();
    zip.write_all(b"#!/bin/sh\n").unwrap();
    let zipped = zip.finish().unwrap().into_inner();
    let out = tmp.path().join("zip");
    std::fs::create_dir(&out).unwrap();
    extract(Kind::Zip, &write(tmp.path(), "a.zip", &zipped), &out, cmd).unwrap();
    assert_eq!(
        std::fs::read(out.join("bin/agent")).unwrap(),
        b"#!/bin/sh\n"
    );

    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    bz.write_all(&tar_bytes(&[("pkg/bin/agent", b"x", 0o755)]))
        .unwrap();
    let out = tmp.path().join("bz");
    std::fs::create_dir(&out).unwrap();
    extract(
        Kind::TarBz2,
        &write(tmp.path(), "a.tar.bz2", &bz.finish().unwrap()),
        &out,
        cmd,
    )
    .unwrap();
    assert!(out.join("pkg/bin/agent").is_file());

    let out = tmp.path().join("raw");
    std::fs::create_dir(&out).unwrap();
    extract(
        Kind::Raw,
        &write(tmp.path(), "agent-linux", b"ELF"),
        &out,
        cmd,
    )
    .unwrap();
    assert_eq!(std::fs::read(out.join("bin/agent")).unwrap(), b"ELF");

    let out = tmp.path().join("broken");
    std::fs::create_dir(&out).unwrap();
    let err = extract(
        Kind::TarGz,
        &write(tmp.path(), "b.tar.gz", b"not gzip"),
        &out,
        cmd,
    );
    assert!(err.is_err());
}

#[test]
fn an_archive_cannot_write_outside_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // A tar entry named ../escaped: the header's name is written raw.
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..10].copy_from_slice(b"../escaped");
    h.set_size(1);
    h.set_mode(0o644);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"x"[..]).unwrap();
    let archive = write(tmp.path(), "evil.tar", &b.into_inner().unwrap());
    let _ = extract(Kind::Tar, &archive, &out, Path::new("x"));
    assert!(!tmp.path().join("escaped").exists());
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

#[test]
fn the_cache_serves_while_fresh_and_when_the_registry_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    // Nothing listens on port 9 of 127.0.0.1 (discard; refused).
    let url = "http://127.0.0.1:9/registry.json";
    assert!(matches!(
        load(url, Some(&state)),
        Err(CatalogError::Fetch { .. })
    ));
    let cache = cache_path(&state, url);
    fetch::write_atomic(&cache, DOC.as_bytes()).unwrap();
    let fresh = load(url, Some(&state)).unwrap();
    assert_eq!(fresh.origin, Origin::Cache);
    assert_eq!(fresh.document.agents.len(), 3);
    let old = std::time::SystemTime::now() - TTL - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&cache)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let stale = load(url, Some(&state)).unwrap();
    assert_eq!(stale.origin, Origin::StaleCache);
}

#[test]
fn urls_are_shown_without_secrets() {
    assert_eq!(
        shown("https://u:p@h.test:8/a/b.tgz?X-Sig=s#f"),
        "https://h.test:8/a/b.tgz"
    );
    assert_eq!(shown("file:///tmp/r.json"), "file:///tmp/r.json");
    assert_eq!(
        fetch::file_path("file:///tmp/a%20b.json").unwrap(),
        Path::new("/tmp/a b.json")
    );
}

#[test]
fn the_table_overrides_the_distributions_env() {
    let r = Resolved {
        id: "a".into(),
        version: "1.0.0".into(),
        distribution: "npx",
        command: vec!["npx".into()],
        env: [
            ("A".to_owned(), "doc".to_owned()),
            ("B".to_owned(), "doc".to_owned()),
        ]
        .into(),
    };
    let mut p = ProviderConfig::with_defaults("p", vec![]);
    p.env.insert("A".into(), "table".into());
    let applied = r.apply(&p);
    assert_eq!(applied.command, ["npx"]);
    assert_eq!(applied.env["A"], "table");
    assert_eq!(applied.env["B"], "doc");
}
