//! A kept line's template held to the full parse: a line the template takes is one the scan
//! takes, with the same keys, and the offsets it maps are where the full parse puts them.

use proptest::prelude::*;

use super::*;

/// The template `line` (an own update) makes, its marks as the relay sets them: the params'
/// start, the session id's start and end, the params' end.
fn learn(line: &str) -> Option<LineTemplate<4>> {
    let (message, keys) = parse_keyed(line.as_bytes()).unwrap();
    let MessageRef::Notification {
        params: Some(params),
        ..
    } = message
    else {
        panic!("{line}: not a notification with params");
    };
    let (before, after) = keys.around_session_id(params.get()).unwrap();
    let at = |piece: &str| piece.as_ptr() as usize - line.as_ptr() as usize;
    let marks = [
        at(before),
        at(before) + before.len(),
        at(after),
        at(after) + after.len(),
    ];
    LineTemplate::learn(line, marks[0]..marks[3], marks)
}

/// Where the text lies when all of `line` is the line the template takes.
fn whole(t: &LineTemplate<4>, line: &[u8]) -> Option<std::ops::Range<usize>> {
    t.fits(line)
        .and_then(|(n, content)| (n == line.len()).then_some(content))
}

/// What the full parse makes of `line`: its method, keys and the params around the session id.
fn full(line: &[u8]) -> Option<(String, ParamsKeys<'_>, (&str, &str))> {
    let (message, keys) = parse_keyed(line).ok()?;
    let MessageRef::Notification {
        method,
        params: Some(params),
    } = message
    else {
        return None;
    };
    Some((
        method.into_owned(),
        keys,
        keys.around_session_id(params.get())?,
    ))
}

const UPDATE: &str = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hello"}}}}"#;

/// Lines whose last string is the chunk's text, in the ways agents write them.
const STREAMS: &[(&str, &str)] = &[
    (
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""#,
        r#""}}}}"#,
    ),
    (
        r#" {"jsonrpc" : "2.0", "method":"session/update" , "params" : { "sessionId" : "s-1" , "update" : { "sessionUpdate":"agent_thought_chunk" , "content" : [ { "type" : "text" , "text" : ""#,
        r#"" } ] } } }  "#,
    ),
];

#[test]
fn a_line_differing_only_in_its_text_fits_and_maps_where_the_parse_does() {
    let t = learn(UPDATE).unwrap();
    for text in [
        "",
        "x",
        "\\ud800",
        "a \\\"quoted\\\" \\\\ word",
        "é😀\\u00e9\\n",
        &"y".repeat(5000),
    ] {
        let line = UPDATE.replace("hello", text);
        let (n, content) = t.fits(line.as_bytes()).unwrap_or_else(|| panic!("{line}"));
        assert_eq!(n, line.len());
        assert_eq!(&line[content], text);
        // What follows the line is not looked at.
        let more = format!("{line}\n{UPDATE}\n{{\"x");
        assert_eq!(t.fits(more.as_bytes()).map(|(n, _)| n), Some(line.len()));
        let [a, b, c, e] = t.marks(line.len());
        let (method, _, (before, after)) = full(line.as_bytes()).unwrap();
        assert_eq!(method, "session/update");
        assert_eq!((&line[a..b], &line[c..e]), (before, after), "{line}");
    }
}

