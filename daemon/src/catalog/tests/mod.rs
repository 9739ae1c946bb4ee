//! The registry document's parsing, the choice of distribution, archives and the cache: the
//! document and the choice (`choice.rs`), unpacking archives safely (`archives.rs`), binary
//! installs (`binaries.rs`), the fetched document's cache (`fetching.rs`); the archive
//! builders they share are here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

use super::binary_install::{Kind, extract};
use super::*;

mod archives;
mod binaries;
mod choice;
mod fetching;

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
