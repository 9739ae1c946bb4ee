//! The prompt script: a pure parse of a prompt's text into the steps of one turn.
//!
//! Kept free of I/O so the grammar (which tests of every other part of acpd rely on) can be
//! checked in isolation, and so a malformed directive becomes a step that explains itself
//! instead of an error path in the agent.

use std::str::FromStr;

use nix::sys::signal::Signal;

/// Largest byte count `:chunks` and `:oversize` accept, so a typo cannot make the agent try to
/// allocate more memory than a test machine has.
pub(super) const MAX_BYTES: usize = 256 * 1024 * 1024;

/// One step of a turn, in prompt order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// A non-directive line, newline included, streamed as one `agent_message_chunk`.
    Echo(String),
    /// A line to stream explaining why a directive was not run (unknown or malformed).
    Explain(String),
    Stop(String),
    Error {
        code: i64,
        message: String,
    },
    MetaFailure(String),
    AirFailure(String),
    Crash(i32),
    Signal(Signal),
    Chunks {
        count: u64,
        size: usize,
    },
    /// Chunks stamped with the system-wide monotonic clock at send time, `every_ms` apart:
    /// what a benchmark needs to measure per-message latency across processes.
    Timed {
        count: u64,
        size: usize,
        every_ms: u64,
    },
    Update(String),
    /// A `usage_update` saying this many tokens are in context (what a budget counts).
    Usage(u64),
    Thought(String),
    /// A `session/update` whose `update` is this JSON text, written verbatim (escapes as
    /// they are, `\ud800` included, numbers as written: `1.2e3`).
    RawUpdate(String),
    Image,
    Hang,
    HangDeaf,
    Sleep(u64),
    IgnoreEof,
    IgnoreTerm,
    Grandchild,
    /// A sleeper in its own process group that exits after the given milliseconds.
    Escapee(u64),
    Pid,
    Permission,
    Read(String),
    Cwd,
    /// Writes a file through plain `std::fs` in the agent itself (never the client's fs/*).
    Write(String, String),
    Env(Vec<String>),
    Garbage,
    Binary,
    Oversize(usize),
    CloseStdout,
    /// A non-JSON line and, in the same write right behind it, the `end_turn` answer.
    GarbageThenStop,
    /// An `agent_message_chunk` with this text, sent right after the prompt answer in the same
    /// write (so it arrives between turns, deterministically).
    AfterAnswer(String),
    /// A forged `_acpd/subagent/ended` notification with a plausible body.
    ForgeAcpd,
    /// A notification with this method and params `{"sessionId": <own>, "acpdProbe": true}`.
    Notify(String),
    /// An `agent_message_chunk` under another session id.
    ForeignSession(String),
    /// An `agent_message_chunk` whose params have no `sessionId`.
    NoSession,
    /// An `agent_message_chunk` whose params hold two `sessionId` keys: ours, then this one.
    DupSession(String),
    /// A `session/request_permission` whose params are malformed.
    BadPermission,
    /// Stop reading stdin for good while staying alive.
    DeafStdin,
    /// One line per non-text prompt block.
    Blocks,
    /// The auth method this connection authenticated with.
    Auth,
    /// The `_` notifications received so far.
    Ext,
    /// A request with this method to the client.
    ExtRequest(String),
    /// A request to the client with these params (a JSON object, `sessionId` added when it
    /// has none); with `cancel`, followed at once by `$/cancel_request` for it.
    Request {
        method: String,
        params: String,
        cancel: bool,
    },
    /// A notification to the client with exactly these params (JSON).
    NotifyJson {
        method: String,
        params: String,
    },
    /// The `clientCapabilities` the client sent at `initialize`.
    ClientCaps,
    /// The `_meta` the client sent with `session/new`.
    SessionMeta,
    /// `:prompt-meta`: the `_meta` of this turn's `session/prompt`.
    PromptMeta,
    /// A `tool_call` update for the tool `name` with this status, named the way
    /// claude-agent-acp names its tools (`_meta.claudeCode.toolName`).
    ToolCall {
        name: String,
        status: String,
    },
    /// A line of text written to stderr.
    Stderr(String),
    /// `count` lines of `size` bytes written to stderr (blocking, as a real agent would).
    StderrFlood {
        count: u64,
        size: usize,
    },
    /// A subagent session streaming `text`; with `hang`, it then waits for its cancel.
    Subagent {
        text: String,
        hang: bool,
    },
    /// Calls the `delegate` tool of the MCP server named `acpd` that `session/new` offered,
    /// with this prompt (`\n` in the directive stands for a line break).
    Delegate(String),
    /// The same with these arguments, a JSON object as written (a hostile child's `cwd`,
    /// `provider`, `workspace`).
    DelegateJson(String),
}