#[test]
fn a_line_that_is_not_the_same_message_does_not_fit() {
    let t = learn(UPDATE).unwrap();
    for text in [
        // The string ends early, or its closing quote is escaped, or never comes.
        r#"a","sessionId":"other"#,
        r#"a"#.to_owned().as_str().strip_suffix('a').unwrap(),
        "\\",
        "a\\",
        "\\\\\\",
        // Not a string's content.
        "\n",
        "\u{1}",
        "\\x",
        "\\u12",
        "\\u12g4",
    ] {
        let line = UPDATE.replace("hello", text);
        if text.is_empty() {
            continue;
        }
        assert!(whole(&t, line.as_bytes()).is_none(), "{line}");
    }
    // Another session, method, kind or envelope around the same text.
    for other in [
        UPDATE.replace("s-1", "s-2"),
        UPDATE.replace("session/update", "session/updatE"),
        UPDATE.replace("agent_message_chunk", "tool_call"),
        UPDATE.replace(r#""2.0""#, r#""2.1""#),
        format!("{UPDATE} "),
        UPDATE.replace("}}}}", "}}}},\"id\":1}"),
    ] {
        assert!(whole(&t, other.as_bytes()).is_none(), "{other}");
    }
    // Invalid UTF-8 in the text.
    let mut bad = UPDATE.as_bytes().to_vec();
    let at = UPDATE.find("hello").unwrap();
    bad[at] = 0xff;
    assert!(whole(&t, &bad).is_none());
    bad[at] = 0xc3;
    bad[at + 1] = b'(';
    assert!(whole(&t, &bad).is_none());
}

#[test]
fn a_large_line_is_not_kept_but_a_large_text_is() {
    let large_text = UPDATE.replace("hello", &"t".repeat(100_000));
    assert!(learn(&large_text).is_some());
    let large_rest = UPDATE.replace(
        r#""type":"text""#,
        &format!(r#""pad":"{}","type":"text""#, "p".repeat(5000)),
    );
    assert!(learn(&large_rest).is_none());
}

#[test]
fn only_a_string_inside_the_params_and_not_the_session_id_is_a_template() {
    // The last string is the envelope's version, or the session id itself.
    for line in [
        r#"{"method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"x"}},"jsonrpc":"2.0"}"#,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"sessionUpdate":"x"},"sessionId":"s-1"}}"#,
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"x","n":1}}}"#,
    ] {
        assert!(learn(line).is_none(), "{line}");
    }
}

/// Bytes a text is made of at random: what escapes, ends or breaks a string, and plain text.
fn text_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(b"ab \"\\/nrtbfu0123456789ABCDEFxX{}[]:,".to_vec()),
            1 => any::<u8>(),
        ],
        0..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Whatever the text's bytes, the template takes the line exactly when the full parse takes
    /// it as the same update (a string's content between the same prefix and suffix), and then
    /// maps its offsets where the parse finds them.
    #[test]
    fn the_template_agrees_with_the_full_parse(which in 0..STREAMS.len(), text in text_bytes()) {
        let (prefix, suffix) = STREAMS[which];
        let seed = format!("{prefix}seed{suffix}");
        let t = learn(&seed).unwrap();
        let line = [prefix.as_bytes(), &text, suffix.as_bytes()].concat();
        // The line at the front of the bytes, whatever follows it.
        let fitted = whole(&t, &line);
        let followed = [&line, b"\n".as_slice(), &text].concat();
        let front = t.fits(&followed).and_then(|(n, c)| (n == line.len()).then_some(c));
        prop_assert_eq!(&fitted, &front);
        // The text is a string's content when serde_json skips `"text"` as one string (as it
        // skips a raw value's strings: a lone surrogate passes).
        let quoted = [b"\"".as_slice(), &text, b"\""].concat();
        let is_string = std::str::from_utf8(&quoted)
            .is_ok_and(|q| serde_json::from_str::<serde::de::IgnoredAny>(q).is_ok());
        prop_assert_eq!(fitted.is_some(), is_string, "{}", String::from_utf8_lossy(&line));
        if let Some(content) = fitted {
            prop_assert_eq!(&line[content], text.as_slice());
            let text = std::str::from_utf8(&line).expect("a line that fits is UTF-8");
            let [a, b, c, e] = t.marks(line.len());
            let (_, keys, (before, after)) = full(&line).expect("the full parse takes it");
            let (_, seed_keys, _) = full(seed.as_bytes()).unwrap();
            prop_assert_eq!(keys, seed_keys);
            prop_assert_eq!((&text[a..b], &text[c..e]), (before, after));
        }
    }
}
