//! Length-capped NDJSON framing.
//!
//! ACP puts one JSON-RPC message on each `\n`-terminated line. A peer we do not control may send
//! a line of any length or bytes that are not UTF-8; the decoder turns both into a typed error for
//! that one line and resynchronises at the next newline, so a bad line never grows a buffer
//! without bound and never ends the stream by itself.

use bytes::{Buf, Bytes, BytesMut};

/// Default cap on one line: 16 MiB.
pub const DEFAULT_MAX_LINE: usize = 16 * 1024 * 1024;

/// What was wrong with one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("line exceeds the {limit}-byte limit")]
    Oversized { limit: usize },
    #[error("line is not valid UTF-8")]
    NotUtf8,
}

/// Splits a byte stream into lines of at most `max_line` bytes (the newline, and a `\r` before
/// it, excluded).
///
/// Memory: after [`LineDecoder::decode`] returns `None`, `buf` holds at most `max_line + 1` bytes
/// (a partial line that may still end in `\r\n`); a longer partial line is dropped at once and
/// the rest of it skipped up to its newline. The caller's `buf` is only ever larger by what it
/// appended since the last call.
#[derive(Debug, Clone)]
pub struct LineDecoder {
    max_line: usize,
    /// Bytes of `buf` already scanned for a newline, so a long partial line is scanned once.
    scanned: usize,
    /// Inside a dropped line: skip bytes until its newline.
    discarding: Option<Discard>,
    /// Report lines that are not UTF-8 as [`FrameError::NotUtf8`]; off when the caller parses
    /// every line with [`crate::envelope::parse`], which checks it itself (once is enough).
    check_utf8: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Discard {
    /// An oversized line: reported as [`FrameError::Oversized`] at its newline (or at EOF).
    Oversized,
    /// A line the caller abandoned ([`LineDecoder::abandon_partial`]): it has been reported.
    Abandoned,
}

impl Default for LineDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl LineDecoder {
    pub fn new(max_line: usize) -> Self {
        Self {
            max_line,
            scanned: 0,
            discarding: None,
            check_utf8: true,
        }
    }

    /// A decoder that leaves the UTF-8 check to the caller: for lines that go straight to
    /// [`crate::envelope::parse`], whose own check makes a non-UTF-8 line −32700.
    pub fn leaving_utf8_to_the_envelope(mut self) -> Self {
        self.check_utf8 = false;
        self
    }

    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// Whether bytes of an unfinished line are buffered, or being skipped: what a line deadline
    /// (`line_timeout`) watches.
    pub fn in_line(&self, buf: &BytesMut) -> bool {
        self.discarding.is_some() || !buf.is_empty()
    }

    /// The line of `n` bytes at `from` in `buf` (0, or where a line lent before ended) as
    /// [`decode`] would frame it, lent rather than taken, and where it and its newline end:
    /// for a caller that knows how long the next line is without searching for its end (and
    /// handles it where it lies, then [`consume`]s the lines it took all at once). `None`
    /// unless a newline ends the line right there (a `\r` before it belongs to the newline),
    /// and the line is an ordinary one: none while a line is being skipped, none over
    /// `max_line`, none that starts with whitespace (a blank one among them), none while this
    /// decoder checks UTF-8; `decode` takes those.
    ///
    /// The caller vouches that `buf[from..from + n]` holds no newline (a line it measured by
    /// its content, say a JSON string, which holds none): that is not searched again.
    ///
    /// [`consume`]: LineDecoder::consume
    /// [`decode`]: LineDecoder::decode
    pub fn framed_at<'b>(&self, buf: &'b [u8], from: usize, n: usize) -> Option<(&'b [u8], usize)> {
        if self.discarding.is_some() || self.check_utf8 || n > self.max_line {
            return None;
        }
        let line = buf.get(from..from.checked_add(n)?)?;
        debug_assert!(
            memchr_newline(line).is_none(),
            "a measured line holds a newline"
        );
        if line.first().is_none_or(u8::is_ascii_whitespace) {
            return None;
        }
        let at = from + n;
        match buf.get(at..)? {
            [b'\n', ..] if line.last() != Some(&b'\r') => Some((line, at + 1)),
            [b'\r', b'\n', ..] => Some((line, at + 2)),
            _ => None,
        }
    }

