//! A property test of `acpd stdio`'s router toward a parent, over the real binary and real pipes.
//!
//! Each case starts `acpd stdio` (environment cleared as in `common::base`), writes a generated
//! sequence of lines — requests with odd ids (`1.0`, `1e2`, `-0.5`, 20-digit integers, strings
//! with `\u` escapes), requests with a readable id but a bad field, JSON-RPC batches (arrays),
//! other non-objects, text that is not JSON, lines that are not UTF-8, lines over the 16 MiB cap,
//! notifications, stray responses, blank lines, unknown methods — then a normal `initialize`,
//! and checks:
//! - acpd never exits because of what it read (the closing `initialize` is answered, and acpd
//!   exits 0 once stdin closes);
//! - every line that carries a readable id gets exactly one response, with that id's text byte
//!   for byte (a bad field answered −32600 with that id);
//! - every other bad line gets one error with id null: −32700 for text that is not JSON, not
//!   UTF-8 or over the cap, −32600 for a JSON value that is not a usable message;
//! - notifications, responses and blank lines get nothing.
//!
//! `ACPD_ROUTER_PROPS_CASES` sets the number of cases (default 64, a few seconds here); raise it
//! for a long run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use serde_json::value::RawValue;

/// acpd's default line cap (`acpd_protocol::codec::DEFAULT_MAX_LINE`).
const MAX_LINE: usize = 16 * 1024 * 1024;

