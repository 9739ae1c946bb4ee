//! A sandboxed child attacking acpd and the rest of the machine through doors the kernel
//! mediates beside the file system: other processes' abstract Unix sockets (a session bus or
//! an X server listening on one would run what it is told, outside the sandbox), signals, and
//! descriptors acpd inherited from whoever started it (Landlock does not check a write through
//! a descriptor opened before the sandbox).
//! The child is a shell script that tries each door, writes what happened to a file in its
//! workspace, then becomes the echo agent, under `acpd run`.

use crate::common;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::Path;
use std::process::Command;

use common::raw::Raw;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

const PERL: &str = "/usr/bin/perl";

/// Perl connecting to the abstract socket named by its argument: `connected`, or `refused:`
/// and the OS error.
const DIAL: &str = "use Socket; socket(S, PF_UNIX, SOCK_STREAM, 0) or die \"socket: $!\\n\"; \
    print connect(S, pack_sockaddr_un(\"\\0\" . $ARGV[0])) ? \"connected\\n\" : \"refused: $!\\n\"";

/// Perl binding the abstract socket named by its argument and dialing it from a forked child:
/// what the child saw (`connected`, or `refused:` and the OS error).
const OWN: &str = "use Socket; socket(L, PF_UNIX, SOCK_STREAM, 0) or die \"socket: $!\\n\"; \
    bind(L, pack_sockaddr_un(\"\\0\" . $ARGV[0])) or die \"bind: $!\\n\"; listen(L, 1); \
    if (fork) { wait } else { socket(S, PF_UNIX, SOCK_STREAM, 0); \
    print connect(S, pack_sockaddr_un(\"\\0\" . $ARGV[0])) ? \"connected\\n\" : \"refused: $!\\n\" }";

