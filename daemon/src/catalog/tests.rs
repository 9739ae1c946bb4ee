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

/// One raw tar entry: `name` and `link` are written into the header as they are (no
/// checks), as a hostile archive would.
enum Raw<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    Fifo(&'a str),
}

fn raw_tar(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let (name, kind, link, data): (&str, tar::EntryType, &str, &[u8]) = match e {
            Raw::File(n, d) => (n, tar::EntryType::Regular, "", d),
            Raw::Dir(n) => (n, tar::EntryType::Directory, "", b""),
            Raw::Symlink(n, l) => (n, tar::EntryType::Symlink, l, b""),
            Raw::HardLink(n, l) => (n, tar::EntryType::Link, l, b""),
            Raw::Fifo(n) => (n, tar::EntryType::Fifo, "", b""),
        };
        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(kind);
        h.set_link_name_literal(link).unwrap();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A directory holding `out/` (to extract into) and `secret` (0600, what an archive is after).
struct Scene {
    tmp: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("out")).unwrap();
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, b"secret").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        Scene { tmp }
    }

    fn out(&self) -> std::path::PathBuf {
        self.tmp.path().join("out")
    }

    fn secret(&self) -> std::path::PathBuf {
        self.tmp.path().join("secret")
    }

    fn untar(&self, entries: &[Raw<'_>]) -> Result<(), String> {
        let archive = write(self.tmp.path(), "a.tar", &raw_tar(entries));
        extract(Kind::Tar, &archive, &self.out(), Path::new("agent"))
    }

    /// The secret is as it was: same bytes, still 0600, and nothing new beside it.
    fn untouched(&self) {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::read(self.secret()).unwrap(), b"secret");
        let mode = std::fs::metadata(self.secret())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut names: Vec<_> = std::fs::read_dir(self.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "a.tar" && n != "a.zip")
            .collect();
        names.sort();
        assert_eq!(names, ["out", "secret"]);
    }
}

#[test]
fn an_archive_cannot_write_outside_its_directory() {
    let s = Scene::new();
    // A tar entry named ../escaped: the header's name is written raw.
    let err = s.untar(&[Raw::File("../escaped", b"x")]).unwrap_err();
    assert!(err.contains("not a relative path"), "{err}");
    let err = s.untar(&[Raw::File("/abs/escaped", b"x")]).unwrap_err();
    assert!(err.contains("not a relative path"), "{err}");
    s.untouched();
}

#[test]
fn a_link_out_of_the_archive_is_refused() {
    let s = Scene::new();
    let secret = s.secret().display().to_string();
    for entries in [
        // Absolute, climbing, and a chain that only the kernel's resolution sees out: `a/up`
        // is `..` from `a` (the root), and `b` goes up once more through it.
        vec![Raw::Symlink("agent", &secret)],
        vec![Raw::Symlink("agent", "../secret")],
        vec![
            Raw::Dir("a"),
            Raw::Symlink("a/up", ".."),
            Raw::Symlink("agent", "a/up/../secret"),
        ],
    ] {
        let out = s.out();
        std::fs::remove_dir_all(&out).unwrap();
        std::fs::create_dir(&out).unwrap();
        let err = s.untar(&entries).unwrap_err();
        assert!(err.contains("outside the archive"), "{err}");
    }
    // A hard link to a file outside, by an absolute or climbing name.
    for target in [secret.as_str(), "../secret"] {
        let err = s.untar(&[Raw::HardLink("agent", target)]).unwrap_err();
        assert!(err.contains("hard link"), "{err}");
    }
    s.untouched();
}

