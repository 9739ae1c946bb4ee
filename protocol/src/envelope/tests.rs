use super::*;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

#[test]
fn classifies_requests_notifications_and_responses() {
    let m =
        parse(br#"{"jsonrpc":"2.0","id":"a-1","method":"session/prompt","params":{"x":[1,2]}}"#)
            .unwrap();
    let Message::Request { id, method, params } = m else {
        panic!("{m:?}")
    };
    assert_eq!(id, Id::Str("a-1".into()));
    assert_eq!(method, "session/prompt");
    assert_eq!(params.unwrap().get(), r#"{"x":[1,2]}"#);

    let m = parse(br#"{"jsonrpc":"2.0","method":"session/update","params":{"u":1}}"#).unwrap();
    assert!(matches!(m, Message::Notification { .. }));

    let m = parse(br#"{"jsonrpc":"2.0","id":7,"result":null}"#).unwrap();
    let Message::Response { id, outcome } = m else {
        panic!()
    };
    assert_eq!(id, Some(Id::Num(7)));
    assert_eq!(outcome.unwrap().get(), "null");

    let m = parse(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#).unwrap();
    let Message::Response { id, outcome } = m else {
        panic!()
    };
    assert_eq!(id, None);
    assert_eq!(outcome.unwrap_err().code, -32700);
}

#[test]
fn malformed_lines_are_typed() {
    assert!(matches!(
        parse(b"{not json"),
        Err(EnvelopeError::NotJson(_))
    ));
    assert!(matches!(
        parse(b"[1,2]"),
        Err(EnvelopeError::Invalid { .. })
    ));
    let e = parse(br#"{"jsonrpc":"1.0","id":3,"method":"x"}"#).unwrap_err();
    assert_eq!(e.id(), Some(&Id::Num(3)));
    assert_eq!(e.to_rpc_error().code, INVALID_REQUEST);
    assert!(parse(br#"{"id":3,"method":"x","params":5}"#).is_err());
    assert!(parse(br#"{"id":{"a":1},"method":"x"}"#).is_err());
    assert!(parse(br#"{"id":1}"#).is_err());
    assert_eq!(
        parse(b"{oops").unwrap_err().to_rpc_error().code,
        PARSE_ERROR
    );
}

#[test]
fn raw_params_round_trip_byte_for_byte() {
    let params =
        r#"{"sessionId":"s","update":{"sessionUpdate":"future_kind","weird":[1,{"a":null}]}}"#;
    let line = format!(r#"{{"jsonrpc":"2.0","method":"session/update","params":{params}}}"#);
    let Message::Notification { method, params: p } = parse(line.as_bytes()).unwrap() else {
        panic!()
    };
    let out = encode_notification(&method, p.as_deref());
    assert_eq!(String::from_utf8(out).unwrap(), line);
}

#[test]
fn text_notification_matches_the_serde_encoding() {
    let raw = RawValue::from_string(r#"{"a":[1,"x"]}"#.into()).unwrap();
    assert_eq!(
        encode_notification_text("m/x", raw.get()),
        encode_notification("m/x", Some(&raw))
    );
}

#[test]
fn limit_errors_carry_the_contract_data() {
    let out = encode_error(None, &RpcError::limit("max_connections", 64));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-33013,"message":"Limit reached: max_connections is 64","data":{"code":"LIMIT","limit":"max_connections","value":64}}}"#
    );
    let e = RpcError::from_frame(&crate::codec::FrameError::Oversized { limit: 16 });
    assert_eq!(e.code, PARSE_ERROR);
    assert_eq!(
        e.data_value(),
        Some(serde_json::json!({"limit": "max_line", "value": 16}))
    );
    let e = RpcError::from_frame(&crate::codec::FrameError::NotUtf8);
    assert_eq!((e.code, e.data_value()), (PARSE_ERROR, None));
    let e = RpcError::line_timeout();
    assert_eq!(e.code, PARSE_ERROR);
    assert_eq!(
        e.data_value(),
        Some(serde_json::json!({"limit": "line_timeout"}))
    );
}

#[test]
fn error_response_with_null_id() {
    let out = encode_error(None, &RpcError::parse_error("x"));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(v["id"].is_null());
    assert_eq!(v["error"]["code"], -32700);
}

/// A peer's error passes on as it was written: `data` byte for byte (big and exponent numbers,
/// escapes, an explicit `null`), and no `data` stays none.
#[test]
fn an_errors_data_is_passed_on_as_written() {
    /// The error of `line` (an error response), and the line encoded again from it.
    fn again(line: &str) -> (RpcError, String) {
        let Ok(Message::Response {
            id,
            outcome: Err(e),
        }) = parse(line.as_bytes())
        else {
            panic!("{line}")
        };
        let out = String::from_utf8(encode_error(id.as_ref(), &e)).unwrap();
        (e, out)
    }
    for data in [
        r#"{"n":12345678901234567890123,"e":1e2,"s":"\u00e9","z":-0}"#,
        "null",
        r#"[ 1.0 , "\/" ]"#,
        "0.1e-400",
    ] {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":2,"error":{{"code":-32603,"message":"m","data":{data}}}}}"#
        );
        let (e, out) = again(&line);
        assert_eq!(e.data.as_deref().map(RawValue::get), Some(data));
        assert_eq!(out, line);
    }
    let line = r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"m"}}"#;
    let (e, out) = again(line);
    assert!(e.data.is_none() && e.data_value().is_none());
    assert_eq!(out, line);
}

/// The id's text as it appears in an encoded line (`"id":<text>`).
fn id_text(line: &[u8]) -> String {
    let v: &RawValue =
        serde_json::from_slice::<std::collections::HashMap<&str, &RawValue>>(line).unwrap()["id"];
    v.get().to_string()
}

const ODD_IDS: &[&str] = &[
    "1.0",
    "1e2",
    "1E+2",
    "-0",
    "-0.0",
    "12345678901234567890",
    "-9223372036854775809",
    "9223372036854775807",
    "-9223372036854775808",
    "0",
    "1.5e-300",
    "1e400",
    r#""\u0041""#,
    r#""\/""#,
    r#""a\"b""#,
    r#""\ud83d\ude00""#,
    r#""😀""#,
    r#""""#,
    r#""\u0000""#,
    r#""\ud800""#,
];

#[test]
fn odd_ids_are_echoed_byte_for_byte() {
    for text in ODD_IDS {
        let line = format!(r#"{{"jsonrpc":"2.0","id":{text},"method":"m"}}"#);
        let Message::Request { id, .. } = parse(line.as_bytes()).unwrap() else {
            panic!("{line}")
        };
        assert_eq!(id.to_json(), *text);
        let raw = RawValue::from_string("{}".into()).unwrap();
        assert_eq!(id_text(&encode_result(&id, &raw)), *text, "{line}");
        assert_eq!(
            id_text(&encode_error(Some(&id), &RpcError::internal("x"))),
            *text
        );
        // The same text read through serde (as a field of a typed struct) is the same id.
        let again: Id = serde_json::from_str(text).unwrap();
        assert_eq!(again, id);
    }
}

#[test]
fn ids_inside_typed_bodies_keep_their_text() {
    // A typed struct holding an id (such as a cancel request naming one) reads and writes it
    // exactly too.
    #[derive(Serialize, Deserialize)]
    struct Ref {
        id: Id,
    }
    for text in ODD_IDS {
        let json = format!(r#"{{"id":{text}}}"#);
        let r: Ref = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
    }
    assert!(serde_json::from_str::<Ref>(r#"{"id":null}"#).is_err());
    assert!(serde_json::from_str::<Ref>(r#"{"id":[1]}"#).is_err());
}

#[test]
fn canonical_ids_keep_their_typed_variants() {
    assert_eq!(Id::from_json("7"), Ok(Some(Id::Num(7))));
    assert_eq!(Id::from_json(" -3 "), Ok(Some(Id::Num(-3))));
    assert_eq!(Id::from_json(r#""a-1""#), Ok(Some(Id::Str("a-1".into()))));
    assert_eq!(Id::from_json(r#""a\"b""#), Ok(Some(Id::Str("a\"b".into()))));
    assert_eq!(Id::from_json(r#""é""#), Ok(Some(Id::Str("é".into()))));
    assert_eq!(Id::from_json("null"), Ok(None));
    assert!(matches!(Id::from_json("-0"), Ok(Some(Id::Raw(_)))));
    assert!(matches!(Id::from_json("1.0"), Ok(Some(Id::Raw(_)))));
    assert!(matches!(Id::from_json(r#""\u0041""#), Ok(Some(Id::Raw(_)))));
    for bad in [
        "true", "{}", "[1]", "", "1 2", "1.", "\"a", "nul", "+1", "01", "\"\n\"",
    ] {
        assert_eq!(Id::from_json(bad), Err(IdError::WrongType), "{bad:?}");
    }
    // Two spellings of one string are two ids; a peer's `7` is acpd's `Id::Num(7)`.
    assert_ne!(Id::from_json(r#""\u0041""#), Id::from_json(r#""A""#));
    let mut pending = std::collections::HashMap::new();
    pending.insert(Id::Num(7), "call");
    let Message::Response { id, .. } = parse(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(pending.get(&id.unwrap()), Some(&"call"));
}

#[test]
fn arrays_and_scalars_are_invalid_requests_with_no_id() {
    for line in [
        r#"["2.0",73,"_acpd/providers",{}]"#,
        r#"[{"jsonrpc":"2.0","id":1,"method":"initialize"}]"#,
        "[]",
        " [1]",
        "1",
        r#""{\"id\":1}""#,
        "null",
        "true",
    ] {
        let e = parse(line.as_bytes()).unwrap_err();
        assert!(
            matches!(e, EnvelopeError::Invalid { id: None, .. }),
            "{line}: {e:?}"
        );
        assert_eq!(e.to_rpc_error().code, INVALID_REQUEST, "{line}");
    }
    for line in ["[1,", "[1]]", "{", "{}}", "\u{feff}{}", "", "   "] {
        let e = parse(line.as_bytes()).unwrap_err();
        assert_eq!(e.to_rpc_error().code, PARSE_ERROR, "{line}: {e:?}");
        assert_eq!(e.id(), None);
    }
    // Leading JSON whitespace before an object is fine.
    assert!(matches!(
        parse(b" \t{\"id\":1,\"method\":\"m\"}"),
        Ok(Message::Request { .. })
    ));
}

#[test]
fn a_member_written_null_where_json_rpc_has_none_is_absent() {
    let m = parse(br#"{"jsonrpc":"2.0","id":2,"result":{"a":1},"error":null}"#).unwrap();
    assert!(
        matches!(&m, Message::Response { outcome: Ok(r), .. } if r.get() == r#"{"a":1}"#),
        "{m:?}"
    );
    let m = parse(br#"{"jsonrpc":"2.0","id":2,"result":null,"error":{"code":1,"message":"m"}}"#)
        .unwrap();
    assert!(
        matches!(&m, Message::Response { outcome: Err(e), .. } if e.message == "m"),
        "{m:?}"
    );
    let m = parse(br#"{"jsonrpc":"2.0","method":"_x/n","params":null}"#).unwrap();
    assert!(
        matches!(&m, Message::Notification { params: None, .. }),
        "{m:?}"
    );
    // `null` alone is still a result, and so is `null` beside an `"error": null`.
    let m = parse(br#"{"jsonrpc":"2.0","id":2,"result":null}"#).unwrap();
    assert!(
        matches!(&m, Message::Response { outcome: Ok(r), .. } if r.get() == "null"),
        "{m:?}"
    );
    assert!(parse(br#"{"jsonrpc":"2.0","id":2,"result":null,"error":null}"#).is_ok());
    // An error without its message is still the peer's error.
    let m = parse(br#"{"jsonrpc":"2.0","id":2,"error":{"code":-32603}}"#).unwrap();
    assert!(
        matches!(&m, Message::Response { outcome: Err(e), .. } if e.code == -32603 && e.message.is_empty()),
        "{m:?}"
    );
}

#[test]
fn a_bad_field_keeps_the_readable_id() {
    for line in [
        r#"{"jsonrpc":"2.0","id":5,"method":3}"#,
        r#"{"jsonrpc":2,"id":5,"method":"m"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"m","params":"x"}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"m","result":1}"#,
        r#"{"jsonrpc":"2.0","id":5,"error":[1,"x"]}"#,
        r#"{"jsonrpc":"2.0","id":5,"error":{"code":"x","message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":5,"result":1,"error":{"code":1,"message":"m"}}"#,
        r#"{"jsonrpc":"2.0","id":5}"#,
    ] {
        let e = parse(line.as_bytes()).unwrap_err();
        assert_eq!(e.id(), Some(&Id::Num(5)), "{line}");
        assert_eq!(e.to_rpc_error().code, INVALID_REQUEST, "{line}");
    }
    // Duplicate keys: which id is meant is unknowable, so none is used.
    let e = parse(br#"{"id":1,"id":2,"method":"m"}"#).unwrap_err();
    assert!(matches!(e, EnvelopeError::Invalid { id: None, .. }));
    // However the second key is spelled, and whichever envelope key is doubled.
    for line in [
        r#"{"id":1,"id":2,"method":"m"}"#,
        r#"{"id":1,"method":"a","method":"b"}"#,
        r#"{"id":1,"method":"m","params":{"sessionId":"a"},"params":{"sessionId":"b"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{},"result":{}}"#,
    ] {
        let e = parse(line.as_bytes()).unwrap_err();
        assert!(
            matches!(e, EnvelopeError::Invalid { id: None, .. }),
            "{line}"
        );
        let rpc = e.to_rpc_error();
        assert_eq!(rpc.code, INVALID_REQUEST, "{line}");
        assert!(
            rpc.message.contains("appear once"),
            "{line}: {}",
            rpc.message
        );
    }
    let e = parse(br#"{"id":null,"method":"m"}"#).unwrap_err();
    assert!(matches!(e, EnvelopeError::Invalid { id: None, .. }));
    let e = parse(br#"{"id":true,"method":"m"}"#).unwrap_err();
    assert!(matches!(e, EnvelopeError::Invalid { id: None, .. }));
}

#[test]
fn non_utf8_anywhere_is_a_parse_error() {
    // Found by the fuzz target: serde_json skipped an unknown field's bytes unchecked, so
    // this was a request.
    let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"x\":{\"a\x9e\x9e\":1}}";
    let e = parse(line).unwrap_err();
    assert!(matches!(e, EnvelopeError::NotJson(_)), "{e:?}");
    assert_eq!(e.to_rpc_error().code, PARSE_ERROR);
    assert!(parse(b"[\"\xff\"]").is_err_and(|e| e.to_rpc_error().code == PARSE_ERROR));
}

#[test]
fn escaped_method_names_are_decoded() {
    let Message::Request { method, .. } = parse(br#"{"id":1,"method":"session\/prompt"}"#).unwrap()
    else {
        panic!()
    };
    assert_eq!(method, "session/prompt");
    assert!(parse(br#"{"jsonrpc":"2\u002e0","id":1,"method":"m"}"#).is_ok());
}

fn json_number() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        "(0|[1-9][0-9]{0,30})",
        proptest::option::of("[0-9]{1,20}"),
        proptest::option::of(("[eE]", "[+-]?", "[0-9]{1,3}")),
    )
        .prop_map(|(neg, int, frac, exp)| {
            let mut s = String::new();
            if neg {
                s.push('-');
            }
            s.push_str(&int);
            if let Some(f) = frac {
                s.push('.');
                s.push_str(&f);
            }
            if let Some((e, sign, d)) = exp {
                s.push_str(&e);
                s.push_str(&sign);
                s.push_str(&d);
            }
            s
        })
}

fn json_string_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z0-9 _.:-]{1,4}",
        Just("\\\"".to_string()),
        Just("\\\\".to_string()),
        Just("\\/".to_string()),
        Just("\\n".to_string()),
        Just("\\b".to_string()),
        "\\\\u[0-9a-fA-F]{4}".prop_filter("no surrogates", |s| {
            !matches!(u16::from_str_radix(&s[2..], 16), Ok(0xd800..=0xdfff))
        }),
        any::<char>()
            .prop_filter("literal", |c| *c >= ' ' && *c != '"' && *c != '\\')
            .prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|v| format!("\"{}\"", v.concat()))
}

proptest! {
    /// Whatever number or string a parent uses as an id, the answer carries the same text.
    #[test]
    fn any_id_text_round_trips(
        text in prop_oneof![json_number(), json_string_text(), any::<i64>().prop_map(|n| n.to_string())],
        ws in "[ \t]{0,2}",
    ) {
        let line = format!(r#"{{"jsonrpc":"2.0","id":{ws}{text}{ws},"method":"m","params":{{}}}}"#);
        let Ok(Message::Request { id, .. }) = parse(line.as_bytes()) else {
            return Err(TestCaseError::fail(format!("not a request: {line}")));
        };
        let raw = RawValue::from_string("null".into()).unwrap();
        prop_assert_eq!(id_text(&encode_result(&id, &raw)), text.clone());
        prop_assert_eq!(id.to_json(), text.clone());
        let reparsed = parse(&encode_result(&id, &raw)).unwrap();
        let Message::Response { id: Some(back), .. } = reparsed else {
            return Err(TestCaseError::fail("not a response"));
        };
        prop_assert_eq!(back, id);
    }

    /// acpd's own numeric ids survive a peer echoing them.
    #[test]
    fn own_numeric_ids_match_the_echo(n in any::<i64>()) {
        let out = encode_request(&Id::Num(n), "m", None);
        let Ok(Message::Request { id, .. }) = parse(&out) else {
            return Err(TestCaseError::fail("not a request"));
        };
        prop_assert_eq!(id, Id::Num(n));
    }

    /// Any JSON value that is not an object is −32600 with no id.
    #[test]
    fn non_objects_are_invalid_requests(v in json_value(3)) {
        let text = serde_json::to_string(&v).unwrap();
        let r = parse(text.as_bytes());
        if v.is_object() {
            prop_assert!(r.is_ok() || r.as_ref().is_err_and(|e| e.to_rpc_error().code == INVALID_REQUEST));
        } else {
            let e = r.unwrap_err();
            prop_assert_eq!(e.to_rpc_error().code, INVALID_REQUEST);
            prop_assert!(e.id().is_none());
        }
    }

    /// Arbitrary bytes never panic and are typed.
    #[test]
    fn random_lines_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse(&bytes);
    }
}

fn json_value(depth: u32) -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-z]{0,5}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(depth, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("id".to_string()),
                    Just("method".to_string()),
                    "[a-z]{1,3}".prop_map(String::from)
                ],
                inner,
                0..4
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn parse_ref_borrows_from_the_line_and_agrees_with_parse() {
    let line =
        br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}}}"#;
    let Ok(MessageRef::Notification { method, params }) = parse_ref(line) else {
        panic!("a notification");
    };
    assert!(matches!(
        method,
        std::borrow::Cow::Borrowed("session/update")
    ));
    let params = params.unwrap().get();
    let range = line.as_ptr_range();
    assert!(
        range.contains(&params.as_ptr()),
        "the params are the line's own bytes"
    );
    assert_eq!(params, r#"{"sessionId":"s","update":{}}"#);
    // An escaped method is decoded; every verdict is parse's.
    let Ok(MessageRef::Request { method, .. }) =
        parse_ref(br#"{"id":1,"method":"session\/prompt"}"#)
    else {
        panic!("a request");
    };
    assert_eq!(method, "session/prompt");
    for bad in [
        &br#"{"id":1,"id":2,"method":"m"}"#[..],
        b"{oops",
        b"[1]",
        br#"{"jsonrpc":"1.0","method":"m"}"#,
    ] {
        assert_eq!(
            parse_ref(bad).unwrap_err().to_rpc_error().code,
            parse(bad).unwrap_err().to_rpc_error().code
        );
    }
}
