//! The single-pass scan held to serde_json: every line here, hand-picked or mutated at random,
//! gets the same verdict from `parse_ref` as from the serde_json parse it replaced (the oracle).

use super::oracle::{TYPICAL_UPDATE as UPDATE, disagreement};
use super::*;

fn assert_agree(line: &[u8]) {
    if let Some(why) = disagreement(line) {
        panic!("scan and serde_json disagree on {why}");
    }
}

/// Valid messages the random cases start from.
const SEEDS: &[&str] = &[
    UPDATE,
    r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"hi \"there\"\n\t\\ \/"}]}}"#,
    r#"{"jsonrpc":"2.0","id":"a-1","result":{"stopReason":"end_turn","_meta":{"x":[1,-2.5e3,0,true,false,null]}}}"#,
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error","data":{"n":1E+2}}}"#,
    r#" { "jsonrpc" : "2.0" , "method" : "m" , "params" : [ 1 , { } , [ ] , "é😀" ] } "#,
    r#"{"\u006asonrpc":"2.0","i\u0064":7,"method":"session\/update","params":{"k\ud83d\ude00":"\ud800"}}"#,
    r#"{"jsonrpc":"2.0","id":3,"method":"x","params":{"a":{"b":{"c":[[[[{"d":-0.0e-0}]]]]}}},"extra":"\u0000"}"#,
    // Routing keys in every place they count: beside and below the top-level `sessionId`.
    r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"x","toolSessionId":"a","sessionId":"b","update":1},"sessionId":"s","parentSessionId":"p","SessionId":0}}"#,
    r#"{"method":"session/update","params":{"sessionId":7,"a":[{"sessionUpdate":"y"},"sessionId"],"x":"update","sessionId":"s"}}"#,
];

