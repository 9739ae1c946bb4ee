//! Lone surrogate escapes (`"\ud800"`): JSON's grammar allows any four hex digits after `\u`,
//! but a UTF-16 surrogate that is not half of a pair names no Unicode character, and a reader
//! that decodes strings (serde_json into a `String`, every typed ACP client) refuses the whole
//! line. An agent written in JavaScript sends one whenever it cuts a string between the two
//! halves of an emoji (`JSON.stringify` writes a lone half as its escape). acpd passes such a
//! line on with each lone surrogate replaced by U+FFFD (`\ufffd`, the same six bytes), as a
//! lossy UTF-16 decoder does, rather than end the session over one character.

/// Where each lone surrogate escape in `json` starts (its backslash), in order. `json` is
/// JSON text or a string's content; escapes are read from the start, so `\\ud800` (an escaped
/// backslash, then text) is no escape. Any bytes are taken: in text that is not JSON the
/// answer means nothing, and nothing panics.
pub fn lone_surrogates(json: &[u8]) -> impl Iterator<Item = usize> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        while let Some(found) = memchr::memchr(b'\\', json.get(i..)?) {
            let at = i + found;
            if json.get(at + 1) != Some(&b'u') {
                i = at + 2;
                continue;
            }
            i = at + 6;
            match hex4(json, at + 2) {
                Some(0xD800..=0xDBFF) => {
                    let low = json.get(at + 6..at + 8) == Some(b"\\u".as_slice())
                        && matches!(hex4(json, at + 8), Some(0xDC00..=0xDFFF));
                    if low {
                        i = at + 12;
                    } else {
                        return Some(at);
                    }
                }
                Some(0xDC00..=0xDFFF) => return Some(at),
                _ => {}
            }
        }
        None
    })
}

/// `json` with every lone surrogate escape replaced by `\ufffd`, when it has one (the same
/// length: every offset into `json` holds in the copy).
pub fn replace_lone_surrogates(json: &[u8]) -> Option<Vec<u8>> {
    let mut lone = lone_surrogates(json).peekable();
    lone.peek()?;
    let mut out = json.to_vec();
    for at in lone {
        if let Some(digits) = out.get_mut(at + 2..at + 6) {
            digits.copy_from_slice(b"fffd");
        }
    }
    Some(out)
}

fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16)
        .ok()
        .filter(|_| digits.bytes().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replaced(text: &str) -> Option<String> {
        replace_lone_surrogates(text.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn lone_halves_are_replaced_and_pairs_are_not() {
        assert_eq!(
            replaced(r#"{"t":"a\ud800b"}"#).as_deref(),
            Some(r#"{"t":"a\ufffdb"}"#)
        );
        assert_eq!(replaced(r#""\udc00""#).as_deref(), Some(r#""\ufffd""#));
        assert_eq!(replaced(r#""\uD83D""#).as_deref(), Some(r#""\ufffd""#));
        // A high half followed by another high half, then a pair.
        assert_eq!(
            replaced(r#""\ud800\ud83d\ude00""#).as_deref(),
            Some(r#""\ufffd\ud83d\ude00""#)
        );
        // The low half first, then the high half: neither pairs.
        assert_eq!(
            replaced(r#""\ude00\ud83d""#).as_deref(),
            Some(r#""\ufffd\ufffd""#)
        );
        for fine in [
            r#""\ud83d\ude00""#,
            r#""\\ud800""#,
            r#""\\\\ud800""#,
            r#""\u00e9\n\"""#,
            "plain",
            "",
            r#""\ud83d\u0041""#.trim_end_matches(r#"\u0041""#),
        ] {
            let lone: Vec<usize> = lone_surrogates(fine.as_bytes()).collect();
            if fine.ends_with("\\ud83d") {
                assert_eq!(lone.len(), 1, "{fine}");
            } else {
                assert!(lone.is_empty(), "{fine}: {lone:?}");
            }
        }
        // An escaped backslash before a lone half: the half is still an escape.
        assert_eq!(replaced(r#""\\\ud800""#).as_deref(), Some(r#""\\\ufffd""#));
    }

    #[test]
    fn any_bytes_are_taken() {
        for bytes in [
            &b"\\"[..],
            b"\\u",
            b"\\ud8",
            b"\\ud800\\",
            b"\\ud800\\u",
            b"\\u+fff",
            b"\xff\\ud800",
        ] {
            let _ = replace_lone_surrogates(bytes);
        }
        assert_eq!(
            replace_lone_surrogates(b"\\ud800\\u").map(|v| v.len()),
            Some(8)
        );
    }
}
