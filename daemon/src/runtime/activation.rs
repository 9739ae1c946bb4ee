//! The sockets systemd passed at start (socket activation), told apart by what they are, never
//! by their position. A service that two socket units trigger (acpd.socket, and the optional
//! acpd-https.socket) gets both descriptors in an order systemd does not fix, so "the first one
//! is the Unix socket" would hand the TCP port to the Unix code and leave the Unix socket, on
//! which editors are queued, unserved. A TCP listener carries its socket unit's
//! `FileDescriptorName=` (from `LISTEN_FDNAMES`), which says how to serve it (`https`).

use std::net::TcpListener;
use std::os::unix::net::UnixListener;

/// More sockets than any acpd unit passes (they pass two); a larger `LISTEN_FDS` is a mistake
/// (a stale variable), not read as a loop over that many descriptors.
const MAX_ACTIVATED: usize = 256;

/// What systemd passed, sorted.
#[derive(Debug, Default)]
pub struct Activated {
    /// acpd.socket's listener: the first Unix stream socket passed.
    pub unix: Option<UnixListener>,
    /// Every TCP stream listener, in the order passed, with its name: `https` for
    /// acpd-https.socket; a socket unit without `FileDescriptorName=` gives its unit name
    /// (`acpd.socket`), and `unknown` stands for a name systemd did not give. One unit with two
    /// `ListenStream=` lines gives two listeners of the same name.
    pub tcp: Vec<(String, TcpListener)>,
    /// Sockets passed but not served (kept from children), each saying which and why. They
    /// are returned, not logged, because they are taken before logging is set up.
    pub ignored: Vec<ActivationError>,
}

/// A socket systemd passed that acpd does not serve.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error(
        "systemd passed socket #{index} (named {name}), which is neither a Unix nor a TCP stream \
         listener ({source}); acpd serves ListenStream= sockets only: remove it from its socket unit"
    )]
    NotAListener {
        index: usize,
        name: String,
        source: std::io::Error,
    },
    #[error(
        "systemd passed a second Unix socket, #{index} (named {name}); acpd serves one, \
         acpd.socket's: remove the extra ListenStream= path"
    )]
    SecondUnix { index: usize, name: String },
    #[error(
        "LISTEN_FDS={count} is more sockets than acpd takes (at most {MAX_ACTIVATED}); socket \
         activation ignored: check the socket units that start acpd.service"
    )]
    TooMany { count: usize },
}

/// Takes the sockets systemd passed to this process (`LISTEN_PID`, `LISTEN_FDS`; both are
/// removed from the environment, so call it before any thread exists) and sorts them by type.
/// Without socket activation, everything is empty.
pub fn activated_listeners() -> Activated {
    let mut activated = Activated::default();
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse().ok());
    if let Some(count) = count.filter(|&n: &usize| n > MAX_ACTIVATED) {
        activated.ignored.push(ActivationError::TooMany { count });
        return activated;
    }
    // Read before listenfd clears LISTEN_FDS; LISTEN_FDNAMES means nothing without it.
    let names = std::env::var("LISTEN_FDNAMES").ok();
    let mut fds = listenfd::ListenFd::from_env();
    let names = fd_names(names.as_deref(), fds.len());
    for (index, name) in names.into_iter().enumerate() {
        // listenfd checks the type and family and sets FD_CLOEXEC on the one it hands out;
        // one it refuses stays for the next try.
        if let Some(listener) = fds.take_unix_listener(index).unwrap_or_default() {
            match activated.unix {
                None => activated.unix = Some(listener),
                Some(_) => activated
                    .ignored
                    .push(ActivationError::SecondUnix { index, name }),
            }
            continue;
        }
        match fds.take_tcp_listener(index) {
            Ok(Some(listener)) => activated.tcp.push((name, listener)),
            Ok(None) => {}
            Err(source) => {
                // Left open but kept from every child: children inherit what is not
                // close-on-exec. Not closed: LISTEN_FDS may be wrong about what it is (or
                // whether it is open at all), and closing it would claim it is acpd's.
                if let Ok(Some(fd)) = fds.take_raw_fd(index) {
                    // SAFETY: fcntl on any integer is defined: a descriptor that is not open
                    // gives EBADF and changes nothing.
                    unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC) };
                }
                activated.ignored.push(ActivationError::NotAListener {
                    index,
                    name,
                    source,
                });
            }
        }
    }
    activated
}