#[test]
fn tricky_lines_get_the_same_verdict() {
    let mut lines: Vec<Vec<u8>> = [
        "",
        " ",
        "\t\r\n",
        "\0",
        "{}",
        "[]",
        "[1,2]",
        "1",
        "\"x\"",
        "null",
        "nul",
        "tru",
        "{",
        "}",
        "{\"id\":1",
        "{\"id\":1,",
        "{\"id\":1,}",
        "{,}",
        "{\"id\" 1}",
        "{\"id\":}",
        "{1:2}",
        "{\"id\":1}x",
        "{\"id\":1} ",
        "{\"id\":1}\n",
        "{\"id\":1}\r\n",
        "{\"id\":1}{}",
        "\u{feff}{\"id\":1,\"method\":\"m\"}",
        "{\"id\":1,\"id\":2,\"method\":\"m\"}",
        "{\"id\":1,\"i\\u0064\":2,\"method\":\"m\"}",
        "{\"id\":1,\"\\u0069\\u0064\":2}",
        "{\"method\":\"m\",\"method\":\"m\"}",
        "{\"params\":{},\"par\\u0061ms\":[],\"method\":\"m\"}",
        "{\"result\":1,\"result\":1,\"id\":1}",
        "{\"error\":1,\"err\\u006Fr\":1,\"id\":1}",
        "{\"jsonrpc\":\"2.0\",\"js\\u006frpc\":\"2.0\",\"method\":\"m\"}",
        "{\"id\":1,\"id\":2, garbage",
        "{\"id\":1,\"id\"",
        "{\"id\":1,\"method\":\"m\",\"x\":1,\"x\":2}",
        "{\"method\":\"m\",\"params\":{\"a\":1,\"a\":2}}",
        "{\"method\":\"\\ud800\"}",
        "{\"method\":\"m\",\"params\":[\"\\ud800\"]}",
        "{\"method\":\"m\",\"params\":[\"\\udc00\\ud800\"]}",
        "{\"method\":\"m\",\"params\":[\"\\ud83d\\ude00\"]}",
        "{\"method\":\"m\",\"\\ud800\":1}",
        "{\"method\":\"m\",\"\\udc00\":1}",
        "{\"method\":\"m\",\"\\ud800\\u0041\":1}",
        "{\"method\":\"m\",\"\\ud800\\n\":1}",
        "{\"method\":\"m\",\"\\ud800x\":1}",
        "{\"method\":\"m\",\"\\ud83d\\ude00\":1}",
        "{\"method\":\"m\",\"\\ud800\\ud800\":1}",
        "{\"method\":\"m\",\"params\":{\"\\ud800\":1}}",
        "[{\"\\ud800\":1}]",
        "{\"method\":\"m\",\"params\":[\"\\u00\"]}",
        "{\"method\":\"m\",\"params\":[\"\\u00g0\"]}",
        "{\"method\":\"m\",\"params\":[\"\\x\"]}",
        "{\"method\":\"m\",\"params\":[\"\\u0000\"]}",
        "{\"method\":\"m\\u0000\"}",
        "{\"method\":\"m\",\"params\":[\"\u{1}\"]}",
        "{\"method\":\"m\",\"params\":[\"\u{1f}\"]}",
        "{\"method\":\"m\",\"params\":[\"\u{7f}\"]}",
        "{\"method\":\"m\",\"params\":[\"\0\"]}",
        "{\"method\":\"m\",\"params\":[\"\t\"]}",
        "{\"method\":\"m\",\"params\":[\"a",
        "{\"method\":\"m\",\"params\":[\"a\\",
        "{\"method\":\"m\",\"params\":[\"\\u12",
        "{\"me\0thod\":\"m\"}",
        "{\"method\":\"m\",\"params\":[-0,0,-0.0,1E+2,1e-2,1.5E3,123456789012345678901234567890e999]}",
        "{\"method\":\"m\",\"params\":[01]}",
        "{\"method\":\"m\",\"params\":[1.]}",
        "{\"method\":\"m\",\"params\":[1e]}",
        "{\"method\":\"m\",\"params\":[1e+]}",
        "{\"method\":\"m\",\"params\":[.5]}",
        "{\"method\":\"m\",\"params\":[-]}",
        "{\"method\":\"m\",\"params\":[+1]}",
        "{\"method\":\"m\",\"params\":[--1]}",
        "{\"method\":\"m\",\"params\":[0x1]}",
        "{\"method\":\"m\",\"params\":[1,]}",
        "{\"method\":\"m\",\"params\":[,1]}",
        "{\"method\":\"m\",\"params\":{\"a\":1,}}",
        "{\"method\":\"m\",\"params\":{\"a\"}}",
        "{\"method\":\"m\",\"params\":{\"a\":1 \"b\":2}}",
        "{\"method\":\"m\",\"params\":[1 2]}",
        "{\"method\":\"m\",\"params\":[1}",
        "{\"method\":\"m\",\"params\":{\"a\":1]}",
        "{\"method\":\"m\",\"params\":[true,false,null,nulL]}",
        "{\"method\":\"m\",\"params\":[\u{a0}1]}",
        "{\"method\":\"m\",\"params\":[\u{c}1]}",
        "{\"id\":-0,\"method\":\"m\"}",
        "{\"id\":1e400,\"method\":\"m\"}",
        "{\"id\":[],\"method\":\"m\"}",
        "{\"id\":null,\"method\":\"m\"}",
        "{\"jsonrpc\":\"2.\\u0030\",\"method\":\"m\"}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":5}",
        "{\"id\":1,\"result\":null,\"error\":null}",
        "{\"id\":1,\"error\":{\"code\":1}}",
        r#"{"method":"m","params":{"session\u0049d":"s","sessionId":"t"}}"#,
        r#"{"method":"m","params":{"sessionId":"s","a":{"x\ud800SessionId":1}}}"#,
        r#"{"method":"m","params":{"sessionId":"s\u0031","update":{}, "update" :{}}}"#,
        r#"{"method":"m","params":[{"sessionId":"s"}]}"#,
        r#"{"id":1,"result":{"sessionId":"s"},"params":{"sessionId":"t"}}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    for bad in [
        &b"{\"method\":\"m\",\"params\":[\"\xff\"]}"[..],
        b"{\"method\":\"m\",\"params\":[\xff]}",
        b"{\"method\":\"m\",\"params\":[\"\xed\xa0\x80\"]}",
        b"{\"method\":\"m\",\"params\":[\"\xc3\"]}",
        b"{\"id\":1,\"id\":2}\xff",
        b"[1]\xc3",
        b"\xef\xbb\xbf{}",
    ] {
        lines.push(bad.to_vec());
    }
    // Every UTF-8 shape, valid and not, at every place a sixteen-byte step can cut it: in a
    // value, in a nested key, in a top-level key, outside any string.
    for pad in 0..40 {
        let a = "a".repeat(pad);
        for ch in [
            &b"\xc3\xa9"[..],
            b"\xe4\xb8\xad",
            b"\xf0\x9f\x98\x80",
            b"\xf4\x8f\xbf\xbf",
            b"\xc0\x80",
            b"\xe0\x80\x80",
            b"\xed\xa0\x80",
            b"\xf4\x90\x80\x80",
            b"\xf5\x80\x80\x80",
            b"\xc3",
            b"\xe4\xb8",
            b"\x80",
            b"\xff",
        ] {
            for (open, close) in [
                ("{\"method\":\"m\",\"params\":[\"", "\"]}"),
                ("{\"method\":\"m\",\"params\":{\"", "\":1}}"),
                ("{\"method\":\"m\",\"", "\":1}"),
                ("{\"method\":\"m\",\"params\":[1,", "]}"),
            ] {
                let mut line = format!("{open}{a}").into_bytes();
                line.extend_from_slice(ch);
                line.extend_from_slice(format!("{a}{close}").as_bytes());
                lines.push(line.clone());
                line.truncate(open.len() + pad + ch.len());
                lines.push(line);
            }
        }
    }
    for depth in [1, 2, 63, 64, 65, 127, 128, 129, 200, 5000, 100_000] {
        let nested = |open: &str, close: &str| {
            format!(
                "{{\"method\":\"m\",\"params\":{}1{}}}",
                open.repeat(depth),
                close.repeat(depth)
            )
        };
        lines.push(nested("[", "]").into_bytes());
        lines.push(nested("{\"a\":", "}").into_bytes());
        lines.push(nested("[{\"a\":", "}]").into_bytes());
        lines.push(nested("[", "").into_bytes());
        lines.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes());
    }
    for seed in SEEDS {
        let mut line = seed.as_bytes().to_vec();
        assert_agree(&line);
        assert!(parse_ref(&line).is_ok(), "{seed}");
        // Every prefix of a valid line.
        while line.pop().is_some() {
            assert_agree(&line);
        }
    }
    for line in &lines {
        assert_agree(line);
    }
}

