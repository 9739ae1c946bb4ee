//! A string's scan: plain ASCII skipped sixteen bytes at a time, non-ASCII characters checked
//! as UTF-8, escapes checked as serde_json skips them, and a top-level key decoded as serde_json
//! decodes one.

use super::{ScanError, Scanner, envelope_key};

/// Bytes a string's scan of plain ASCII stops at: `"`, `\`, the control characters and
/// every non-ASCII byte.
static STOP: [bool; 256] = {
    let mut t = [true; 256];
    let mut c = 0x20;
    while c < 0x80 {
        t[c] = false;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

impl Scanner<'_> {
    /// A top-level key after its opening quote, decoded as serde_json decodes a string it
    /// returns: which envelope key it is, if any.
    pub(super) fn key(&mut self) -> Result<Option<usize>, ScanError> {
        let start = self.i;
        self.skip_plain()?;
        match self.peek() {
            Some(b'"') => {
                let key = &self.b[start..self.i];
                self.i += 1;
                return Ok(envelope_key(key));
            }
            Some(b'\\') => {}
            Some(_) => return Err(self.err("control character found while parsing a string")),
            None => return Err(self.err("EOF while parsing a string")),
        }
        let mut decoded = self.b[start..self.i].to_vec();
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(envelope_key(&decoded));
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.decode_escape(&mut decoded)?;
                }
                Some(_) => return Err(self.err("control character found while parsing a string")),
                None => return Err(self.err("EOF while parsing a string")),
            }
            let from = self.i;
            self.skip_plain()?;
            decoded.extend_from_slice(&self.b[from..self.i]);
        }
    }

    /// One escape after its `\`, decoded into `out`; surrogates must pair.
    fn decode_escape(&mut self, out: &mut Vec<u8>) -> Result<(), ScanError> {
        let c = self.next_in_string()?;
        let plain = match c {
            b'"' | b'\\' | b'/' => c,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let n = self.hex4()?;
                let code = match n {
                    0xDC00..=0xDFFF => return Err(self.err("lone surrogate in a key")),
                    0xD800..=0xDBFF => {
                        if self.next_in_string()? != b'\\' || self.next_in_string()? != b'u' {
                            return Err(self.err("unexpected end of hex escape"));
                        }
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(self.err("lone surrogate in a key"));
                        }
                        0x1_0000 + ((u32::from(n) - 0xD800) << 10 | (u32::from(low) - 0xDC00))
                    }
                    n => u32::from(n),
                };
                let ch = char::from_u32(code).ok_or_else(|| self.err("invalid escape"))?;
                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                return Ok(());
            }
            _ => return Err(self.err("invalid escape")),
        };
        out.push(plain);
        Ok(())
    }

    fn next_in_string(&mut self) -> Result<u8, ScanError> {
        let c = self
            .peek()
            .ok_or_else(|| self.err("EOF while parsing a string"))?;
        self.i += 1;
        Ok(c)
    }

    /// Four hex digits of a `\u` escape.
    fn hex4(&mut self) -> Result<u16, ScanError> {
        let Some(digits) = self.b.get(self.i..self.i + 4) else {
            self.i = self.b.len();
            return Err(self.err("EOF while parsing a string"));
        };
        let mut n = 0u16;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(self.err("invalid escape")),
            };
            n = n << 4 | u16::from(v);
        }
        self.i += 4;
        Ok(n)
    }

    /// Past the characters a string holds as they are, to its next `"`, `\` or control
    /// byte; each non-ASCII one checked as UTF-8.
    #[inline]
    fn skip_plain(&mut self) -> Result<(), ScanError> {
        loop {
            self.skip_ascii();
            match self.peek() {
                Some(c) if c >= 0x80 => self.utf8_char()?,
                _ => return Ok(()),
            }
        }
    }

    /// Past plain ASCII (no `"`, `\` or control byte), sixteen bytes at a time.
    #[inline]
    fn skip_ascii(&mut self) {
        self.i = plain_end(self.b, self.i);
    }

    /// A string's rest from where its plain run stopped: [`Scanner::string_rest`].
    pub(super) fn string_from(&mut self, at: usize) -> Result<bool, ScanError> {
        self.i = at;
        self.string_rest()
    }

    /// One non-ASCII character of a string, checked as UTF-8.
    #[cold]
    fn utf8_char(&mut self) -> Result<(), ScanError> {
        let width = match self.b[self.i] {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 0,
        };
        match self.b.get(self.i..self.i + width).map(std::str::from_utf8) {
            Some(Ok(_)) if width > 0 => {
                self.i += width;
                Ok(())
            }
            _ => Err(self.err("invalid UTF-8")),
        }
    }

    /// A string after its opening quote, skipped: escapes checked as serde_json skips them.
    /// Whether it held an escape.
    #[inline(always)]
    pub(super) fn string(&mut self) -> Result<bool, ScanError> {
        // Most strings are plain ASCII to their closing quote: that much needs no call.
        self.skip_ascii();
        if self.peek() == Some(b'"') {
            self.i += 1;
            return Ok(false);
        }
        self.string_rest()
    }

    /// The rest of a string [`string`](Self::string) met something in: an escape, a non-ASCII
    /// character, a control byte, the end of the line.
    fn string_rest(&mut self) -> Result<bool, ScanError> {
        let mut escaped = false;
        loop {
            self.skip_plain()?;
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.i += 1;
                    match self.next_in_string()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            self.hex4()?;
                        }
                        _ => return Err(self.err("invalid escape")),
                    }
                }
                Some(_) => return Err(self.err("control character found while parsing a string")),
                None => return Err(self.err("EOF while parsing a string")),
            }
        }
    }
}

/// Where the plain ASCII run of `b` from `i` ends (no `"`, `\` or control byte), found sixteen
/// bytes at a time: the first byte a string's scan must look at, or `b`'s end.
#[inline]
pub(super) fn plain_end(b: &[u8], mut i: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    while let Some(chunk) = b.get(i..i + 16) {
        let hit = stops_in_16(chunk);
        if hit != 0 {
            return i + hit.trailing_zeros() as usize;
        }
        i += 16;
    }
    while let Some(&c) = b.get(i) {
        if STOP[usize::from(c)] {
            return i;
        }
        i += 1;
    }
    i
}

/// A bit for each byte of `chunk` (16 bytes) a string's plain run stops at: `"`, `\`, a
/// control byte, a non-ASCII byte.
#[cfg(target_arch = "x86_64")]
#[inline]
fn stops_in_16(chunk: &[u8]) -> u32 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    assert!(chunk.len() >= 16);
    // SAFETY: SSE2 is part of every x86_64 target, and the load reads 16 bytes of `chunk`
    // (checked above) with no alignment needed.
    let mask = unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast());
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let slash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // Signed: a control byte is below 0x20, a non-ASCII one below zero.
        let low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
        _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, slash), low))
    };
    mask as u32
}
