//! Archives: their kind by URL, extraction, and nothing ever written outside the directory.
use super::*;

#[test]
fn archive_kinds_by_url() {
    assert_eq!(Kind::of("https://x/a.zip"), Kind::Zip);
    assert_eq!(Kind::of("https://x/a.tar.gz?sig=1"), Kind::TarGz);
    assert_eq!(Kind::of("https://x/a.TGZ"), Kind::TarGz);
    assert_eq!(Kind::of("https://x/a.tar.bz2"), Kind::TarBz2);
    assert_eq!(Kind::of("https://x/a.tbz2"), Kind::TarBz2);
    assert_eq!(Kind::of("https://x/agent-linux"), Kind::Raw);
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