    /// Drops the lines [`framed_at`](LineDecoder::framed_at) lent, up to `end`, from the front
    /// of `buf`.
    pub fn consume(&mut self, buf: &mut BytesMut, end: usize) {
        buf.advance(end);
        self.scanned = 0;
    }

    /// Takes the next complete line out of `buf`. `None` means more bytes are needed. Empty lines
    /// (and a lone `\r` before the newline) are skipped. A line is returned without its newline.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Option<Result<Bytes, FrameError>> {
        loop {
            let found = memchr_newline(&buf[self.scanned..]).map(|i| i + self.scanned);
            match found {
                None => {
                    // A `\r` may still be followed by its `\n`, so it does not count yet: the
                    // verdict on a line must not depend on where the reads split it.
                    let pending_cr = usize::from(buf.last() == Some(&b'\r'));
                    if self.discarding.is_some() {
                        buf.clear();
                        self.scanned = 0;
                    } else if buf.len() > self.max_line.saturating_add(pending_cr) {
                        self.discarding = Some(Discard::Oversized);
                        buf.clear();
                        self.scanned = 0;
                    } else {
                        self.scanned = buf.len();
                    }
                    return None;
                }
                Some(pos) => {
                    self.scanned = 0;
                    if let Some(discard) = self.discarding.take() {
                        buf.advance(pos + 1);
                        match discard {
                            Discard::Oversized => {
                                return Some(Err(FrameError::Oversized {
                                    limit: self.max_line,
                                }));
                            }
                            Discard::Abandoned => continue,
                        }
                    }
                    let mut line = buf.split_to(pos + 1).freeze();
                    line.truncate(pos);
                    if line.last() == Some(&b'\r') {
                        line.truncate(pos - 1);
                    }
                    if line.len() > self.max_line {
                        return Some(Err(FrameError::Oversized {
                            limit: self.max_line,
                        }));
                    }
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    if self.check_utf8 && std::str::from_utf8(&line).is_err() {
                        return Some(Err(FrameError::NotUtf8));
                    }
                    return Some(Ok(line));
                }
            }
        }
    }

    /// At end of input: a final line without a newline is still a message.
    pub fn decode_eof(&mut self, buf: &mut BytesMut) -> Option<Result<Bytes, FrameError>> {
        if let Some(item) = self.decode(buf) {
            return Some(item);
        }
        if let Some(discard) = self.discarding.take() {
            buf.clear();
            return match discard {
                Discard::Oversized => Some(Err(FrameError::Oversized {
                    limit: self.max_line,
                })),
                Discard::Abandoned => None,
            };
        }
        if buf.is_empty() {
            return None;
        }
        buf.extend_from_slice(b"\n");
        self.decode(buf)
    }

    /// Drops the unfinished line in `buf` (call it after [`LineDecoder::decode`] returned
    /// `None`, for example when the line's deadline passed): its buffered bytes are freed —
    /// `buf` is replaced by an empty buffer, so a large partial line gives its memory back — and
    /// the rest of that line, up to its newline, is skipped without another error. Returns
    /// whether a line was dropped; an oversized line already being skipped is not (it is
    /// reported at its newline).
    pub fn abandon_partial(&mut self, buf: &mut BytesMut) -> bool {
        if self.discarding.is_some() || buf.is_empty() {
            return false;
        }
        self.scanned = 0;
        if let Some(pos) = memchr_newline(buf) {
            // Misuse (more bytes were appended since `decode`): drop only the first line.
            buf.advance(pos + 1);
            return true;
        }
        *buf = BytesMut::new();
        self.discarding = Some(Discard::Abandoned);
        true
    }
}

fn memchr_newline(haystack: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', haystack)
}

