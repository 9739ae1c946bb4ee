//! Getting bytes from `http(s)://` and `file://` URLs, and the registry document's cache in
//! acpd's state directory: fresh for [`TTL`], and used past it when the registry cannot be
//! reached, so an offline machine keeps starting the agents it knew.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::Digest;

use super::{CatalogError, Document, shown};
use crate::private_fs::{Links, OpenError, open_regular};

/// How long a cached document is used without asking the registry again.
pub(crate) const TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// A registry document larger than this is refused (the official one is tens of KiB).
const MAX_DOCUMENT: u64 = 16 << 20;
const DOCUMENT_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a loaded document came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Origin {
    /// Fetched now (and cached).
    Fetched,
    /// The cache, younger than [`TTL`].
    Cache,
    /// The cache, older than [`TTL`]: the registry could not be reached.
    StaleCache,
    /// A `file://` document, read as it is now (never cached).
    File,
}

#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub document: Document,
    pub origin: Origin,
}

/// The document at `url`: from the cache under `state` while fresh, else fetched (and cached),
/// else the stale cache when the fetch fails.
pub(crate) fn load(url: &str, state: Option<&Path>) -> Result<Loaded, CatalogError> {
    if file_path(url).is_some() {
        // Bounded like a download, and only a regular file (a FIFO or /dev/zero is refused).
        let bytes = get_bytes(url, MAX_DOCUMENT, DOCUMENT_TIMEOUT)?;
        return Ok(Loaded {
            document: Document::parse(&bytes, url)?,
            origin: Origin::File,
        });
    }
    let cache = state.map(|s| cache_path(s, url));
    let cached = cache.as_deref().and_then(|p| read_cache(p, url));
    if let Some((document, age)) = &cached
        && *age < TTL
    {
        return Ok(Loaded {
            document: document.clone(),
            origin: Origin::Cache,
        });
    }
    let fetched = get_bytes(url, MAX_DOCUMENT, DOCUMENT_TIMEOUT)
        .and_then(|bytes| Document::parse(&bytes, url).map(|doc| (doc, bytes)));
    match (fetched, cached) {
        (Ok((document, bytes)), _) => {
            if let Some(path) = &cache
                && let Err(e) = write_atomic(path, &bytes)
            {
                tracing::warn!(path = %path.display(), "cannot cache the registry document: {e}");
            }
            Ok(Loaded {
                document,
                origin: Origin::Fetched,
            })
        }
        (Err(e), Some((document, _))) => {
            tracing::warn!("{e}; using the cached registry document");
            Ok(Loaded {
                document,
                origin: Origin::StaleCache,
            })
        }
        (Err(e), None) => Err(e),
    }
}

/// `<state>/registry/<sha256 of the URL>.json`: one cache per registry URL.
pub(crate) fn cache_path(state: &Path, url: &str) -> PathBuf {
    let digest = sha2::Sha256::digest(url.as_bytes());
    state
        .join("registry")
        .join(format!("{}.json", &hex(&digest)[..32]))
}

/// The cached document and its age; `None` when absent or unreadable (then fetched anew).
fn read_cache(path: &Path, url: &str) -> Option<(Document, Duration)> {
    let file = open_regular(path, Links::Refuse).ok()?;
    let modified = file.metadata().and_then(|m| m.modified()).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > MAX_DOCUMENT {
        return None;
    }
    let age = SystemTime::now()
        .duration_since(modified)
        .unwrap_or_default();
    let document = Document::parse(&bytes, url).ok()?;
    Some((document, age))
}

/// The path of a `file://` URL (`file:///abs/path`, percent-escapes decoded); `None` for any
/// other scheme.
pub(super) fn file_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("file://")?;
    // `file://localhost/x` names the same file as `file:///x`.
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    Some(PathBuf::from(percent_decode(rest)))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hexpair) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hexpair, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .http_status_as_error(true)
        .user_agent(concat!("acpd/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// A reader of the body at `url` (http, https or file), at most `limit` bytes.
pub(super) fn open(
    url: &str,
    limit: u64,
    timeout: Duration,
) -> Result<Box<dyn Read + Send>, CatalogError> {
    let failed = |reason: String| CatalogError::Fetch {
        url: shown(url),
        reason,
    };
    if let Some(path) = file_path(url) {
        // A `file://` URL the config names may be a link: only the file it reaches is read.
        let file = open_regular(&path, Links::Follow).map_err(|e| {
            failed(match e {
                OpenError::NotRegular(what) => {
                    format!("{} is {what}, not a regular file", path.display())
                }
                OpenError::Io(e) => format!("{}: {e}", path.display()),
            })
        })?;
        return Ok(Box::new(file.take(limit.saturating_add(1))));
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(failed("not an http(s):// or file:// URL".into()));
    }
    let response = agent(timeout)
        .get(url)
        .call()
        .map_err(|e| failed(e.to_string()))?;
    let reader = response
        .into_body()
        .into_with_config()
        .limit(limit)
        .reader();
    Ok(Box::new(reader))
}

fn get_bytes(url: &str, limit: u64, timeout: Duration) -> Result<Vec<u8>, CatalogError> {
    let mut bytes = Vec::new();
    open(url, limit, timeout)?
        .read_to_end(&mut bytes)
        .map_err(|e| CatalogError::Fetch {
            url: shown(url),
            reason: e.to_string(),
        })?;
    if bytes.len() as u64 > limit {
        return Err(CatalogError::Fetch {
            url: shown(url),
            reason: format!("larger than {limit} bytes"),
        });
    }
    Ok(bytes)
}

/// Writes through a temporary file and a rename, so a reader never sees half a file. The
/// temporary is created afresh (`O_EXCL|O_NOFOLLOW`): nothing planted at its name is written
/// through.
pub(super) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    // Left by a crash of an earlier process with this pid.
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
