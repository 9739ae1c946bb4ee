//! A raw-bytes JSON-RPC peer for hostile-parent tests: it writes exactly the bytes a test gives
//! it (arrays, odd ids, unfinished lines) into `acpd stdio` or a socket of `acpd serve`, and it
//! reads acpd's output only when the test says so, so a parent that stops reading is a real one.
//! Every line acpd writes is kept verbatim, for byte-exact checks.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{BIN, Env};

/// How long a test waits for an answer it expects before failing.
pub const ANSWER: Duration = Duration::from_secs(20);

/// One line from acpd: its raw bytes (newline stripped) and, when it is JSON, its value.
#[derive(Debug, Clone)]
pub struct Line {
    pub raw: Vec<u8>,
    pub value: Value,
}

impl Line {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
    pub fn is_response(&self) -> bool {
        self.value.get("method").is_none()
            && (self.value.get("result").is_some() || self.value.get("error").is_some())
    }
    pub fn is_request(&self) -> bool {
        self.value.get("method").is_some() && self.value.get("id").is_some()
    }
    pub fn is_notification(&self) -> bool {
        self.value.get("method").is_some() && self.value.get("id").is_none()
    }
    pub fn method(&self) -> &str {
        self.value["method"].as_str().unwrap_or("")
    }
}

/// Where acpd's output comes from: read lazily, on a thread started by [`Raw::start_reading`].
enum Source {
    Unread(Box<dyn Read + Send>),
    Reading(Receiver<Option<Line>>),
    Taken,
}

pub struct Raw {
    /// `acpd stdio` (None for a socket connection).
    pub process: Option<Child>,
    writer: Option<Box<dyn Write + Send>>,
    socket: Option<UnixStream>,
    source: Source,
    /// True once the reader saw EOF.
    pub eof: bool,
    /// Every line seen so far that a `request` call skipped over (notifications, requests from
    /// acpd, other responses), in order.
    pub seen: Vec<Line>,
    next_id: u64,
    /// acpd's stderr, for failure messages (`acpd stdio` only).
    log: Option<std::path::PathBuf>,
    /// Our reading end (acpd's stdout pipe, or the socket), for FIONREAD.
    stdout_fd: Option<std::os::fd::RawFd>,
}

