//! The fetched document: cached, served when the registry is gone, a local file bounded.
use super::*;

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