#[test]
fn nothing_is_written_through_a_link() {
    let s = Scene::new();
    // An entry under a link, even one pointing inside, is refused.
    let err = s
        .untar(&[
            Raw::Dir("sub"),
            Raw::Symlink("d", "sub"),
            Raw::File("d/x", b"x"),
        ])
        .unwrap_err();
    assert!(err.contains("passes through the link d"), "{err}");
    // A later entry replaces an earlier soft or hard link's name; the file linked to keeps
    // its bytes.
    let out = s.out();
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::create_dir(&out).unwrap();
    s.untar(&[
        Raw::File("real", b"first"),
        Raw::Symlink("soft", "real"),
        Raw::HardLink("hard", "real"),
        Raw::File("soft", b"second"),
        Raw::File("hard", b"third"),
    ])
    .unwrap();
    assert_eq!(std::fs::read(out.join("real")).unwrap(), b"first");
    assert_eq!(std::fs::read(out.join("soft")).unwrap(), b"second");
    assert_eq!(std::fs::read(out.join("hard")).unwrap(), b"third");
    assert!(
        !std::fs::symlink_metadata(out.join("soft"))
            .unwrap()
            .is_symlink()
    );
    // A device or FIFO is no part of an agent.
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::create_dir(&out).unwrap();
    let err = s.untar(&[Raw::Fifo("agent")]).unwrap_err();
    assert!(err.contains("Fifo"), "{err}");
    s.untouched();
}

#[test]
fn a_zip_link_out_or_a_climbing_name_is_refused() {
    let s = Scene::new();
    type Zip = zip::ZipWriter<std::io::Cursor<Vec<u8>>>;
    let zipped = |f: &dyn Fn(&mut Zip)| {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        f(&mut zip);
        write(s.tmp.path(), "a.zip", &zip.finish().unwrap().into_inner())
    };
    let opts = zip::write::SimpleFileOptions::default();
    let secret = s.secret().display().to_string();
    let archive = zipped(&|z| z.add_symlink("agent", &secret, opts).unwrap());
    let err = extract(Kind::Zip, &archive, &s.out(), Path::new("agent")).unwrap_err();
    assert!(err.contains("outside the archive"), "{err}");
    let archive = zipped(&|z| {
        z.start_file("../escaped", opts).unwrap();
        z.write_all(b"x").unwrap();
    });
    let err = extract(Kind::Zip, &archive, &s.out(), Path::new("agent")).unwrap_err();
    assert!(err.contains("not a relative path"), "{err}");
    // A link inside is kept.
    let archive = zipped(&|z| {
        z.start_file("lib/real", opts).unwrap();
        z.write_all(b"x").unwrap();
        z.add_symlink("agent", "lib/real", opts).unwrap();
    });
    let out = s.out();
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::create_dir(&out).unwrap();
    extract(Kind::Zip, &archive, &out, Path::new("agent")).unwrap();
    assert_eq!(std::fs::read(out.join("agent")).unwrap(), b"x");
    s.untouched();
}

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

#[test]
fn a_file_document_is_bounded_and_must_be_a_regular_file() {
    let tmp = tempfile::tempdir().unwrap();
    // One byte over the 16 MiB an http document may have.
    let big = tmp.path().join("big.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((16 << 20) + 1).unwrap();
    let err = load(&format!("file://{}", big.display()), None).unwrap_err();
    assert!(
        err.to_string().contains("larger than 16777216 bytes"),
        "{err}"
    );
    // A device: refused for what it is (`/dev/zero` would otherwise be read forever).
    let err = load("file:///dev/null", None).unwrap_err();
    assert!(
        err.to_string()
            .contains("/dev/null is a device, not a regular file"),
        "{err}"
    );
    let err = load(&format!("file://{}", tmp.path().display()), None).unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
    // A FIFO nobody writes: refused at once, the open does not wait for a writer.
    let fifo = tmp.path().join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let url = format!("file://{}", fifo.display());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(load(&url, None).map(|_| ())));
    let answer = rx.recv_timeout(std::time::Duration::from_secs(30));
    let err = answer.expect("loading a FIFO blocked").unwrap_err();
    assert!(
        err.to_string().contains("is a FIFO, not a regular file"),
        "{err}"
    );
}