/// Kills a forgotten `acpd stdio` so a failed test leaves nothing behind.
impl Drop for Raw {
    fn drop(&mut self) {
        // The reading thread holds a clone of the socket: shut it down, or acpd never sees
        // this connection end.
        if let Some(s) = &self.socket {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

impl Raw {
    /// `acpd --config <env> stdio`, stderr to `<env>/acpd.log`. Nothing is read until asked.
    pub fn stdio(env: &Env) -> Raw {
        Raw::stdio_with(env, &[], log_file(env))
    }

    /// [`Raw::stdio`] with `args` after `stdio` and acpd's stderr going to `stderr`.
    pub fn stdio_with(env: &Env, args: &[&str], stderr: Stdio) -> Raw {
        let mut process = Command::new(BIN)
            .arg("--config")
            .arg(&env.config)
            .arg("stdio")
            .args(args)
            .current_dir(env.path())
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .env_remove("ACPD_MAX_DEPTH")
            .env("XDG_CONFIG_HOME", "/nonexistent-acpd-test-config")
            .env("ACPD_LOG", "warn")
            .env("STATE_DIRECTORY", env.path().join("state"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn acpd stdio");
        let writer = process.stdin.take().expect("stdin");
        let reader = process.stdout.take().expect("stdout");
        let stdout_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&reader));
        Raw {
            process: Some(process),
            writer: Some(Box::new(writer)),
            socket: None,
            source: Source::Unread(Box::new(reader)),
            eof: false,
            seen: Vec::new(),
            next_id: 1000,
            log: Some(env.path().join("acpd.log")),
            stdout_fd,
        }
    }

    /// A client process that speaks for the test on its stdin/stdout (`acpd connect` run as
    /// another user, say), its stderr to `log`.
    pub fn process(mut cmd: Command, log: &Path) -> Raw {
        let mut process = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("spawn the client");
        let writer = process.stdin.take().expect("stdin");
        let reader = process.stdout.take().expect("stdout");
        let stdout_fd = Some(std::os::fd::AsRawFd::as_raw_fd(&reader));
        Raw {
            process: Some(process),
            writer: Some(Box::new(writer)),
            socket: None,
            source: Source::Unread(Box::new(reader)),
            eof: false,
            seen: Vec::new(),
            next_id: 1000,
            log: Some(log.to_path_buf()),
            stdout_fd,
        }
    }

    /// A raw connection to `acpd serve`'s socket.
    pub fn socket(path: &Path) -> Raw {
        // The socket file exists from bind(), a moment before listen(): refused until then.
        let deadline = Instant::now() + Duration::from_secs(10);
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("connect to acpd serve at {}: {e}", path.display()),
            }
        };
        let reader = stream.try_clone().expect("clone socket");
        let writer = stream.try_clone().expect("clone socket");
        let stream_fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        Raw {
            process: None,
            writer: Some(Box::new(writer)),
            socket: Some(stream),
            source: Source::Unread(Box::new(reader)),
            eof: false,
            seen: Vec::new(),
            next_id: 1000,
            log: None,
            stdout_fd: Some(stream_fd),
        }
    }

    /// Bytes acpd wrote to us that nobody has read yet (call while the connection is open).
    pub fn unread_output(&self) -> usize {
        let fd = self.stdout_fd.expect("a reading end");
        let mut unread: nix::libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int through the pointer; `fd` is our open reading end
        // (the reading thread, or `socket`, keeps it open).
        let r = unsafe { nix::libc::ioctl(fd, nix::libc::FIONREAD, &mut unread) };
        assert_eq!(r, 0, "FIONREAD");
        unread as usize
    }

    /// Waits until acpd's next write to us blocks: its stdout pipe is full (`acpd stdio`), or
    /// what waits in our socket stopped growing for half a second (a socket, whose buffer size
    /// is not ours to know).
    pub fn until_output_blocks(&self) {
        let blocked = if self.socket.is_some() {
            let (mut last, mut still) = (0, 0);
            super::eventually(ANSWER, || {
                let now = self.unread_output();
                still = if now == last && now > 0 { still + 1 } else { 0 };
                last = now;
                still >= 50
            })
        } else {
            let fd = self.stdout_fd.expect("a reading end");
            // SAFETY: F_GETPIPE_SZ takes no argument and only reads the pipe's size.
            let capacity = unsafe { nix::libc::fcntl(fd, nix::libc::F_GETPIPE_SZ) };
            assert!(capacity > 0, "F_GETPIPE_SZ");
            super::eventually(ANSWER, || self.unread_output() + 4096 >= capacity as usize)
        };
        assert!(
            blocked,
            "acpd never filled its output: {}",
            self.unread_output()
        );
    }

    /// acpd's stderr so far (empty for a socket connection).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("acpd stdio").id()
    }