/// xorshift64*: enough to spread mutations, and every failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes a mutation writes: JSON's own, and the ones that break it in the subtle ways.
const ALPHABET: &[u8] = b"{}[]\":,\\/u0123456789aAfFeE+-. \t\r\nnultrsbx\x00\x01\x1f\x7f\xc3\xa9\xed\xa0\x80\xef\xbb\xbf\xff";

/// Snippets inserted whole: escapes, surrogates, envelope keys however spelled.
const SNIPPETS: &[&str] = &[
    "\\u0069d",
    "\"id\":2,",
    "\"i\\u0064\":2,",
    "\"method\":\"x\",",
    "\\ud800",
    "\\udc00",
    "\\ud83d\\ude00",
    "\\u00",
    "-0",
    "1e",
    "01",
    "\"params\":[],",
    "\"result\":1,",
    "\"error\":{\"code\":1,\"message\":\"m\"},",
    "[[[[",
    "]]]]",
    "{\"a\":",
];

fn mutate(rng: &mut Rng, line: &mut Vec<u8>) {
    let at = rng.below(line.len() + 1);
    match rng.below(7) {
        0 if at < line.len() => line[at] = ALPHABET[rng.below(ALPHABET.len())],
        1 => line.insert(at, ALPHABET[rng.below(ALPHABET.len())]),
        2 if at < line.len() => {
            line.remove(at);
        }
        3 => line.truncate(at),
        4 => {
            let snippet = SNIPPETS[rng.below(SNIPPETS.len())].as_bytes();
            line.splice(at..at, snippet.iter().copied());
        }
        5 if at < line.len() => {
            let end = (at + rng.below(16)).min(line.len());
            let copy = line[at..end].to_vec();
            let to = rng.below(line.len() + 1);
            line.splice(to..to, copy);
        }
        _ if at < line.len() => line[at] ^= 1 << rng.below(8),
        _ => line.push(ALPHABET[rng.below(ALPHABET.len())]),
    }
}

#[test]
fn mutated_acp_lines_get_the_same_verdict() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut not_json, mut invalid) = (0, 0, 0);
    for case in 0..200_000 {
        let mut line = SEEDS[case % SEEDS.len()].as_bytes().to_vec();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut line);
        }
        if let Some(why) = disagreement(&line) {
            panic!("case {case}: scan and serde_json disagree on {why}");
        }
        match parse_ref(&line) {
            Ok(_) => ok += 1,
            Err(EnvelopeError::NotJson(_)) => not_json += 1,
            Err(EnvelopeError::Invalid { .. }) => invalid += 1,
        }
    }
    // The mutations reach every verdict, each often.
    assert!(
        ok > 10_000 && not_json > 10_000 && invalid > 1_000,
        "{ok} {not_json} {invalid}"
    );
}

#[test]
fn a_syntax_error_says_what_and_where() {
    let Err(EnvelopeError::NotJson(why)) = parse_ref(br#"{"id":1 "method":"m"}"#) else {
        panic!("not JSON");
    };
    assert_eq!(why, "expected `,` or `}` at column 9");
    let Err(EnvelopeError::Invalid { reason, id: None }) =
        parse_ref(br#"{"id":1,"i\u0064":2,"method":"m"}"#)
    else {
        panic!("invalid");
    };
    assert_eq!(
        reason,
        "duplicate field `id` at column 9: each envelope key may appear once"
    );
}

#[test]
fn the_params_routing_keys_are_counted_as_written() {
    let line = br#"{"method":"session/update","params":{ "sessionId" : "s1", "update":{"sessionUpdate":"x","toolSessionId":"t","n":[{"sessionId":"u"}]},"sessionId":"s2"}}"#;
    let (_, keys) = parse_keyed(line).unwrap();
    assert_eq!(
        keys,
        ParamsKeys {
            session_id: Some("\"s1\""),
            session_ids: 2,
            other_sessions: 2,
            session_updates: 1,
            updates: 1,
            escaped: false,
        }
    );
    let (
        MessageRef::Notification {
            params: Some(params),
            ..
        },
        keys,
    ) = parse_keyed(br#"{"method":"m","params":{"a":1, "sessionId":"s1","b":2}}"#).unwrap()
    else {
        panic!("a notification");
    };
    assert_eq!(
        keys.around_session_id(params.get()),
        Some((r#"{"a":1, "sessionId":"#, r#","b":2}"#))
    );
    let (_, keys) = parse_keyed(br#"{"method":"m","params":{"x":{"session\u0049d":1}}}"#).unwrap();
    assert!(keys.escaped && keys.other_sessions == 0, "{keys:?}");
}
