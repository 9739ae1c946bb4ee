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

    /// The line at the front of `bytes` when it is this template's line but for its last
    /// string's content, and that content is a JSON string's (escapes, no control byte,
    /// UTF-8): its length and where that content lies. Then the line is UTF-8 JSON the scan
    /// accepts, with the same keys in the same places, the marks lie where
    /// [`LineTemplate::marks`] says, and it holds no newline (the template's pieces come from
    /// a line, and a string holds no control byte), so a reader need not search for its end:
    /// whatever follows it in `bytes` is not looked at beyond the template's suffix.
    #[inline]
    pub fn fits(&self, bytes: &[u8]) -> Option<(usize, Range<usize>)> {
        self.fits_plain(bytes).map(|(n, content, _)| (n, content))
    }

    /// [`LineTemplate::fits`], and whether the content is plain ASCII with no escape: a caller
    /// that looks at escapes (a lone surrogate's, say) need not look at a plain one, which is
    /// what most are.
    #[inline]
    pub fn fits_plain(&self, bytes: &[u8]) -> Option<(usize, Range<usize>, bool)> {
        if !bytes.starts_with(&self.prefix) {
            return None;
        }
        let start = self.prefix.len();
        // The string opened at the prefix's end closes at its first unescaped quote, and the
        // suffix must follow: anything else, and the line is another one.
        let plain = super::strings::plain_end(bytes, start);
        let is_plain = bytes.get(plain) == Some(&b'"');
        let close = if is_plain {
            plain
        } else {
            // Not plain ASCII to a quote: the scan's whole string check from there (which
            // checks each non-ASCII character with `std::str::from_utf8`).
            let mut s = Scanner::new(bytes);
            s.string_from(plain).ok()?;
            s.i - 1
        };
        if !bytes[close..].starts_with(&self.suffix) {
            return None;
        }
        Some((close + self.suffix.len(), start..close, is_plain))
    }

    /// The marks' offsets in a line of `len` bytes that [fits](LineTemplate::fits).
    pub fn marks(&self, len: usize) -> [usize; N] {
        self.marks.map(|m| match m {
            Mark::FromStart(x) => x,
            Mark::FromEnd(x) => len - x,
        })
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
