//! The session store's tests, by what they cover: the map's rows, leases and owners
//! (`map.rs`), what agents' listings bring in and take out (`listing.rs`), the file itself
//! (`on_disk.rs`: privacy, schema, several processes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use super::*;

mod list_paging;
mod map;
mod on_disk;

fn row(id: &str, provider: &str, child: &str, cwd: &str, updated_at: &str) -> SessionRow {
    SessionRow {
        acpd_id: id.into(),
        provider: provider.into(),
        child_session_id: child.into(),
        cwd: PathBuf::from(cwd),
        title: Some(format!("title of {id}")),
        updated_at: updated_at.into(),
        owner: me(),
        lease: None,
    }
}

/// The owner of rows this process adopts.
fn me() -> RowOwner {
    RowOwner::own()
}

fn ids(rows: &[SessionRow]) -> Vec<&str> {
    rows.iter().map(|r| r.acpd_id.as_str()).collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}
