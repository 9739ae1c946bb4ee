//! A line the scan accepted, kept as a template: the next line that differs from it only
//! inside its last string value is the same message but for that string, so only that string
//! needs checking. An agent's streamed chunks are such lines (the same envelope, session and
//! update kind each time; only the text differs), and this is what makes them cheap to relay.

use std::ops::Range;

use super::Scanner;

/// The most bytes a template keeps (its line less the last string's content). A streamed
/// chunk's envelope is a few hundred bytes; a large line kept would hold its memory for as long
/// as the stream it starts lasts.
const TEMPLATE_MAX: usize = 4096;

/// A kept line: its bytes up to and including its last string value's opening quote, and from
/// that string's closing quote on; and `N` byte offsets into it (where a caller splices),
/// each before that string or after it.
#[derive(Debug, Clone)]
pub struct LineTemplate<const N: usize> {
    prefix: Box<[u8]>,
    suffix: Box<[u8]>,
    marks: [Mark; N],
}

#[derive(Debug, Clone, Copy)]
enum Mark {
    FromStart(usize),
    FromEnd(usize),
}

impl<const N: usize> LineTemplate<N> {
    /// `line`, which the scan accepted, as a template, when its last token is a string value
    /// lying inside `within`, what is kept is at most `TEMPLATE_MAX` bytes, and every offset
    /// of `marks` is before that string or after it (an offset at its opening quote starts a
    /// piece that is that string: not a template's).
    pub fn learn(line: &str, within: Range<usize>, marks: [usize; N]) -> Option<Self> {
        let b = line.as_bytes();
        let close = last_string_close(b)?;
        let open = opening_quote(b, close)?;
        let size = open + 1 + b.len() - close;
        if open < within.start || close >= within.end || size > TEMPLATE_MAX {
            return None;
        }
        let mut kept = [Mark::FromStart(0); N];
        for (k, m) in kept.iter_mut().zip(marks) {
            *k = if m < open {
                Mark::FromStart(m)
            } else if m > close && m <= b.len() {
                Mark::FromEnd(b.len() - m)
            } else {
                return None;
            };
        }
        Some(LineTemplate {
            prefix: b[..=open].into(),
            suffix: b[close..].into(),
            marks: kept,
        })
    }

    /// `line` as text, with the marks' offsets in it, when it is this template's line but for
    /// its last string's content, and that content is a JSON string's (escapes, no control
    /// byte, UTF-8), so `line` is JSON the scan accepts with the same keys in the same places.
    pub fn fits<'a>(&self, line: &'a [u8]) -> Option<(&'a str, [usize; N])> {
        let n = line.len();
        let close = n.checked_sub(self.suffix.len())?;
        if close < self.prefix.len()
            || !line.starts_with(&self.prefix)
            || !line.ends_with(&self.suffix)
        {
            return None;
        }
        // The string opened at the prefix's end must close exactly where the suffix begins:
        // an unescaped quote before then, or a backslash escaping the suffix's quote, and the
        // line is another one.
        let plain = super::strings::plain_end(line, self.prefix.len());
        if plain != close {
            // Not plain ASCII to the suffix's quote: the scan's whole string check from there.
            let mut s = Scanner::new(line);
            if s.string_from(plain).is_err() || s.i != close + 1 {
                return None;
            }
        }
        // SAFETY: the prefix and suffix are a UTF-8 line's, cut at ASCII quotes, so each is
        // UTF-8; the bytes between them are a string's content the scan took, which checks each
        // non-ASCII character with `std::str::from_utf8` (see `Scanner::utf8_char`).
        let text = unsafe { std::str::from_utf8_unchecked(line) };
        debug_assert!(std::str::from_utf8(line).is_ok());
        let marks = self.marks.map(|m| match m {
            Mark::FromStart(x) => x,
            Mark::FromEnd(x) => n - x,
        });
        Some((text, marks))
    }
}

/// Where the closing quote of `b`'s last token is, when that token is a string (and so a
/// value: a key is followed by its colon); only closing brackets and whitespace after it.
fn last_string_close(b: &[u8]) -> Option<usize> {
    let at = b
        .iter()
        .rposition(|c| !matches!(c, b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))?;
    (b[at] == b'"').then_some(at)
}

/// The opening quote of the string whose closing quote is at `close`: the nearest quote
/// before it that no backslash escapes (inside a JSON string every quote is escaped, and a
/// quote is escaped when an odd run of backslashes precedes it).
fn opening_quote(b: &[u8], close: usize) -> Option<usize> {
    let mut at = close;
    loop {
        at = b[..at].iter().rposition(|&c| c == b'"')?;
        let slashes = b[..at].iter().rev().take_while(|&&c| c == b'\\').count();
        if slashes % 2 == 0 {
            return Some(at);
        }
    }
}