/// The second `sessionId` of `:dup-session` when none is given.
pub(super) const DUP_SESSION_DEFAULT: &str = "echo-forged";

/// Parses a prompt's text. Every line becomes exactly one step, so echo lines keep their
/// position between directives and the echoed lines concatenate back to the non-directive text.
pub(super) fn parse(text: &str) -> Vec<Step> {
    text.split_inclusive('\n').map(parse_line).collect()
}

fn parse_line(line: &str) -> Step {
    let Some(directive) = line.strip_prefix(':') else {
        return Step::Echo(line.to_string());
    };
    let directive = directive.trim_end_matches('\n').trim_end_matches('\r');
    let (name, rest) = match directive.find(char::is_whitespace) {
        Some(at) => (&directive[..at], directive[at..].trim()),
        None => (directive, ""),
    };
    parse_directive(name, rest).unwrap_or_else(|why| match why {
        Bad::Unknown => Step::Explain(format!("unknown directive: {name}\n")),
        Bad::Args(why) => Step::Explain(format!("malformed directive :{name}: {why}\n")),
    })
}

enum Bad {
    Unknown,
    Args(String),
}

fn parse_directive(name: &str, rest: &str) -> Result<Step, Bad> {
    let step = match name {
        "stop" => Step::Stop(required(rest, "REASON")?),
        "error" => {
            let (code, message) = match rest.find(char::is_whitespace) {
                Some(at) => (&rest[..at], rest[at..].trim()),
                None => (rest, ""),
            };
            let message = if message.is_empty() {
                "scripted error"
            } else {
                message
            };
            Step::Error {
                code: number(code, "CODE")?,
                message: message.to_string(),
            }
        }
        "meta-failure" => Step::MetaFailure(required(rest, "CATEGORY")?),
        "air-failure" => Step::AirFailure(single(rest, "CATEGORY")?),
        "crash" => Step::Crash(number(&single(rest, "CODE")?, "CODE")?),
        "signal" => Step::Signal(signal(&single(rest, "NAME")?)?),
        "chunks" => {
            let [count, size] = exact::<2>(rest, "N SIZE")?;
            Step::Chunks {
                count: number(count, "N")?,
                size: bytes(size, "SIZE")?,
            }
        }
        "timed" => {
            let [count, size, every] = exact::<3>(rest, "N SIZE MS")?;
            Step::Timed {
                count: number(count, "N")?,
                size: bytes(size, "SIZE")?,
                every_ms: number(every, "MS")?,
            }
        }
        "update" => Step::Update(required(rest, "KIND")?),
        "usage" => Step::Usage(number(&single(rest, "TOKENS")?, "TOKENS")?),
        "thought" => Step::Thought(rest.to_string()),
        "raw-update" => Step::RawUpdate(required(rest, "JSON")?),
        "image" => no_args(rest, Step::Image)?,
        "hang" => no_args(rest, Step::Hang)?,
        "hang-deaf" => no_args(rest, Step::HangDeaf)?,
        "sleep" => Step::Sleep(number(&single(rest, "MS")?, "MS")?),
        "ignore-eof" => no_args(rest, Step::IgnoreEof)?,
        "ignore-term" => no_args(rest, Step::IgnoreTerm)?,
        "grandchild" => no_args(rest, Step::Grandchild)?,
        "escapee" => Step::Escapee(number(&single(rest, "MS")?, "MS")?),
        "pid" => no_args(rest, Step::Pid)?,
        "permission" => no_args(rest, Step::Permission)?,
        "read" => Step::Read(required(rest, "PATH")?),
        "cwd" => no_args(rest, Step::Cwd)?,
        "write" => {
            let (path, text) = rest
                .trim()
                .split_once(char::is_whitespace)
                .unwrap_or((rest.trim(), ""));
            if path.is_empty() {
                return Err(Bad::Args("expected PATH TEXT".into()));
            }
            Step::Write(path.to_string(), text.trim_start().to_string())
        }
        "env" => {
            let names: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
            if names.is_empty() {
                return Err(Bad::Args("expected NAME [NAME...]".into()));
            }
            Step::Env(names)
        }
        "garbage" => no_args(rest, Step::Garbage)?,
        "binary" => no_args(rest, Step::Binary)?,
        "oversize" => Step::Oversize(bytes(&single(rest, "BYTES")?, "BYTES")?),
        "close-stdout" => no_args(rest, Step::CloseStdout)?,
        "garbage-then-stop" => no_args(rest, Step::GarbageThenStop)?,
        "after-answer" => Step::AfterAnswer(required(rest, "TEXT")?),
        "forge-acpd" => no_args(rest, Step::ForgeAcpd)?,
        "notify" => Step::Notify(single(rest, "METHOD")?),
        "foreign-session" => Step::ForeignSession(single(rest, "ID")?),
        "no-session" => no_args(rest, Step::NoSession)?,
        "dup-session" => Step::DupSession(if rest.is_empty() {
            DUP_SESSION_DEFAULT.to_string()
        } else {
            single(rest, "[ID]")?
        }),
        "bad-permission" => no_args(rest, Step::BadPermission)?,
        "deaf-stdin" => no_args(rest, Step::DeafStdin)?,
        "blocks" => no_args(rest, Step::Blocks)?,
        "auth" => no_args(rest, Step::Auth)?,
        "ext" => no_args(rest, Step::Ext)?,
        "ext-request" => Step::ExtRequest(single(rest, "METHOD")?),
        "request" | "cancel-request" => {
            let (method, params) = method_and_json(rest)?;
            Step::Request {
                method,
                params,
                cancel: name == "cancel-request",
            }
        }
        "notify-json" => {
            let (method, params) = method_and_json(rest)?;
            Step::NotifyJson { method, params }
        }
        "client-caps" => no_args(rest, Step::ClientCaps)?,
        "session-meta" => no_args(rest, Step::SessionMeta)?,
        "prompt-meta" => no_args(rest, Step::PromptMeta)?,
        "tool-call" => {
            let mut words = rest.split_whitespace();
            let (Some(name), status, None) = (words.next(), words.next(), words.next()) else {
                return Err(Bad::Args("expected NAME [STATUS]".into()));
            };
            Step::ToolCall {
                name: name.to_string(),
                status: status.unwrap_or("completed").to_string(),
            }
        }
        "stderr" => Step::Stderr(rest.to_string()),
        "stderr-flood" => {
            let [count, size] = exact::<2>(rest, "N SIZE")?;
            Step::StderrFlood {
                count: number(count, "N")?,
                size: bytes(size, "SIZE")?,
            }
        }
        "subagent" => Step::Subagent {
            text: rest.to_string(),
            hang: false,
        },
        "subagent-hang" => Step::Subagent {
            text: rest.to_string(),
            hang: true,
        },
        "delegate" => Step::Delegate(required(rest, "PROMPT")?.replace("\\n", "\n")),
        "delegate-json" => match serde_json::from_str::<serde_json::Value>(rest) {
            Ok(serde_json::Value::Object(_)) => Step::DelegateJson(rest.to_string()),
            _ => return Err(Bad::Args(format!("JSON must be an object, got {rest:?}"))),
        },
        _ => return Err(Bad::Unknown),
    };
    Ok(step)
}