/// How a generated request id is written; each is made unique in its sequence by an index.
#[derive(Debug, Clone, Copy)]
enum IdShape {
    Int,
    Negative,
    Fraction,
    Exponent,
    NegativeZeroFraction,
    Huge,
    Plain,
    Unicode,
    Escaped,
    Spaced,
    /// Written as is: for ids that can appear once per sequence (`-0`).
    Literal(&'static str),
}

impl IdShape {
    /// The id as written in the request, and its text as it must come back.
    fn write(self, i: usize) -> (String, String) {
        let text = match self {
            IdShape::Int => format!("{}", 1000 + i),
            IdShape::Negative => format!("-{}", i + 1),
            IdShape::Fraction => format!("{i}.00"),
            IdShape::Exponent => format!("{i}e0"),
            IdShape::NegativeZeroFraction => format!("-0.{i}"),
            IdShape::Huge => format!("1234567890123456789{i:03}"),
            IdShape::Plain => format!("\"p-{i}\""),
            IdShape::Unicode => format!("\"é{i}😀\""),
            IdShape::Escaped => format!("\"\\u0041\\/{i}\\ud83d\\ude00\\\"\""),
            IdShape::Literal(text) => text.to_string(),
            IdShape::Spaced => {
                let text = format!("{}", 5000 + i);
                return (format!(" \t{text} "), text);
            }
        };
        (text.clone(), text)
    }
}

/// A request that must be answered; the params are chosen so that nothing spawns a child.
const METHODS: &[(&str, Option<&str>)] = &[
    (
        "initialize",
        Some(r#"{"protocolVersion":1,"clientCapabilities":{}}"#),
    ),
    ("_acpd/providers", None),
    ("_acpd/providers", Some("{}")),
    ("_acpd/subagent/list", Some("{}")),
    ("_acpd/status", None),
    ("_acpd/runs", Some("{}")),
    ("_acpd/subagent/wait", Some(r#"{"runId":"no-such-run"}"#)),
    ("_acpd/subagent/cancel", Some(r#"{"runId":"no-such-run"}"#)),
    ("_acpd/subagent/dispose", Some(r#"{"runId":"no-such-run"}"#)),
    (
        "_acpd/subagent/send",
        Some(r#"{"runId":"no-such-run","prompt":[]}"#),
    ),
    ("_acpd/subagent/wait", Some(r#"{"runId":7}"#)),
    ("_acpd/subagent/start", Some(r#"{"prompt":"not a list"}"#)),
    ("_acpd/bogus", Some("{}")),
    ("no/such/method", Some("[]")),
    (
        "session/prompt",
        Some(r#"{"sessionId":"acpd-none","prompt":[]}"#),
    ),
    ("session/prompt", Some("{}")),
    (
        "session/load",
        Some(r#"{"sessionId":"x","cwd":"/","mcpServers":[]}"#),
    ),
];

/// An object whose id is readable but which is no valid request: −32600 with that id.
const BAD_FIELD: &[&str] = &[
    r#"{"jsonrpc":"2.0","id":ID,"method":3}"#,
    r#"{"jsonrpc":"1.0","id":ID,"method":"_acpd/providers"}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"_acpd/providers","params":"x"}"#,
    r#"{"jsonrpc":"2.0","id":ID,"method":"_acpd/providers","result":{}}"#,
    r#"{"jsonrpc":"2.0","id":ID}"#,
];

/// JSON values that are not a usable message and have no readable id: −32600, id null.
const INVALID: &[&str] = &[
    r#"["2.0",73,"_acpd/providers",{}]"#,
    r#"[{"jsonrpc":"2.0","id":7,"method":"initialize"}]"#,
    "[]",
    "1",
    r#""{\"id\":1}""#,
    "null",
    "true",
    "{}",
    r#"{"jsonrpc":"2.0","id":null,"method":"_acpd/providers"}"#,
    r#"{"jsonrpc":"2.0","id":{"a":1},"method":"_acpd/providers"}"#,
    r#"{"jsonrpc":"2.0","id":true,"method":"_acpd/providers"}"#,
    r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"_acpd/providers"}"#,
];

/// Text that is not JSON: −32700, id null.
const GARBAGE: &[&str] = &[
    "{not json",
    "}{",
    "hello",
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize""#,
    r#"{"jsonrpc":"2.0","id":1,"method":"x"} trailing"#,
    "[1,",
];

/// Lines that get no answer.
const SILENT: &[&str] = &[
    r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"acpd-none"}}"#,
    r#"{"jsonrpc":"2.0","method":"_x/unknown","params":{}}"#,
    r#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"id":1}}"#,
    r#"{"jsonrpc":"2.0","method":"_acpd/subagent/ended","params":{}}"#,
    r#"{"jsonrpc":"2.0","id":424242,"result":{}}"#,
    r#"{"jsonrpc":"2.0","id":"stray","error":{"code":-1,"message":"x"}}"#,
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
    "",
    "   \t",
];

#[derive(Debug, Clone)]
enum Line {
    Request {
        shape: IdShape,
        method: usize,
        crlf: bool,
    },
    BadField {
        shape: IdShape,
        template: usize,
    },
    Invalid(usize),
    Garbage(usize),
    NotUtf8(Vec<u8>),
    Oversized,
    Silent(usize),
}

fn id_shape() -> impl Strategy<Value = IdShape> {
    prop_oneof![
        Just(IdShape::Int),
        Just(IdShape::Negative),
        Just(IdShape::Fraction),
        Just(IdShape::Exponent),
        Just(IdShape::NegativeZeroFraction),
        Just(IdShape::Huge),
        Just(IdShape::Plain),
        Just(IdShape::Unicode),
        Just(IdShape::Escaped),
        Just(IdShape::Spaced),
    ]
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        8 => (id_shape(), 0..METHODS.len(), any::<bool>())
            .prop_map(|(shape, method, crlf)| Line::Request { shape, method, crlf }),
        2 => (id_shape(), 0..BAD_FIELD.len())
            .prop_map(|(shape, template)| Line::BadField { shape, template }),
        2 => (0..INVALID.len()).prop_map(Line::Invalid),
        2 => (0..GARBAGE.len()).prop_map(Line::Garbage),
        1 => proptest::collection::vec(any::<u8>(), 1..40).prop_map(|mut b| {
            b.retain(|&c| c != b'\n');
            b.push(0xff);
            Line::NotUtf8(b)
        }),
        3 => (0..SILENT.len()).prop_map(Line::Silent),
    ]
}

/// A sequence with at most one oversized line (16 MiB each).
fn sequence() -> impl Strategy<Value = Vec<Line>> {
    (
        proptest::collection::vec(line(), 0..40),
        proptest::option::weighted(0.15, any::<prop::sample::Index>()),
    )
        .prop_map(|(mut lines, big)| {
            if let Some(at) = big {
                let i = at.index(lines.len() + 1);
                lines.insert(i, Line::Oversized);
            }
            lines
        })
}

/// What the sequence must produce.
#[derive(Default)]
struct Expect {
    /// id text → whether the answer must be a −32600 error.
    ids: HashMap<String, bool>,
    parse_errors: usize,
    invalid_requests: usize,
}

fn render(lines: &[Line]) -> (Vec<u8>, Expect) {
    let mut out = Vec::new();
    let mut expect = Expect::default();
    for (i, line) in lines.iter().enumerate() {
        match line {
            Line::Request {
                shape,
                method,
                crlf,
            } => {
                let (written, text) = shape.write(i);
                let (name, params) = METHODS[*method];
                let params = params.map_or(String::new(), |p| format!(r#","params":{p}"#));
                out.extend_from_slice(
                    format!(r#"{{"jsonrpc":"2.0","id":{written},"method":"{name}"{params}}}"#)
                        .as_bytes(),
                );
                if *crlf {
                    out.push(b'\r');
                }
                expect.ids.insert(text, false);
            }
            Line::BadField { shape, template } => {
                let (written, text) = shape.write(i);
                out.extend_from_slice(BAD_FIELD[*template].replace("ID", &written).as_bytes());
                expect.ids.insert(text, true);
            }
            Line::Invalid(k) => {
                out.extend_from_slice(INVALID[*k].as_bytes());
                expect.invalid_requests += 1;
            }
            Line::Garbage(k) => {
                out.extend_from_slice(GARBAGE[*k].as_bytes());
                expect.parse_errors += 1;
            }
            Line::NotUtf8(bytes) => {
                out.extend_from_slice(bytes);
                expect.parse_errors += 1;
            }
            Line::Oversized => {
                // A well-formed request, id included, that is one byte over the cap.
                let head = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"method":"m","params":{{"x":""#,
                    900_000 + i
                );
                let tail = r#""}}"#;
                out.extend_from_slice(head.as_bytes());
                out.resize(out.len() + MAX_LINE + 1 - head.len() - tail.len(), b'a');
                out.extend_from_slice(tail.as_bytes());
                expect.parse_errors += 1;
            }
            Line::Silent(k) => out.extend_from_slice(SILENT[*k].as_bytes()),
        }
        out.push(b'\n');
    }
    (out, expect)
}

const FINAL_ID: &str = r#""final-initialize""#;

/// One response as read back: its id's text and its error code, if any.
struct Reply {
    id: String,
    code: Option<i64>,
    line: String,
}

fn read_reply(line: &str) -> Result<Reply, TestCaseError> {
    let fields: HashMap<String, &RawValue> = serde_json::from_str(line).map_err(|e| {
        TestCaseError::fail(format!(
            "acpd wrote a line that is not an object ({e}): {line}"
        ))
    })?;
    prop_assert_eq!(
        fields.get("jsonrpc").map(|v| v.get()),
        Some(r#""2.0""#),
        "{}",
        line
    );
    prop_assert!(
        fields.contains_key("result") != fields.contains_key("error"),
        "not one response: {}",
        line
    );
    let id = fields
        .get("id")
        .ok_or_else(|| TestCaseError::fail(format!("a response without id: {line}")))?
        .get()
        .to_string();
    let code = match fields.get("error") {
        Some(e) => {
            let e: serde_json::Value = serde_json::from_str(e.get()).unwrap_or_default();
            Some(
                e["code"]
                    .as_i64()
                    .ok_or_else(|| TestCaseError::fail(format!("error without code: {line}")))?,
            )
        }
        None => None,
    };
    Ok(Reply {
        id,
        code,
        line: line.to_string(),
    })
}

fn run_case(lines: &[Line]) -> Result<(), TestCaseError> {
    let (mut input, expect) = render(lines);
    input.extend_from_slice(
        format!(
            r#"{{"jsonrpc":"2.0","id":{FINAL_ID},"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{}}}}}}"#
        )
        .as_bytes(),
    );
    input.push(b'\n');

    let mut child = common::base()
        .arg("stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| TestCaseError::fail(format!("spawn acpd: {e}")))?;
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The writer runs apart so a full pipe in either direction cannot stall the test.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        let ok = stdin.write_all(&input).and_then(|()| stdin.flush());
        // Keep stdin open until told: EOF would end the session.
        let _ = done_rx.recv();
        drop(stdin);
        ok
    });

    let expected_total = expect.ids.len() + expect.parse_errors + expect.invalid_requests + 1;
    let mut replies: Vec<Reply> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while replies.len() < expected_total || !replies.iter().any(|r| r.id == FINAL_ID) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => replies.push(read_reply(&line)?),
            Err(_) => break,
        }
    }
    let answered_final = replies.iter().any(|r| r.id == FINAL_ID);
    let _ = done_tx.send(());
    // Anything more that arrives before EOF is an extra answer.
    let exit_deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match rx.recv_timeout(exit_deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => replies.push(read_reply(&line)?),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                break;
            }
        }
    }
    let wrote = writer.join().expect("writer thread");
    let _ = reader.join();
    let status = child
        .wait()
        .map_err(|e| TestCaseError::fail(format!("wait: {e}")))?;

    prop_assert!(wrote.is_ok(), "acpd stopped reading its input: {:?}", wrote);
    prop_assert!(
        answered_final,
        "the closing initialize was not answered (acpd gone?)"
    );
    prop_assert!(
        status.success(),
        "acpd exited with {} after stdin closed",
        status
    );

    let mut seen: HashMap<&str, &Reply> = HashMap::new();
    let (mut parse_errors, mut invalid_requests) = (0, 0);
    for r in &replies {
        if r.id == "null" {
            match r.code {
                Some(-32700) => parse_errors += 1,
                Some(-32600) => invalid_requests += 1,
                _ => {
                    return Err(TestCaseError::fail(format!(
                        "id null but not -32700/-32600: {}",
                        r.line
                    )));
                }
            }
            continue;
        }
        if let Some(earlier) = seen.insert(&r.id, r) {
            return Err(TestCaseError::fail(format!(
                "two answers for id {}:\n{}\n{}",
                r.id, earlier.line, r.line
            )));
        }
    }
    let final_reply = seen
        .remove(FINAL_ID)
        .ok_or_else(|| TestCaseError::fail("no answer to the closing initialize"))?;
    prop_assert!(
        final_reply.code.is_none(),
        "initialize failed: {}",
        final_reply.line
    );
    prop_assert!(
        final_reply.line.contains(r#""protocolVersion":1"#),
        "{}",
        final_reply.line
    );
    for (id, must_be_invalid) in &expect.ids {
        let Some(r) = seen.remove(id.as_str()) else {
            let got: Vec<&str> = replies.iter().map(|r| r.id.as_str()).collect();
            return Err(TestCaseError::fail(format!(
                "no answer carries id {id}; ids answered: {got:?}"
            )));
        };
        if *must_be_invalid {
            prop_assert_eq!(r.code, Some(-32600), "{}", r.line);
        }
    }
    prop_assert!(
        seen.is_empty(),
        "answers for ids never sent: {:?}",
        seen.keys().collect::<Vec<_>>()
    );
    prop_assert_eq!(
        parse_errors,
        expect.parse_errors,
        "-32700 answers with id null"
    );
    prop_assert_eq!(
        invalid_requests,
        expect.invalid_requests,
        "-32600 answers with id null"
    );
    Ok(())
}

fn cases() -> u32 {
    std::env::var("ACPD_ROUTER_PROPS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

#[test]
fn router_answers_every_line_as_json_rpc_says() {
    let mut runner = proptest::test_runner::TestRunner::new(Config {
        cases: cases(),
        // Each case is a process; shrinking a failure should not take all day.
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&sequence(), |lines| run_case(&lines));
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The lines the issue names, fixed, so they are covered whatever the generator draws.
#[test]
fn named_hostile_lines() {
    let lines = vec![
        Line::Invalid(0),
        Line::Request {
            shape: IdShape::Fraction,
            method: 1,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Exponent,
            method: 1,
            crlf: true,
        },
        Line::Request {
            shape: IdShape::Huge,
            method: 4,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Escaped,
            method: 12,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::NegativeZeroFraction,
            method: 6,
            crlf: false,
        },
        Line::BadField {
            shape: IdShape::Unicode,
            template: 0,
        },
        Line::NotUtf8(vec![b'{', 0xc3, 0x28, b'}']),
        Line::Garbage(3),
        Line::Oversized,
        Line::Silent(0),
        Line::Request {
            shape: IdShape::Spaced,
            method: 0,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Literal("-0"),
            method: 1,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Literal("1e2"),
            method: 1,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Literal("1.0"),
            method: 1,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Literal("12345678901234567890"),
            method: 1,
            crlf: false,
        },
        Line::Request {
            shape: IdShape::Literal(r#""\u0041""#),
            method: 1,
            crlf: false,
        },
    ];
    if let Err(e) = run_case(&lines) {
        panic!("{e}");
    }
}