/// One name per descriptor: `LISTEN_FDNAMES` split at `:`, or `unknown` for each when it is
/// missing or does not name every descriptor (sd_listen_fds_with_names(3) does the same).
fn fd_names(raw: Option<&str>, count: usize) -> Vec<String> {
    match raw.map(|r| r.split(':').collect::<Vec<_>>()) {
        Some(names) if names.len() == count => names.into_iter().map(str::to_owned).collect(),
        _ => vec!["unknown".to_owned(); count],
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! Over systemd's own implementation of the protocol: `systemd-socket-activate` binds the
    //! sockets, waits for a first connection, sets LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES and
    //! executes this test binary's `probe`, which takes the sockets, checks each one accepts a
    //! connection, and prints what it found.

    use super::*;
    use std::io::{BufRead, Read};
    use std::os::unix::net::{UnixDatagram, UnixStream};
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    /// Run by `systemd-socket-activate` only (the harness skips it otherwise).
    #[test]
    #[ignore = "run under systemd-socket-activate by the tests below"]
    fn probe() {
        let passed: usize = std::env::var("LISTEN_FDS").map_or(0, |n| n.parse().unwrap_or(0));
        let activated = activated_listeners();
        let mut out = String::new();
        if let Some(unix) = &activated.unix {
            // The connection that made systemd-socket-activate start us waits in its backlog.
            unix.accept().unwrap();
            let path = unix.local_addr().unwrap();
            out += &format!("unix={} ", path.as_pathname().unwrap().display());
        }
        for (name, tcp) in &activated.tcp {
            let addr = tcp.local_addr().unwrap();
            let _client = std::net::TcpStream::connect(addr).unwrap();
            tcp.accept().unwrap();
            out += &format!("tcp={name}@{addr} ");
        }
        for why in &activated.ignored {
            out += &format!("ignored={why} ");
        }
        if passed > MAX_ACTIVATED {
            // Nothing was taken: what is open is not the sockets' (cargo's jobserver, say).
            println!("PROBE {}", out.trim_end());
            return;
        }
        assert!(
            std::env::var_os("LISTEN_FDS").is_none(),
            "LISTEN_FDS left set"
        );
        // Every passed descriptor still open is close-on-exec: no child inherits one.
        let inheritable: Vec<String> = (3..3 + passed as i32)
            .filter(|&fd| {
                let flags = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) };
                flags != -1 && flags & nix::libc::FD_CLOEXEC == 0
            })
            .map(|fd| fd.to_string())
            .collect();
        if !inheritable.is_empty() {
            out += &format!("inheritable={} ", inheritable.join(","));
        }
        println!("PROBE {}", out.trim_end());
    }

    /// Runs `probe` under `systemd-socket-activate ARGS… --` (a free port in place of PORT),
    /// triggers it with `trigger` once `ready` exists, and returns the probe's line; None when
    /// the tool is missing.
    fn activate(args: &[&str], ready: &Path, trigger: impl Fn()) -> Option<String> {
        for _attempt in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
                .to_string();
            let args: Vec<String> = args.iter().map(|a| a.replace("PORT", &port)).collect();
            let spawned = Command::new("systemd-socket-activate")
                .args(&args)
                .arg("--")
                .arg(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "runtime::activation::tests::probe"])
                .args(["--nocapture", "--test-threads=1", "-q"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            let mut child = match spawned {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                r => r.unwrap(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut exited = None;
            while exited.is_none() && !ready.exists() && Instant::now() < deadline {
                exited = child.try_wait().unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
            if exited.is_some() {
                // Most likely the port was taken between our bind and its: another one.
                let mut err = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                eprintln!("systemd-socket-activate exited early: {err}");
                continue;
            }
            trigger();
            let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            let mut probe = None;
            while stdout.read_line(&mut line).unwrap() > 0 {
                if let Some(p) = line.trim_end().strip_prefix("PROBE ") {
                    probe = Some(p.replace(&port, "PORT"));
                }
                line.clear();
            }
            // Another test of this process may reap every child (waitpid(-1)): ECHILD then
            // says nothing of the probe, whose PROBE line is the proof.
            let status = child.wait();
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(
                status.is_err() || status.is_ok_and(|s| s.success()),
                "probe failed: {err}"
            );
            return Some(probe.unwrap_or_else(|| panic!("no PROBE line; stderr: {err}")));
        }
        panic!("systemd-socket-activate could not bind a free port in 3 attempts");
    }

    /// Connects to `path` until it accepts (it exists as soon as it is bound, maybe before
    /// listen), bounded.
    fn connect(path: &Path) -> UnixStream {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match UnixStream::connect(path) {
                Ok(s) => return s,
                Err(e) if Instant::now() >= deadline => panic!("connect {}: {e}", path.display()),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    #[test]
    fn the_unix_socket_is_found_when_the_tcp_port_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("acpd.sock");
        let s = sock.to_str().unwrap();
        let args = [
            "-l",
            "127.0.0.1:PORT",
            "-l",
            s,
            "--fdname=https:acpd.socket",
        ];
        let Some(probe) = activate(&args, &sock, || drop(connect(&sock))) else {
            eprintln!("skipped: systemd-socket-activate not found (the systemd package)");
            return;
        };
        assert_eq!(probe, format!("unix={s} tcp=https@127.0.0.1:PORT"));
    }

    #[test]
    fn a_second_unix_socket_is_refused_and_unnamed_sockets_are_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
        let (sa, sb) = (a.to_str().unwrap(), b.to_str().unwrap());
        // No --fdname: systemd-socket-activate sets no LISTEN_FDNAMES.
        let args = ["-l", "127.0.0.1:PORT", "-l", sa, "-l", sb];
        let Some(probe) = activate(&args, &b, || drop(connect(&a))) else {
            eprintln!("skipped: systemd-socket-activate not found (the systemd package)");
            return;
        };
        assert_eq!(
            probe,
            format!(
                "unix={sa} tcp=unknown@127.0.0.1:PORT ignored=systemd passed a second Unix \
                 socket, #2 (named unknown); acpd serves one, acpd.socket's: remove the extra \
                 ListenStream= path"
            )
        );
    }

    #[test]
    fn a_datagram_socket_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("dgram.sock");
        let s = sock.to_str().unwrap();
        let args = ["--datagram", "-l", s, "--fdname=https"];
        let trigger = || {
            UnixDatagram::unbound()
                .unwrap()
                .send_to(b"x", &sock)
                .unwrap();
        };
        let Some(probe) = activate(&args, &sock, trigger) else {
            eprintln!("skipped: systemd-socket-activate not found (the systemd package)");
            return;
        };
        assert!(
            probe.starts_with("ignored=systemd passed socket #0 (named https), which is neither")
                && probe.ends_with("remove it from its socket unit"),
            "{probe}"
        );
    }

    /// The probe itself, started with a LISTEN_FDS no systemd set: nothing behind it, or far
    /// too many.
    fn stale(listen_fds: &str) -> String {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "runtime::activation::tests::probe"])
            .args(["--nocapture", "--test-threads=1", "-q"])
            .env("LISTEN_FDS", listen_fds)
            .env_remove("LISTEN_PID")
            .env_remove("LISTEN_FDNAMES")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.lines().find_map(|l| l.strip_prefix("PROBE "));
        line.unwrap_or_else(|| panic!("no PROBE line: {stdout}"))
            .to_owned()
    }

    #[test]
    fn a_stale_listen_fds_is_reported_not_fatal() {
        let probe = stale("2");
        assert!(
            probe.starts_with("ignored=systemd passed socket #0 (named unknown), which is neither")
                && probe.contains("ignored=systemd passed socket #1 (named unknown)")
                && !probe.contains("inheritable="),
            "{probe}"
        );
        assert_eq!(
            stale("100000000"),
            "ignored=LISTEN_FDS=100000000 is more sockets than acpd takes (at most 256); socket \
             activation ignored: check the socket units that start acpd.service"
        );
    }

    #[test]
    fn names_pair_with_descriptors_only_when_they_name_each_one() {
        assert_eq!(
            fd_names(Some("acpd.socket:https"), 2),
            ["acpd.socket", "https"]
        );
        assert_eq!(fd_names(Some("https"), 2), ["unknown", "unknown"]);
        assert_eq!(fd_names(None, 1), ["unknown"]);
        assert!(fd_names(None, 0).is_empty());
    }
}