/// The rest of the line as one argument, spaces included (categories and paths may hold them).
fn required(rest: &str, what: &str) -> Result<String, Bad> {
    if rest.is_empty() {
        Err(Bad::Args(format!("expected {what}")))
    } else {
        Ok(rest.to_string())
    }
}

/// `METHOD [JSON]`: the method, and the rest of the line, which must be a JSON object
/// (`{}` when absent).
fn method_and_json(rest: &str) -> Result<(String, String), Bad> {
    let (method, json) = match rest.find(char::is_whitespace) {
        Some(at) => (&rest[..at], rest[at..].trim()),
        None => (rest, ""),
    };
    if method.is_empty() {
        return Err(Bad::Args("expected METHOD [JSON]".into()));
    }
    let json = if json.is_empty() { "{}" } else { json };
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(_)) => Ok((method.to_string(), json.to_string())),
        _ => Err(Bad::Args(format!("JSON must be an object, got {json:?}"))),
    }
}

fn single(rest: &str, what: &str) -> Result<String, Bad> {
    let [one] = exact::<1>(rest, what)?;
    Ok(one.to_string())
}

fn exact<'a, const N: usize>(rest: &'a str, what: &str) -> Result<[&'a str; N], Bad> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    words
        .try_into()
        .map_err(|_| Bad::Args(format!("expected {what}, got {rest:?}")))
}

