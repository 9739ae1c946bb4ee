//! Codec + envelope + session-id helpers, fed arbitrary bytes.
//!
//! Input layout: byte 0 picks the line cap, byte 1 seeds how the rest is cut into reads, the rest
//! is the stream. Asserted: nothing panics; the verdicts do not depend on the cuts; the decoder
//! never buffers more than the cap (+ a pending `\r`) between reads; every line it yields is
//! within the cap, UTF-8 and not blank; every parsed request, notification and response
//! re-encodes to the same message with its id text byte for byte; every envelope error is
//! −32700/−32600 (id null unless the line was an object with a readable id); a spliced
//! `sessionId` leaves exactly one, with every other top-level field unchanged; `envelope::parse`
//! (a single-pass scan) gives every line the verdict serde_json's parse into the six raw
//! envelope fields gives it (the same kind of error, or the same raw fields).
#![no_main]

use std::fmt;

use acpd_protocol::codec::{FrameError, LineDecoder};
use acpd_protocol::envelope::{self, EnvelopeError, Id, Message, RpcError};
use acpd_protocol::session_id::{session_id, splice_session_id, with_session_id};
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let max = match data[0] {
        b @ 0..=127 => usize::from(b % 64),
        b => 256 + usize::from(b),
    };
    let stream = &data[2..];
    let whole = decode(max, stream, None);
    let split = decode(max, stream, Some(data[1]));
    assert_eq!(
        whole, split,
        "verdicts depend on where reads split the stream"
    );
    for item in &whole {
        match item {
            Ok(line) => {
                assert!(line.len() <= max);
                assert!(!line.contains(&b'\n'));
                assert!(std::str::from_utf8(line).is_ok());
                assert!(!line.iter().all(u8::is_ascii_whitespace));
                check_envelope(line);
            }
            Err(FrameError::Oversized { limit }) => assert_eq!(*limit, max),
            Err(FrameError::NotUtf8) => {}
        }
    }
    check_abandon(max, stream, data[1]);
    // The envelope and the helpers also see the raw bytes, cap or not.
    check_envelope(stream);
    check_against_serde(stream);
    if let Ok(text) = std::str::from_utf8(stream) {
        check_id(text);
    }
    if let Ok(text) = std::str::from_utf8(stream)
        && let Ok(raw) = serde_json::from_str::<&RawValue>(text)
    {
        check_session_id(raw);
    }
});

fn decode(max: usize, stream: &[u8], seed: Option<u8>) -> Vec<Result<Bytes, FrameError>> {
    let mut dec = LineDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rng = u32::from(seed.unwrap_or(0)).wrapping_mul(2654435761) | 1;
    let mut rest = stream;
    while !rest.is_empty() {
        let n = match seed {
            None => rest.len(),
            Some(_) => {
                rng ^= rng << 13;
                rng ^= rng >> 17;
                rng ^= rng << 5;
                1 + (rng as usize) % (max + 3).min(rest.len())
            }
        };
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        while let Some(item) = dec.decode(&mut buf) {
            out.push(item);
        }
        assert!(
            buf.len() <= max + 1,
            "{} bytes buffered over a cap of {max}",
            buf.len()
        );
    }
    while let Some(item) = dec.decode_eof(&mut buf) {
        out.push(item);
    }
    assert!(buf.is_empty());
    out
}

/// Lines abandoned at seeded points (a line deadline): no panic, the bound holds, what is
/// yielded is still a well-formed line.
fn check_abandon(max: usize, stream: &[u8], seed: u8) {
    let mut dec = LineDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut rng = u32::from(seed).wrapping_mul(2246822519) | 1;
    for chunk in stream.chunks(1 + usize::from(seed % 7)) {
        buf.extend_from_slice(chunk);
        while let Some(item) = dec.decode(&mut buf) {
            if let Ok(line) = item {
                assert!(line.len() <= max && std::str::from_utf8(&line).is_ok());
            }
        }
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        if rng % 4 == 0 {
            let had = !buf.is_empty();
            let dropped = dec.abandon_partial(&mut buf);
            assert!(!dropped || had);
            if dropped {
                assert!(buf.is_empty() && dec.in_line(&buf));
            }
        }
        assert!(buf.len() <= max + 1);
    }
    while let Some(item) = dec.decode_eof(&mut buf) {
        if let Ok(line) = item {
            assert!(line.len() <= max);
        }
    }
}