/// Appends one message and its newline. JSON produced by serde never contains a raw newline.
pub fn encode_line(json: &[u8], out: &mut BytesMut) {
    out.reserve(json.len() + 1);
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_utf8_check_can_be_left_to_the_envelope() {
        let mut buf = BytesMut::from(&b"\xff\xfe{}\n"[..]);
        let mut checked = LineDecoder::new(64);
        assert_eq!(
            checked.decode(&mut buf.clone()),
            Some(Err(FrameError::NotUtf8))
        );
        let mut left = LineDecoder::new(64).leaving_utf8_to_the_envelope();
        let line = left.decode(&mut buf).unwrap().unwrap();
        assert!(
            crate::envelope::parse(&line).is_err(),
            "the envelope refuses it instead"
        );
    }
    /// Lines lent with `framed_at`, at the length `claim` gives for the bytes from a line's
    /// start (never past its newline), and `consume`d in runs; taken with `decode` otherwise.
    fn lend_chunks(
        max: usize,
        data: &[u8],
        cuts: &[usize],
        claim: impl Fn(&[u8]) -> Option<usize>,
    ) -> Vec<Result<Bytes, FrameError>> {
        let mut dec = LineDecoder::new(max).leaving_utf8_to_the_envelope();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain([&data.len()]) {
            let cut = cut.clamp(at, data.len());
            buf.extend_from_slice(&data[at..cut]);
            at = cut;
            loop {
                let mut end = 0;
                while let Some(n) = claim(&buf[end..])
                    && let Some((line, next)) = dec.framed_at(&buf, end, n)
                {
                    out.push(Ok(Bytes::copy_from_slice(line)));
                    end = next;
                }
                if end > 0 {
                    dec.consume(&mut buf, end);
                    continue;
                }
                match dec.decode(&mut buf) {
                    Some(item) => out.push(item),
                    None => break,
                }
            }
        }
        while let Some(item) = dec.decode_eof(&mut buf) {
            out.push(item);
        }
        out
    }

    #[test]
    fn only_an_ordinary_line_ending_where_claimed_is_lent() {
        let dec = LineDecoder::new(8).leaving_utf8_to_the_envelope();
        assert_eq!(dec.framed_at(b"{}\r\nx", 0, 2), Some((&b"{}"[..], 4)));
        assert_eq!(dec.framed_at(b"{}\r\n[1]\n", 4, 3), Some((&b"[1]"[..], 8)));
        assert_eq!(
            dec.framed_at(b"{}\r\n", 0, 3),
            None,
            "the \\r is the newline's"
        );
        assert_eq!(dec.framed_at(b"{}\r\r\n", 0, 3), Some((&b"{}\r"[..], 5)));
        assert_eq!(dec.framed_at(b"{}}\n", 0, 2), None, "no newline there");
        assert_eq!(dec.framed_at(b"{}", 0, 2), None, "not finished");
        assert_eq!(
            dec.framed_at(b" {}\n", 0, 3),
            None,
            "leading whitespace: decode's"
        );
        assert_eq!(dec.framed_at(b"{}\n\n", 3, 0), None, "blank");
        assert_eq!(dec.framed_at(b"123456789\n", 0, 9), None, "over the cap");
        assert_eq!(dec.framed_at(b"{}\n", 4, 0), None, "past the buffer");
        assert_eq!(
            LineDecoder::new(8).framed_at(b"{}\n", 0, 2),
            None,
            "a decoder that checks UTF-8 lends nothing"
        );
    }

    use proptest::prelude::*;

    fn decode_all(dec: &mut LineDecoder, input: &[&[u8]]) -> Vec<Result<Bytes, FrameError>> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in input {
            buf.extend_from_slice(chunk);
            while let Some(item) = dec.decode(&mut buf) {
                out.push(item);
            }
        }
        while let Some(item) = dec.decode_eof(&mut buf) {
            out.push(item);
        }
        out
    }

    #[test]
    fn splits_lines_and_skips_blank_ones() {
        let mut dec = LineDecoder::new(64);
        let out = decode_all(
            &mut dec,
            &[b"{\"a\":1}\n\n  \r\n{\"b\"", b":2}\r\n{\"c\":3}"],
        );
        let lines: Vec<_> = out.into_iter().map(Result::unwrap).collect();
        assert_eq!(lines, vec![&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"]);
    }

    #[test]
    fn oversized_line_is_one_error_then_recovers() {
        let mut dec = LineDecoder::new(8);
        let out = decode_all(&mut dec, &[b"0123456789abcdef", b"0123", b"\nok\n"]);
        assert_eq!(out[0], Err(FrameError::Oversized { limit: 8 }));
        assert_eq!(out[1].as_ref().unwrap(), &b"ok"[..]);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn oversized_complete_line_in_one_read() {
        let mut dec = LineDecoder::new(4);
        let out = decode_all(&mut dec, &[b"12345\n1234\n"]);
        assert_eq!(out[0], Err(FrameError::Oversized { limit: 4 }));
        assert_eq!(out[1].as_ref().unwrap(), &b"1234"[..]);
    }

    #[test]
    fn non_utf8_line_is_an_error_then_recovers() {
        let mut dec = LineDecoder::new(64);
        let out = decode_all(&mut dec, &[b"\xff\xfe\n{}\n"]);
        assert_eq!(out[0], Err(FrameError::NotUtf8));
        assert_eq!(out[1].as_ref().unwrap(), &b"{}"[..]);
    }

    #[test]
    fn buffer_stays_bounded_while_discarding() {
        let mut dec = LineDecoder::new(16);
        let mut buf = BytesMut::new();
        for _ in 0..1000 {
            buf.extend_from_slice(&[b'x'; 100]);
            assert!(dec.decode(&mut buf).is_none());
            assert!(buf.len() <= 116);
        }
    }

    #[test]
    fn a_line_at_the_cap_with_crlf_is_accepted_however_it_is_split() {
        // Regression: `1234\r` then `\n` was dropped as oversized while `1234\r\n` in one read
        // was a line.
        for input in [
            &[&b"1234\r"[..], b"\n"][..],
            &[b"1234\r\n"],
            &[b"1234", b"\r", b"\n"],
        ] {
            let mut dec = LineDecoder::new(4);
            let out = decode_all(&mut dec, input);
            assert_eq!(out, vec![Ok(Bytes::from_static(b"1234"))], "{input:?}");
        }
        let mut dec = LineDecoder::new(4);
        let out = decode_all(&mut dec, &[b"1234\r", b"5\n"]);
        assert_eq!(out, vec![Err(FrameError::Oversized { limit: 4 })]);
    }

    #[test]
    fn an_abandoned_partial_line_is_freed_and_skipped_quietly() {
        let mut dec = LineDecoder::new(1 << 20);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[b'x'; 100_000]);
        assert!(dec.decode(&mut buf).is_none());
        assert!(dec.in_line(&buf));
        assert!(dec.abandon_partial(&mut buf));
        assert_eq!(buf.capacity(), 0);
        assert!(dec.in_line(&buf));
        buf.extend_from_slice(b"yyy");
        assert!(dec.decode(&mut buf).is_none());
        buf.extend_from_slice(b"zz\n{}\n");
        assert_eq!(dec.decode(&mut buf), Some(Ok(Bytes::from_static(b"{}"))));
        assert!(!dec.in_line(&buf));
        assert!(!dec.abandon_partial(&mut buf));
        // At EOF an abandoned line says nothing more.
        buf.extend_from_slice(b"partial");
        assert!(dec.decode(&mut buf).is_none());
        assert!(dec.abandon_partial(&mut buf));
        buf.extend_from_slice(b"more");
        assert_eq!(dec.decode_eof(&mut buf), None);
        // An oversized line being skipped is still reported once, at its newline.
        let mut dec = LineDecoder::new(2);
        let mut buf = BytesMut::from(&b"12345"[..]);
        assert!(dec.decode(&mut buf).is_none());
        assert!(!dec.abandon_partial(&mut buf));
        buf.extend_from_slice(b"\nok\n");
        assert_eq!(
            dec.decode(&mut buf),
            Some(Err(FrameError::Oversized { limit: 2 }))
        );
        assert_eq!(dec.decode(&mut buf), Some(Ok(Bytes::from_static(b"ok"))));
        // Misuse: complete lines appended after `decode` are kept, only the first is dropped.
        let mut dec = LineDecoder::new(64);
        let mut buf = BytesMut::from(&b"part"[..]);
        assert!(dec.decode(&mut buf).is_none());
        buf.extend_from_slice(b"ial\nnext\n");
        assert!(dec.abandon_partial(&mut buf));
        assert_eq!(dec.decode(&mut buf), Some(Ok(Bytes::from_static(b"next"))));
    }

    fn decode_chunks(max: usize, data: &[u8], cuts: &[usize]) -> Vec<Result<Bytes, FrameError>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        cuts.sort_unstable();
        let mut chunks: Vec<&[u8]> = Vec::new();
        let mut prev = 0;
        for c in cuts {
            chunks.push(&data[prev..c]);
            prev = c;
        }
        chunks.push(&data[prev..]);
        let mut dec = LineDecoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(item) = dec.decode(&mut buf) {
                out.push(item);
            }
            assert!(
                buf.len() <= max + 1,
                "{} buffered over a cap of {max}",
                buf.len()
            );
        }
        while let Some(item) = dec.decode_eof(&mut buf) {
            out.push(item);
        }
        out
    }

    proptest! {
        /// Where the reads split the stream never changes what it decodes to, and the buffer
        /// never holds more than the cap (plus a pending `\r`) between reads.
        #[test]
        fn verdicts_do_not_depend_on_chunking(
            data in proptest::collection::vec(prop_oneof![
                4 => Just(b'a'), 2 => Just(b'\n'), 2 => Just(b'\r'), 1 => Just(b' '), 1 => Just(0xff)
            ], 0..80),
            cuts in proptest::collection::vec(0usize..100, 0..12),
            max in 0usize..8,
        ) {
            let whole = decode_chunks(max, &data, &[]);
            let split = decode_chunks(max, &data, &cuts);
            prop_assert_eq!(whole, split);
        }

        /// Lines lent where they lie, at claimed lengths right or wrong, are the lines decoded.
        #[test]
        fn lending_lines_does_not_change_them(
            data in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b' '), Just(b'a'), Just(b'{'), any::<u8>()], 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
            short in 0usize..3,
        ) {
            let mut sorted = cuts.clone();
            sorted.sort_unstable();
            // Claims up to the newline: exact for some lines, short of it (before a `\r`, or
            // not) for others; never past it, as the caller vouches. The same lines, errors
            // and order as decoding them all.
            let claim = |rest: &[u8]| {
                let nl = rest.iter().position(|b| *b == b'\n')?;
                Some(match rest.first() {
                    Some(b'a') => nl,
                    _ => nl.saturating_sub(short),
                })
            };
            let lent = lend_chunks(8, &data, &sorted, claim);
            let mut dec = LineDecoder::new(8).leaving_utf8_to_the_envelope();
            prop_assert_eq!(lent, decode_all(&mut dec, &[&data]));
        }

        /// Any chunking of valid frames decodes to the same lines.
        #[test]
        fn chunking_does_not_change_lines(
            lines in proptest::collection::vec("[a-z0-9{}\":,]{1,40}", 1..20),
            cuts in proptest::collection::vec(0usize..2000, 0..10),
        ) {
            let mut joined = Vec::new();
            for l in &lines { joined.extend_from_slice(l.as_bytes()); joined.push(b'\n'); }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (joined.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut prev = 0;
            for c in cuts { chunks.push(&joined[prev..c]); prev = c; }
            chunks.push(&joined[prev..]);
            let mut dec = LineDecoder::new(64);
            let out: Vec<_> = decode_all(&mut dec, &chunks).into_iter().map(Result::unwrap).collect();
            let expected: Vec<_> = lines.iter().map(|l| Bytes::copy_from_slice(l.as_bytes())).collect();
            prop_assert_eq!(out, expected);
        }

        /// Random bytes never panic, never yield a line over the cap, never hold more than the
        /// cap plus one read in the buffer.
        #[test]
        fn random_bytes_are_bounded(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..40)) {
            let mut dec = LineDecoder::new(32);
            let mut buf = BytesMut::new();
            for c in &chunks {
                buf.extend_from_slice(c);
                while let Some(item) = dec.decode(&mut buf) {
                    if let Ok(line) = item { prop_assert!(line.len() <= 32); }
                }
                prop_assert!(buf.len() <= 32 + 64);
            }
        }
    }
}