/// `acpd run` of a provider whose child, sandboxed when `sandbox`, dials the abstract socket
/// `name`, signals acpd (its parent), dials an abstract socket of its own tree and writes to
/// descriptor 7 (which acpd's parent opened on `leak.txt` and left open across exec); what it
/// saw, one door a line.
fn doors(name: &str, sandbox: bool) -> String {
    let env = Env::raw("");
    let work = env.path().join("work");
    let home = env.path().join("home");
    for d in [&work, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    let seen = work.join("doors.txt");
    let script = format!(
        "{{ printf 'abstract: '; {PERL} -e '{DIAL}' {name}; \
         if kill -0 $PPID 2>/dev/null; then echo 'signal: sent'; else echo 'signal: refused'; fi; \
         printf 'own: '; {PERL} -e '{OWN}' {name}-own; \
         if (echo escaped >&7) 2>/dev/null; then echo 'fd: written'; else echo 'fd: closed'; fi; }} > '{}' 2>&1; exec '{BIN}' agent echo",
        seen.display()
    );
    let argv = serde_json::to_string(&["/bin/sh", "-c", &script]).unwrap();
    let sandbox = if sandbox { "landlock" } else { "none" };
    std::fs::write(
        &env.config,
        format!("[providers.door]\ncommand = {argv}\nsandbox = \"{sandbox}\"\n"),
    )
    .unwrap();
    let leak = env.path().join("leak.txt");
    // acpd started with descriptor 7 open on `leak.txt`, not close-on-exec, as a careless
    // launcher leaves one.
    let mut cmd = Command::new("/bin/sh");
    cmd.envs(base().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env_remove("ACPD_CONFIG")
        .env_remove("ACPD_DEPTH")
        .env_remove("ACPD_MAX_DEPTH")
        .args(["-c", "exec 7>>\"$0\"; exec \"$@\""])
        .arg(&leak)
        .arg(BIN)
        .arg("--config")
        .arg(&env.config)
        .args(["run", "--json", "--provider", "door", "hi"])
        .current_dir(&work)
        .env("HOME", &home)
        .env("XDG_DATA_HOME", env.path().join("data"))
        .env("STATE_DIRECTORY", env.path().join("state"));
    let (r, code, stderr) = run_json(&mut cmd);
    assert_eq!(
        std::fs::read_to_string(&leak).unwrap(),
        "",
        "a child wrote through a descriptor acpd inherited"
    );
    assert_eq!(code, 0, "{r}\n{stderr}");
    assert_eq!(r["stopReason"], "completed", "{r}");
    std::fs::read_to_string(&seen).unwrap()
}

/// A listener on a fresh abstract name, outside any sandbox; the name.
fn listen() -> (UnixListener, String) {
    let name = format!(
        "acpd-test-door-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    (listener, name)
}

#[test]
fn a_sandboxed_child_reaches_no_abstract_socket_signal_or_inherited_descriptor_outside_its_sandbox()
{
    let abi = landlock_abi();
    if abi < 6 || !Path::new(PERL).exists() {
        eprintln!("skipped: needs Landlock ABI 6 (scopes; this kernel: {abi}) and {PERL}");
        return;
    }
    let (listener, name) = listen();
    // Without the sandbox the same child gets through both doors: the check below can fail.
    let open = doors(&name, false);
    assert_eq!(
        open,
        "abstract: connected\nsignal: sent\nown: connected\nfd: closed\n"
    );
    assert!(
        listener.accept().is_ok(),
        "the unsandboxed dial did not arrive"
    );
    let boxed = doors(&name, true);
    assert_eq!(
        boxed,
        "abstract: refused: Operation not permitted\nsignal: refused\nown: connected\nfd: closed\n",
        "a sandboxed child got out, or could not reach its own tree's socket"
    );
    assert!(
        listener.accept().is_err(),
        "a sandboxed child's dial reached a listener outside its sandbox"
    );
}

/// A sandboxed agent in a bridge session asks the editor (which advertised `fs` and
/// `terminal`) to do what its sandbox forbids: write outside its workspace, read a key, write
/// through `..`, run a command. Only the write inside its workspace reaches the editor; the
/// agent is told there is no terminal.
#[test]
fn a_sandboxed_sessions_editor_is_asked_nothing_outside_its_sandbox() {
    if landlock_abi() < 1 {
        eprintln!("skipped: this kernel enforces no Landlock");
        return;
    }
    let env = Env::raw(&format!(
        "[providers.boxed]\ncommand = [\"{BIN}\", \"agent\", \"echo\"]\nsandbox = \"landlock\"\n"
    ));
    let (work, home) = (env.path().join("work"), env.path().join("home"));
    for d in [&work, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    let outside = env.path().join("outside.txt");
    let mut cmd = env.acpd();
    cmd.arg("stdio")
        .current_dir(&work)
        .env("HOME", &home)
        .env("XDG_DATA_HOME", env.path().join("data"));
    let mut raw = Raw::process(cmd, &env.path().join("acpd.log"));
    raw.initialize(json!({"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true}));
    let sid = raw.new_session(&work, "boxed");
    let asks = [
        json!({"path": outside, "content": "escaped"}),
        json!({"path": home.join(".ssh/id_ed25519")}),
        json!({"path": work.join("sub/../../outside.txt"), "content": "escaped"}),
        json!({"command": "touch", "args": [outside]}),
        json!({"path": work.join("inside.txt"), "content": "fine"}),
    ];
    let methods = [
        "fs/write_text_file",
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "fs/write_text_file",
    ];
    let mut script: Vec<String> = methods
        .iter()
        .zip(&asks)
        .map(|(m, p)| format!(":request {m} {p}"))
        .collect();
    script.push(":client-caps".into());
    let id = json!(raw.send_prompt(&sid, &script.join("\n")));
    let mut asked = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = raw.next_within(left).expect("no answer to the prompt");
        if line.is_response() && line.value["id"] == id {
            break;
        }
        if line.is_request() {
            asked.push(line.value["params"].clone());
            let reply = json!({"jsonrpc": "2.0", "id": line.value["id"], "result": {}});
            raw.line(&reply.to_string());
        }
        raw.seen.push(line);
    }
    let text: String = raw
        .seen
        .iter()
        .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(asked.len(), 1, "the editor was asked {asked:?}");
    assert_eq!(
        asked[0]["path"],
        json!(work.join("inside.txt")),
        "{asked:?}"
    );
    let replies: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("error ") || l.starts_with("reply "))
        .collect();
    assert_eq!(
        replies,
        [
            "error -33015",
            "error -33015",
            "error -33015",
            "error -32601",
            "reply {}"
        ],
        "{text}"
    );
    let caps = text
        .lines()
        .find_map(|l| l.strip_prefix("client-caps "))
        .unwrap();
    let caps: serde_json::Value = serde_json::from_str(caps).unwrap();
    assert_eq!(caps["terminal"], json!(null), "{caps}");
    assert_eq!(caps["fs"]["writeTextFile"], true, "{caps}");
    assert!(!outside.exists());
}