/// `Id::from_json` on any text: an id it accepts is written back as that text, trimmed.
fn check_id(text: &str) {
    if let Ok(Some(id)) = Id::from_json(text) {
        let trimmed = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        assert_eq!(id.to_json(), trimmed);
        let raw = RawValue::from_string(trimmed.to_string()).expect("an accepted id is JSON");
        assert!(matches!(raw.get().as_bytes()[0], b'"' | b'-' | b'0'..=b'9'));
        assert_eq!(Id::from_json(&id.to_json()), Ok(Some(id.clone())));
        let back: Id = serde_json::from_str(&serde_json::to_string(&id).unwrap()).unwrap();
        assert_eq!(back, id);
    }
}

fn is_ws(b: &u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The `id` member's text, read independently of `envelope::parse`.
fn id_text(line: &[u8]) -> Option<String> {
    let fields = fields(std::str::from_utf8(line).ok()?)?;
    let ids: Vec<_> = fields.iter().filter(|(k, _)| k == "id").collect();
    assert!(ids.len() <= 1, "a parsed message had two ids");
    ids.first().map(|(_, v)| v.get().to_string())
}

fn reparse(out: &[u8]) -> Message {
    match envelope::parse(out) {
        Ok(m) => m,
        Err(e) => panic!(
            "acpd's own encoding does not parse: {e}: {}",
            String::from_utf8_lossy(out)
        ),
    }
}

fn assert_response_id(out: &[u8], id: Option<&Id>) {
    let Message::Response { id: back, .. } = reparse(out) else {
        panic!("not a response")
    };
    assert_eq!(back.as_ref(), id);
    let text = id_text(out).expect("a response has an id");
    assert_eq!(text, id.map_or("null".into(), |i| i.to_json().into_owned()));
}

fn check_envelope(line: &[u8]) {
    let first = line.iter().find(|b| !is_ws(b)).copied();
    let null = RawValue::from_string("null".into()).unwrap();
    match envelope::parse(line) {
        Ok(msg) => {
            assert_eq!(first, Some(b'{'), "a non-object parsed as a message");
            match msg {
                Message::Request { id, method, params } => {
                    let sent = id_text(line).expect("a request has an id");
                    assert_eq!(id.to_json(), sent.as_str());
                    let out = envelope::encode_result(&id, &null);
                    assert_response_id(&out, Some(&id));
                    assert_eq!(id_text(&out).unwrap(), sent, "id not echoed byte for byte");
                    let out = envelope::encode_error(Some(&id), &RpcError::internal("x"));
                    assert_eq!(id_text(&out).unwrap(), sent);
                    let out = envelope::encode_request(&id, &method, params.as_deref());
                    let Message::Request {
                        id: i2,
                        method: m2,
                        params: p2,
                    } = reparse(&out)
                    else {
                        panic!("request did not re-encode as a request")
                    };
                    assert_eq!((i2, m2), (id, method));
                    assert_eq!(
                        p2.as_ref().map(|p| p.get()),
                        params.as_ref().map(|p| p.get())
                    );
                    if let Some(p) = &params {
                        assert!(matches!(p.get().as_bytes()[0], b'{' | b'['));
                        check_session_id(p);
                    }
                }
                Message::Notification { method, params } => {
                    assert!(id_text(line).is_none());
                    let out = envelope::encode_notification(&method, params.as_deref());
                    if let Some(p) = &params {
                        assert_eq!(out, envelope::encode_notification_text(&method, p.get()));
                        check_session_id(p);
                    }
                    let Message::Notification {
                        method: m2,
                        params: p2,
                    } = reparse(&out)
                    else {
                        panic!("notification did not re-encode as one")
                    };
                    assert_eq!(m2, method);
                    assert_eq!(
                        p2.as_ref().map(|p| p.get()),
                        params.as_ref().map(|p| p.get())
                    );
                }
                Message::Response { id, outcome } => {
                    let sent = id_text(line).expect("a response has an id");
                    assert_eq!(
                        id.as_ref().map_or("null".into(), |i| i.to_json()),
                        sent.as_str()
                    );
                    let out = match (&outcome, &id) {
                        (Ok(result), Some(id)) => envelope::encode_result(id, result),
                        // acpd never answers a result to id null.
                        (Ok(_), None) => return,
                        (Err(e), _) => envelope::encode_error(id.as_ref(), e),
                    };
                    assert_response_id(&out, id.as_ref());
                    assert_eq!(id_text(&out).unwrap(), sent);
                }
            }
        }
        Err(e) => {
            let code = e.to_rpc_error().code;
            match &e {
                EnvelopeError::NotJson(_) => assert_eq!(code, envelope::PARSE_ERROR),
                EnvelopeError::Invalid { .. } => assert_eq!(code, envelope::INVALID_REQUEST),
            }
            if first != Some(b'{') {
                assert!(e.id().is_none(), "a non-object line kept an id");
            }
            if let Some(id) = e.id() {
                let sent = id_text(line).expect("an error's id came from the line");
                assert_eq!(id.to_json(), sent.as_str());
            }
            assert_response_id(&envelope::encode_error(e.id(), &e.to_rpc_error()), e.id());
        }
    }
}

fn check_session_id(params: &RawValue) {
    let text = params.get();
    let input = fields(text);
    let count = |f: &[(String, &RawValue)]| f.iter().filter(|(k, _)| k == "sessionId").count();
    if let Some(sid) = session_id(params) {
        let f = input.as_ref().expect("a session id came from an object");
        assert_eq!(count(f), 1);
        let value = &f.iter().find(|(k, _)| k == "sessionId").unwrap().1;
        assert_eq!(serde_json::from_str::<String>(value.get()).unwrap(), sid);
    }
    for to in ["acpd-1", "é\"\\\u{1}\u{2028}"] {
        let out = splice_session_id(text, to);
        assert_eq!(
            with_session_id(params, to).map(|r| r.get().to_string()),
            out.clone()
        );
        match out {
            Some(out) => {
                let f_in = input.as_ref().expect("spliced a non-object");
                assert_eq!(
                    count(f_in),
                    1,
                    "spliced params with {} sessionId keys",
                    count(f_in)
                );
                let f_out = fields(&out).expect("splice produced no JSON object");
                assert_eq!(f_in.len(), f_out.len());
                for ((ki, vi), (ko, vo)) in f_in.iter().zip(&f_out) {
                    assert_eq!(ki, ko);
                    if ki == "sessionId" {
                        assert_eq!(serde_json::from_str::<String>(vo.get()).unwrap(), to);
                    } else {
                        assert_eq!(vi.get(), vo.get());
                    }
                }
                let raw = RawValue::from_string(out).expect("splice produced invalid JSON");
                assert_eq!(session_id(&raw).as_deref(), Some(to));
            }
            None => {
                if let Some(f) = &input {
                    assert_ne!(count(f), 1, "a sole sessionId was not spliced: {text}");
                }
            }
        }
    }
}

/// The top-level members of an object, keys decoded, values raw, in order, duplicates kept.
fn fields(text: &str) -> Option<Vec<(String, &RawValue)>> {
    use serde::Deserializer;
    use serde::de::{MapAccess, Visitor};
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<(String, &'de RawValue)>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let v = (&mut de).deserialize_map(V).ok()?;
    de.end().ok()?;
    Some(v)
}

/// The scan's verdict is serde_json's (`envelope::oracle`): not JSON exactly when serde_json
/// says so, a doubled envelope key refused as an invalid request, and a parsed message's raw
/// fields the ones serde_json found, at the same bytes of the line.
fn check_against_serde(line: &[u8]) {
    if let Some(why) = envelope::oracle::disagreement(line) {
        panic!("scan and serde_json disagree on {why}");
    }
}