    /// Writes `bytes` as they are (no newline added). A write error (acpd closed our pipe) is
    /// returned, not a panic: hostile tests expect acpd to hang up on them.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let w = self.writer.as_mut().expect("stdin open");
        w.write_all(bytes)?;
        w.flush()
    }

    /// Writes one line: `text` and a newline.
    pub fn line(&mut self, text: &str) {
        let mut bytes = text.as_bytes().to_vec();
        bytes.push(b'\n');
        self.write(&bytes).expect("acpd takes our line");
    }

    /// Sends a request with a fresh numeric id and returns the id.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.line(&msg.to_string());
        id
    }

    /// Closes our writing side: EOF for `acpd stdio`, `shutdown(Write)` for a socket.
    pub fn close_write(&mut self) {
        self.writer.take();
        if let Some(s) = &self.socket {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }

    /// Hands the writing side over (to a flooding thread, say).
    pub fn take_writer(&mut self) -> Box<dyn Write + Send> {
        self.writer.take().expect("stdin open")
    }

    /// Hands the unread output over (for a test that reads it its own way).
    pub fn take_reader(&mut self) -> Box<dyn Read + Send> {
        match std::mem::replace(&mut self.source, Source::Taken) {
            Source::Unread(r) => r,
            _ => panic!("output already being read"),
        }
    }

    /// Starts the reading thread (idempotent). It hands over one line at a time, reading the
    /// next only when the test asks for it (a rendezvous channel, a 64 KiB buffer), so between
    /// calls to `next*` this parent really is not reading: acpd's writes pile up in its pipe.
    pub fn start_reading(&mut self) {
        let Source::Unread(_) = &self.source else {
            return;
        };
        let Source::Unread(reader) = std::mem::replace(&mut self.source, Source::Taken) else {
            unreachable!()
        };
        let (tx, rx) = sync_channel(0);
        std::thread::spawn(move || {
            let mut reader = BufReader::with_capacity(64 * 1024, reader);
            loop {
                let mut raw = Vec::new();
                match reader.read_until(b'\n', &mut raw) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                    Ok(_) => {
                        if raw.last() == Some(&b'\n') {
                            raw.pop();
                        }
                        let value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                        if tx.send(Some(Line { raw, value })).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        self.source = Source::Reading(rx);
    }

    /// The next line within `timeout`; None at EOF or when nothing came in time.
    pub fn next_within(&mut self, timeout: Duration) -> Option<Line> {
        self.start_reading();
        if self.eof {
            return None;
        }
        let Source::Reading(rx) = &self.source else {
            unreachable!()
        };
        match rx.recv_timeout(timeout) {
            Ok(Some(line)) => Some(line),
            Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                None
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// The next line, or a panic after [`ANSWER`].
    pub fn next(&mut self) -> Line {
        match self.next_within(ANSWER) {
            Some(line) => line,
            None if self.eof => panic!("acpd closed its output; seen: {:?}", self.seen_text()),
            None => panic!("no line from acpd in {ANSWER:?}"),
        }
    }

    /// The next response (of any id), keeping the lines before it in `seen`.
    pub fn next_response(&mut self) -> Line {
        loop {
            let line = self.next();
            if line.is_response() {
                return line;
            }
            self.seen.push(line);
        }
    }

    /// Reads until the response whose `id` is `id` (compared as JSON values), keeping every
    /// other line in `seen`.
    pub fn answer(&mut self, id: &Value) -> Line {
        let deadline = Instant::now() + ANSWER;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.next_within(left) else {
                panic!(
                    "no answer to id {id} (eof: {}); seen: {:?}",
                    self.eof,
                    self.seen_text()
                );
            };
            if line.is_response() && &line.value["id"] == id {
                return line;
            }
            self.seen.push(line);
        }
    }

    /// Sends a request and returns its whole answer (`result` or `error` inside).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.answer(&json!(id)).value
    }

    /// Sends a request and returns its `result`, panicking on an error answer.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call(method, params);
        assert!(
            answer.get("error").is_none(),
            "{method} failed: {answer}; acpd.log may say why"
        );
        answer["result"].clone()
    }

    /// `initialize` (protocol 1) with `capabilities`; a panic that names the likely cause when
    /// acpd exits at once (a config it rejected).
    pub fn initialize(&mut self, capabilities: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": capabilities}});
        if let Err(e) = self.write(format!("{msg}\n").as_bytes()) {
            panic!(
                "acpd did not take initialize ({e}): did it reject the config? stderr: {}",
                self.log()
            );
        }
        self.start_reading();
        let deadline = Instant::now() + ANSWER;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_within(left) {
                Some(line) if line.is_response() && line.value["id"] == json!(id) => {
                    return line.value["result"].clone();
                }
                Some(line) => self.seen.push(line),
                None => panic!(
                    "acpd did not answer initialize (eof: {}): did it reject the config? \
                     stderr: {}",
                    self.eof,
                    self.log()
                ),
            }
        }
    }

    /// `session/new` in `cwd` for `provider`; returns the session id.
    pub fn new_session(&mut self, cwd: &Path, provider: &str) -> String {
        let r = self.ok(
            "session/new",
            json!({"cwd": cwd, "mcpServers": [], "_meta": {"acpd": {"provider": provider}}}),
        );
        r["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// Sends `session/prompt` with one text block; returns the request id.
    pub fn send_prompt(&mut self, session: &str, text: &str) -> u64 {
        self.send(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
    }

    /// Starts a delegated run and returns its run id.
    pub fn start_run(&mut self, provider: &str, text: &str) -> String {
        let r = self.ok(
            "_acpd/subagent/start",
            json!({"provider": provider, "prompt": [{"type": "text", "text": text}]}),
        );
        r["runId"].as_str().expect("runId").to_string()
    }

    /// Waits for a run's current turn and returns its result.
    pub fn wait_run(&mut self, run: &str) -> Value {
        self.ok("_acpd/subagent/wait", json!({"runId": run}))
    }

    /// All lines seen so far, as text, for failure messages (each cut to 300 bytes).
    pub fn seen_text(&self) -> Vec<String> {
        self.seen
            .iter()
            .map(|l| String::from_utf8_lossy(&l.raw[..l.raw.len().min(300)]).into_owned())
            .collect()
    }

    /// The `agent_message_chunk` text seen so far for `session`, in order.
    pub fn chunk_text(&self, session: &str) -> String {
        self.seen
            .iter()
            .filter(|l| {
                l.method() == "session/update"
                    && l.value["params"]["sessionId"] == session
                    && l.value["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
            })
            .filter_map(|l| l.value["params"]["update"]["content"]["text"].as_str())
            .collect()
    }

    /// Reads until a chunk for `session` contains `needle`; returns that chunk's text.
    pub fn until_chunk(&mut self, session: &str, needle: &str) -> String {
        let deadline = Instant::now() + ANSWER;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(line) = self.next_within(left) else {
                panic!("no chunk with {needle:?}; seen: {:?}", self.seen_text());
            };
            let text = line.value["params"]["update"]["content"]["text"]
                .as_str()
                .map(str::to_string);
            let matches = line.method() == "session/update"
                && line.value["params"]["sessionId"] == session
                && text.as_deref().is_some_and(|t| t.contains(needle));
            self.seen.push(line);
            if matches {
                return text.unwrap_or_default();
            }
        }
    }

    /// Reads and drops output until EOF or `timeout`; true at EOF.
    pub fn drain_to_eof(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.eof {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self.next_within(left.min(Duration::from_millis(200)));
        }
        true
    }
}

pub fn log_file(env: &Env) -> Stdio {
    match std::fs::File::create(env.path().join("acpd.log")) {
        Ok(f) => Stdio::from(f),
        Err(_) => Stdio::null(),
    }
}

/// A field of /proc/PID/status in KiB (`VmRSS`, `VmHWM`); None once the process is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Current resident memory in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS").unwrap_or_else(|| panic!("process {pid} is gone"))
}

/// Peak resident memory in KiB.
pub fn peak_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM").unwrap_or_else(|| panic!("process {pid} is gone"))
}

/// Makes this test process the reaper of orphans from acpd's tree, so a process killed after
/// acpd died is reaped here instead of lingering as a zombie of a PID 1 that reaps nothing.
pub fn subreaper() {
    let _ = nix::sys::prctl::set_child_subreaper(true);
}

/// True once `pid` is gone within `timeout`, reaping it first if it was orphaned to us.
pub fn gone_within(pid: i32, timeout: Duration) -> bool {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    super::eventually(timeout, || {
        let _ = waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        !super::exists(pid)
    })
}

/// `acpd serve --socket <env>/run/acpd.sock`, logging to `<env>/daemon.log`; killed on drop.
pub struct Serve {
    pub socket: std::path::PathBuf,
    pub child: Child,
}

impl Serve {
    pub fn start(env: &Env) -> Serve {
        let socket = env.path().join("run/acpd.sock");
        let log = std::fs::File::create(env.path().join("daemon.log")).expect("log file");
        let child = env
            .acpd()
            .args(["serve", "--socket"])
            .arg(&socket)
            .env("ACPD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn acpd serve");
        let mut serve = Serve { socket, child };
        // Probe by path existence, not by connecting: a probe would use up a connection.
        let listening = super::eventually(Duration::from_secs(10), || {
            serve.socket.exists() || serve.child.try_wait().ok().flatten().is_some()
        });
        if !listening || !serve.socket.exists() {
            let log = std::fs::read_to_string(env.path().join("daemon.log")).unwrap_or_default();
            panic!("acpd serve did not listen (a config it rejected?): {log}");
        }
        serve
    }

    pub fn connect(&self) -> Raw {
        Raw::socket(&self.socket)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
