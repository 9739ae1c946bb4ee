//! `registry = "ID"` providers end to end: a registry document served from 127.0.0.1 or a
//! file, `npx`/`uvx`/`binary` entries run (the package runners are stand-ins on PATH that
//! record their argv and exec the echo agent), a broken archive is START_FAILED naming its
//! URL, and an unreachable registry falls back to the cache.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::*;
use serde_json::{Value, json};

/// A tiny HTTP/1.1 server on 127.0.0.1 serving fixed bodies by path; 404 for the rest.
/// Dropping it stops it and closes the port.
struct Server {
    port: u16,
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (files, hits, stop) = (files.clone(), hits.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (mut conn, _) = match listener.accept() {
                        Ok(c) => c,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                    };
                    conn.set_nonblocking(false).unwrap();
                    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    hits.fetch_add(1, Ordering::Relaxed);
                    let line = String::from_utf8_lossy(&req)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string();
                    let target = line.split(' ').nth(1).unwrap_or("/");
                    let path = target.split('?').next().unwrap_or(target).to_string();
                    let body = files.lock().unwrap().get(&path).cloned();
                    let (status, body) = match body {
                        Some(b) => ("200 OK", b),
                        None => ("404 Not Found", b"not found".to_vec()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes());
                    let _ = conn.write_all(&body);
                }
            })
        };
        Server {
            port,
            files,
            hits,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn serve(&self, path: &str, body: impl Into<Vec<u8>>) {
        self.files.lock().unwrap().insert(path.into(), body.into());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A tar.gz holding `agent.sh` (under `pkg/`), a script that execs the echo agent.
fn agent_tar_gz() -> Vec<u8> {
    let script = format!("#!/bin/sh\nexec \"{BIN}\" agent echo \"$@\"\n");
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(script.len() as u64);
    h.set_mode(0o755);
    h.set_cksum();
    tar.append_data(&mut h, "pkg/agent.sh", script.as_bytes())
        .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    gz.finish().unwrap()
}

fn document(binary_base: &str) -> Value {
    let platform = acpd::testing::platform();
    json!({
        "version": "1.0.0",
        "agents": [
            {"id": "npx-agent", "name": "Npx", "version": "1.2.3", "description": "via npx",
             "distribution": {"npx": {"package": "@scope/npx-agent@1.2.3", "args": ["--acp"],
                                       "env": {"FROM_DOC": "npx"}}}},
            {"id": "uvx-agent", "name": "Uvx", "version": "0.4.0", "description": "via uvx",
             "distribution": {"uvx": {"package": "uvx-agent==0.4.0", "args": ["acp"]}}},
            {"id": "bin-agent", "name": "Bin", "version": "1.0.0", "description": "a binary",
             "distribution": {"binary": {platform.clone(): {
                 "archive": format!("{binary_base}/bin-agent-1.0.0.tar.gz"),
                 "cmd": "./agent.sh", "env": {"FROM_DOC": "binary"}}}}},
            {"id": "broken", "name": "Broken", "version": "1.0.0", "description": "bad archive",
             "distribution": {"binary": {platform.clone(): {
                 "archive": format!("{binary_base}/broken.tar.gz?token=SECRET"), "cmd": "./x"}}}},
            {"id": "missing", "name": "Missing", "version": "1.0.0", "description": "404",
             "distribution": {"binary": {platform: {
                 "archive": format!("{binary_base}/missing.zip"), "cmd": "./x"}}}}
        ]
    })
}

struct Setup {
    env: Env,
    bin: PathBuf,
}

/// A config whose providers name the document's agents, with `npx`/`uvx` stand-ins on PATH.
fn setup(registry_url: &str) -> Setup {
    let providers: String = ["npx-agent", "uvx-agent", "bin-agent", "broken", "missing"]
        .iter()
        .map(|id| {
            format!(
                "[providers.{id}]\nregistry = \"{id}\"\neof_grace = \"300ms\"\n\
                 term_grace = \"300ms\"\nenv_passthrough = [\"RECORD\"]\n"
            )
        })
        .collect();
    let env = Env::raw(&format!("registry_url = \"{registry_url}\"\n{providers}"));
    let bin = env.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["npx", "uvx"] {
        let script = format!(
            "#!/bin/sh\nprintf '%s\\n' {tool} \"$@\" > \"$RECORD\"\nexec \"{BIN}\" agent echo\n"
        );
        let path = bin.join(tool);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    Setup { env, bin }
}

impl Setup {
    fn acpd(&self) -> std::process::Command {
        let mut cmd = self.env.acpd();
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", self.bin.display()))
            .env("XDG_DATA_HOME", self.env.path().join("data"))
            .env("RECORD", self.env.path().join("argv"));
        cmd
    }

    fn run(&self, provider: &str, prompt: &str) -> (Value, i32, String) {
        run_json(
            self.acpd()
                .args(["run", "--json", "--provider", provider, prompt]),
        )
    }

    fn recorded_argv(&self) -> Vec<String> {
        std::fs::read_to_string(self.env.path().join("argv"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn list(&self) -> Value {
        let out = self
            .acpd()
            .args(["registry", "list", "--json"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Makes every cached registry document older than the TTL.
    fn age_cache(&self) {
        let dir = self.env.path().join("state/registry");
        let old = SystemTime::now() - Duration::from_secs(25 * 3600);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let f = std::fs::File::options()
                .write(true)
                .open(entry.unwrap().path())
                .unwrap();
            f.set_modified(old).unwrap();
        }
    }
}

fn error_message(v: &Value) -> &str {
    assert_eq!(v["error"]["name"], "START_FAILED", "{v}");
    v["error"]["message"].as_str().unwrap()
}

#[test]
fn npx_and_uvx_entries_run_through_their_tools() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = tmp.path().join("registry.json");
    std::fs::write(&doc, document("http://127.0.0.1:9").to_string()).unwrap();
    let s = setup(&format!("file://{}", doc.display()));

    let (v, code, stderr) = s.run("npx-agent", ":env FROM_DOC");
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(output_text(&v), "FROM_DOC=npx\n");
    assert_eq!(
        s.recorded_argv(),
        ["npx", "--yes", "@scope/npx-agent@1.2.3", "--acp"]
    );

    let (v, code, stderr) = s.run("uvx-agent", "hello uvx");
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(output_text(&v), "hello uvx");
    assert_eq!(s.recorded_argv(), ["uvx", "uvx-agent==0.4.0", "acp"]);

    let list = s.list();
    assert_eq!(list["origin"], "file");
    let ids: Vec<&str> = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["npx-agent", "uvx-agent", "bin-agent", "broken", "missing"]
    );
    assert_eq!(list["agents"][2]["runsAs"], "binary");
}

#[test]
fn a_binary_agent_installs_once_runs_and_survives_the_registry_going_away() {
    let server = Server::start();
    let base = server.url("/dl");
    server.serve("/registry.json", document(&base).to_string());
    server.serve("/dl/bin-agent-1.0.0.tar.gz", agent_tar_gz());
    let s = setup(&server.url("/registry.json"));

    let (v, code, stderr) = s.run("bin-agent", ":env FROM_DOC");
    assert_eq!(code, 0, "{v} {stderr}");
    assert_eq!(output_text(&v), "FROM_DOC=binary\n");
    let installed = s
        .env
        .path()
        .join("data/acpd/registry/bin-agent/1.0.0/pkg/agent.sh");
    assert!(installed.is_file(), "installed under the data directory");

    // The second start neither downloads nor refetches (the cache is fresh).
    let hits = server.hits.load(Ordering::Relaxed);
    let (v, code, _) = s.run("bin-agent", "again");
    assert_eq!((code, output_text(&v).as_str()), (0, "again"));
    assert_eq!(server.hits.load(Ordering::Relaxed), hits);
    assert_eq!(s.list()["origin"], "cache");

    // Offline, past the TTL: the stale cache and the installed binary still start it.
    drop(server);
    s.age_cache();
    let (v, code, stderr) = s.run("bin-agent", "offline");
    assert_eq!((code, output_text(&v).as_str()), (0, "offline"), "{stderr}");
    assert_eq!(s.list()["origin"], "stale-cache");
}

#[test]
fn a_broken_or_missing_archive_is_start_failed_naming_its_url() {
    let server = Server::start();
    let base = server.url("/dl");
    server.serve("/registry.json", document(&base).to_string());
    server.serve("/dl/broken.tar.gz", b"this is not a gzip stream".to_vec());
    let s = setup(&server.url("/registry.json"));

    let (v, code, _) = s.run("broken", "hi");
    assert_eq!(code, 3, "{v}");
    let msg = error_message(&v);
    assert!(msg.contains("cannot extract the agent archive"), "{msg}");
    assert!(msg.contains(&format!("{base}/broken.tar.gz")), "{msg}");
    assert!(!msg.contains("SECRET"), "the query is not shown: {msg}");
    assert!(msg.contains("category: spawn"), "{msg}");
    assert!(
        !s.env
            .path()
            .join("data/acpd/registry/broken/1.0.0")
            .exists(),
        "nothing half-installed"
    );

    let (v, code, _) = s.run("missing", "hi");
    assert_eq!(code, 3, "{v}");
    let msg = error_message(&v);
    assert!(msg.contains("cannot download the agent archive"), "{msg}");
    assert!(
        msg.contains(&format!("{base}/missing.zip")) && msg.contains("404"),
        "{msg}"
    );

    // An id the document does not have, and a registry that cannot be reached at all.
    let env = Env::raw(&format!(
        "registry_url = \"{}\"\n[providers.x]\nregistry = \"nope\"\n",
        server.url("/registry.json")
    ));
    let (v, code, _) = run_json(env.acpd().args(["run", "--json", "--provider", "x", "hi"]));
    assert_eq!(code, 3);
    assert!(error_message(&v).contains("has no agent \"nope\""), "{v}");
    let env =
        Env::raw("registry_url = \"http://127.0.0.1:9/r.json\"\n[providers.x]\nregistry = \"a\"\n");
    let (v, code, _) = run_json(env.acpd().args(["run", "--json", "--provider", "x", "hi"]));
    assert_eq!(code, 3);
    let msg = error_message(&v);
    assert!(
        msg.contains("cannot fetch the registry document http://127.0.0.1:9/r.json"),
        "{msg}"
    );
}

#[test]
fn registry_list_prints_a_table() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = tmp.path().join("agent.json");
    // A lone agent.json is a registry of one.
    std::fs::write(
        &doc,
        json!({"id": "solo", "name": "Solo", "version": "3.0.0", "description": "alone",
               "distribution": {"npx": {"package": "solo@3.0.0"}}})
        .to_string(),
    )
    .unwrap();
    let s = setup(&format!("file://{}", doc.display()));
    let out = s.acpd().args(["registry", "list"]).output().unwrap();
    assert_eq!(code(&out), 0);
    let text = String::from_utf8_lossy(&out.stdout);
    let words = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
    let lines: Vec<String> = text.lines().map(words).collect();
    assert!(
        lines.contains(&"ID VERSION RUNS AS NAME DESCRIPTION".to_string()),
        "{text}"
    );
    assert!(
        lines.contains(&"solo 3.0.0 npx Solo alone".to_string()),
        "{text}"
    );
}

#[test]
fn an_archive_linking_its_command_out_is_refused_and_nothing_outside_is_chmodded_or_run() {
    let server = Server::start();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    let marker = outside.path().join("ran");
    std::fs::write(
        &secret,
        format!(
            "#!/bin/sh\ntouch '{}'\nexec \"{BIN}\" agent echo\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    tar.append_link(&mut h, "agent", &secret).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    server.serve("/dl/evil.tar.gz", gz.finish().unwrap());
    let doc = json!({"agents": [{"id": "bin-agent", "name": "Evil", "version": "6.6.6",
        "description": "links out", "distribution": {"binary": {acpd::testing::platform(): {
            "archive": server.url("/dl/evil.tar.gz"), "cmd": "agent"}}}}]});
    server.serve("/registry.json", doc.to_string());
    let s = setup(&server.url("/registry.json"));

    let (v, code, _) = s.run("bin-agent", "hi");
    assert_eq!(code, 3, "{v}");
    let msg = error_message(&v);
    assert!(
        msg.contains("cannot extract the agent archive")
            && msg.contains("\"agent\" is a link to")
            && msg.contains("outside the archive"),
        "{msg}"
    );
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the link's target was chmodded");
    assert!(!marker.exists(), "the link's target was run");
    assert!(
        !s.env
            .path()
            .join("data/acpd/registry/bin-agent/6.6.6")
            .exists(),
        "nothing installed"
    );
}

/// A hostile registry document's free text (name, description, the id of an entry it skips)
/// reaches the terminal of `acpd registry list` escaped: no escape sequence, CR or BEL acts.
#[test]
fn registry_list_escapes_a_hostile_documents_text() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = tmp.path().join("registry.json");
    let evil = "\u{1b}]0;PWNED\u{7}\u{1b}[2J\r\u{9b}31m\u{202e}";
    std::fs::write(
        &doc,
        json!({"agents": [
            {"id": "ok", "name": format!("N{evil}"), "version": "1.0.0",
             "description": format!("D{evil}"), "distribution": {"npx": {"package": "ok@1"}}},
            {"id": format!("bad{evil}"), "version": "1", "distribution": {}}
        ]})
        .to_string(),
    )
    .unwrap();
    let s = setup(&format!("file://{}", doc.display()));
    let out = s.acpd().args(["registry", "list"]).output().unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for c in ['\u{1b}', '\u{7}', '\r', '\u{9b}', '\u{202e}'] {
        assert!(!text.contains(c), "{c:?} printed raw: {text:?}");
    }
    let row = text.lines().find(|l| l.starts_with("ok ")).unwrap();
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&words[..3], ["ok", "1.0.0", "npx"], "{text}");
    assert!(words[3].starts_with("N\\u{1b}]0;PWNED"), "{text}");
    assert!(text.contains("bad\\u{1b}"), "{text}");
}