fn no_args(rest: &str, step: Step) -> Result<Step, Bad> {
    if rest.is_empty() {
        Ok(step)
    } else {
        Err(Bad::Args(format!("takes no arguments, got {rest:?}")))
    }
}

fn number<T: FromStr>(word: &str, what: &str) -> Result<T, Bad> {
    word.parse()
        .map_err(|_| Bad::Args(format!("{what} must be an integer, got {word:?}")))
}

fn bytes(word: &str, what: &str) -> Result<usize, Bad> {
    let n: usize = number(word, what)?;
    if n > MAX_BYTES {
        return Err(Bad::Args(format!("{what} must be at most {MAX_BYTES}")));
    }
    Ok(n)
}

/// Accepts `SIGKILL`, `kill` or a signal number, so scripts can name signals either way.
fn signal(word: &str) -> Result<Signal, Bad> {
    if let Ok(n) = word.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| Bad::Args(format!("no signal number {n}")));
    }
    let upper = word.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&name).map_err(|_| Bad::Args(format!("unknown signal {word:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_echoed_line_by_line_verbatim() {
        let text = "hello\r\n\n  :not a directive\nlast without newline";
        let steps = parse(text);
        let echoed: String = steps
            .iter()
            .map(|s| match s {
                Step::Echo(line) => line.as_str(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(echoed, text);
        assert_eq!(steps.len(), 4);
        assert!(parse("").is_empty());
    }

    #[test]
    fn directives_keep_their_position_among_echo_lines() {
        let steps = parse("before\n:chunks 3 10\n:sleep 5\r\nafter\n:stop max_tokens");
        assert_eq!(
            steps,
            vec![
                Step::Echo("before\n".into()),
                Step::Chunks { count: 3, size: 10 },
                Step::Sleep(5),
                Step::Echo("after\n".into()),
                Step::Stop("max_tokens".into()),
            ]
        );
    }

    #[test]
    fn arguments_that_run_to_the_end_of_the_line() {
        assert_eq!(
            parse(":error -32000 quota gone\n:error 7\n:meta-failure Quota Exceeded!\n"),
            vec![
                Step::Error {
                    code: -32000,
                    message: "quota gone".into()
                },
                Step::Error {
                    code: 7,
                    message: "scripted error".into()
                },
                Step::MetaFailure("Quota Exceeded!".into()),
            ]
        );
        assert_eq!(
            parse(":read /tmp/a b.txt\n:thought deep  thoughts\n:thought"),
            vec![
                Step::Read("/tmp/a b.txt".into()),
                Step::Thought("deep  thoughts".into()),
                Step::Thought(String::new()),
            ]
        );
        assert_eq!(
            parse(":env HOME  NOPE\n:update future_kind"),
            vec![
                Step::Env(vec!["HOME".into(), "NOPE".into()]),
                Step::Update("future_kind".into()),
            ]
        );
    }

    #[test]
    fn signals_by_name_short_name_or_number() {
        assert_eq!(
            parse(":signal SIGKILL\n:signal segv\n:signal 15"),
            vec![
                Step::Signal(Signal::SIGKILL),
                Step::Signal(Signal::SIGSEGV),
                Step::Signal(Signal::SIGTERM),
            ]
        );
    }

    #[test]
    fn bad_directives_explain_themselves() {
        let explain = |text: &str| match parse(text).as_slice() {
            [Step::Explain(why)] => why.clone(),
            other => panic!("{text:?} parsed as {other:?}"),
        };
        assert_eq!(
            explain(":frobnicate now\n"),
            "unknown directive: frobnicate\n"
        );
        assert_eq!(explain(":"), "unknown directive: \n");
        assert!(explain(":chunks three 10").starts_with("malformed directive :chunks: N must"));
        assert!(explain(":chunks 3").starts_with("malformed directive :chunks: expected N SIZE"));
        assert!(explain(":crash").contains("expected CODE"));
        assert!(explain(":sleep -1").contains("MS must be an integer"));
        assert!(explain(":usage").contains("expected TOKENS"));
        assert!(explain(":usage many").contains("TOKENS must be an integer"));
        assert_eq!(parse(":usage 1500"), vec![Step::Usage(1500)]);
        assert!(explain(":stop").contains("expected REASON"));
        assert!(explain(":signal SIGNOPE").contains("unknown signal"));
        assert!(explain(":hang now").contains("takes no arguments"));
        assert!(explain(":oversize 99999999999999").contains("at most"));
        assert!(explain(":error x").contains("CODE must be an integer"));
        assert!(explain(":env").contains("expected NAME"));
        assert!(explain(":after-answer").contains("expected TEXT"));
        assert!(explain(":notify").contains("expected METHOD"));
        assert!(explain(":notify a b").contains("expected METHOD"));
        assert!(explain(":foreign-session").contains("expected ID"));
        assert!(explain(":dup-session a b").contains("expected [ID]"));
        assert!(explain(":garbage-then-stop now").contains("takes no arguments"));
        assert!(explain(":deaf-stdin 1").contains("takes no arguments"));
    }

    #[test]
    fn feature_directives() {
        assert_eq!(
            parse(
                ":blocks
:auth
:ext
:ext-request _x/y
:subagent hi  there
:subagent-hang
"
            ),
            vec![
                Step::Blocks,
                Step::Auth,
                Step::Ext,
                Step::ExtRequest("_x/y".into()),
                Step::Subagent {
                    text: "hi  there".into(),
                    hang: false
                },
                Step::Subagent {
                    text: String::new(),
                    hang: true
                },
            ]
        );
        let explain = |text: &str| match parse(text).as_slice() {
            [Step::Explain(why)] => why.clone(),
            other => panic!("{text:?} parsed as {other:?}"),
        };
        assert!(explain(":ext-request").contains("expected METHOD"));
        assert!(explain(":request").contains("expected METHOD"));
        assert!(explain(":request m [1]").contains("must be an object"));
        assert!(explain(":stderr-flood 3").contains("expected N SIZE"));
        assert_eq!(
            parse(":cancel-request x/y {\"a\": 1}\n:request z\n:stderr hi there\n"),
            vec![
                Step::Request {
                    method: "x/y".into(),
                    params: "{\"a\": 1}".into(),
                    cancel: true
                },
                Step::Request {
                    method: "z".into(),
                    params: "{}".into(),
                    cancel: false
                },
                Step::Stderr("hi there".into()),
            ]
        );
        assert!(explain(":blocks x").contains("takes no arguments"));
        assert!(explain(":auth x").contains("takes no arguments"));
    }

    #[test]
    fn hostile_directives() {
        assert_eq!(
            parse(
                "a\n:garbage-then-stop\n:after-answer late  words\n:forge-acpd\n\
                 :notify _acpd/subagent/started\n:foreign-session acpd-7\n:no-session\n\
                 :dup-session\n:dup-session acpd-9\n:bad-permission\n:deaf-stdin\n"
            ),
            vec![
                Step::Echo("a\n".into()),
                Step::GarbageThenStop,
                Step::AfterAnswer("late  words".into()),
                Step::ForgeAcpd,
                Step::Notify("_acpd/subagent/started".into()),
                Step::ForeignSession("acpd-7".into()),
                Step::NoSession,
                Step::DupSession(DUP_SESSION_DEFAULT.into()),
                Step::DupSession("acpd-9".into()),
                Step::BadPermission,
                Step::DeafStdin,
            ]
        );
    }
}
