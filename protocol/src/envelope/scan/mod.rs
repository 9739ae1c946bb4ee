//! One line checked as JSON in a single pass, the envelope's fields picked out on the way.
//!
//! It accepts exactly what `serde_json::from_str` accepted when [`parse_ref`](super::parse_ref)
//! read a line into its six raw fields (the differential tests in `scan_tests.rs` hold it to
//! that): JSON whitespace only, no control character in a string, escapes as serde_json
//! skips them (`\u` needs four hex digits, a lone surrogate passes) except in the top-level
//! object's keys, which are decoded as serde_json decodes a key (a lone surrogate is an error,
//! `"\u0069d"` is `id`), a number by JSON's grammar (no `01`, `1.`, `1e`, any magnitude), no
//! depth limit below the top-level object (serde_json skips a raw value with a heap stack), and
//! nothing after the value but whitespace. UTF-8 is checked on the way: a byte outside a
//! string must be ASCII, and each non-ASCII character in a string is checked as it is met, so a
//! line the scan accepts is UTF-8 (a line it refuses may not be: the caller checks which).

/// The raw text of each envelope key's value in the top-level object, leading whitespace not
/// included (as serde_json's `RawValue` has it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fields<'a> {
    pub jsonrpc: Option<&'a str>,
    pub id: Option<&'a str>,
    pub method: Option<&'a str>,
    pub params: Option<&'a str>,
    pub result: Option<&'a str>,
    pub error: Option<&'a str>,
    /// What the keys of `params` are, when it is an object.
    pub keys: ParamsKeys<'a>,
}

/// The keys of a message's `params` object that route it, counted by the scan on its way
/// through (so a bridge's hot path needs no second look at the params): how many top-level
/// `sessionId` keys and the first one's value, how many other keys name a session, how many
/// `sessionUpdate` and top-level `update` keys. Keys written with an escape are not counted but
/// flagged: a key is compared as written, and `"session\u0049d"` is `sessionId` decoded.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ParamsKeys<'a> {
    /// The first top-level `sessionId`'s value as written, when it is a string.
    pub session_id: Option<&'a str>,
    /// Top-level `sessionId` keys.
    pub session_ids: u32,
    /// Keys naming a session besides those: `sessionId` below the top level, `…SessionId` at
    /// any depth.
    pub other_sessions: u32,
    /// `sessionUpdate` keys at any depth.
    pub session_updates: u32,
    /// Top-level `update` keys.
    pub updates: u32,
    /// Some key of the params, at any depth, holds an escape (and is in no count above).
    pub escaped: bool,
}

impl<'a> ParamsKeys<'a> {
    /// `params` (the text these keys were counted in) split around the first top-level
    /// `sessionId`'s value: what comes before it and what comes after.
    pub fn around_session_id(&self, params: &'a str) -> Option<(&'a str, &'a str)> {
        let span = crate::session_routes::span_in(params, self.session_id?)?;
        Some((params.get(..span.start)?, params.get(span.end..)?))
    }
}

/// What the line holds when it is valid JSON.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Shape<'a> {
    Object(Fields<'a>),
    Array,
    /// A string, number, literal.
    Scalar,
}

/// Why a line was refused, with the 1-based byte column where it was noticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ScanError {
    /// Not JSON.
    Syntax { what: &'static str, column: usize },
    /// An envelope key of the top-level object written twice (however spelled).
    Duplicate { key: &'static str, column: usize },
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::Syntax { what, column } => write!(f, "{what} at column {column}"),
            ScanError::Duplicate { key, column } => {
                write!(f, "duplicate field `{key}` at column {column}")
            }
        }
    }
}

mod strings;
mod template;

pub use template::LineTemplate;

const KEYS: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];

/// Which of [`KEYS`] `key` is.
fn envelope_key(key: &[u8]) -> Option<usize> {
    match key {
        b"jsonrpc" => Some(0),
        b"id" => Some(1),
        b"method" => Some(2),
        b"params" => Some(3),
        b"result" => Some(4),
        b"error" => Some(5),
        _ => None,
    }
}

/// Scans `line` as one JSON value.
pub(super) fn scan(line: &[u8]) -> Result<Shape<'_>, ScanError> {
    let mut s = Scanner::new(line);
    s.ws();
    let shape = match s.peek() {
        Some(b'{') => {
            s.i += 1;
            s.top_object()?;
            Shape::Object(Fields::default())
        }
        Some(b'[') => {
            s.value()?;
            Shape::Array
        }
        _ => {
            s.value()?;
            Shape::Scalar
        }
    };
    s.ws();
    if s.i < s.b.len() {
        return Err(s.err("trailing characters"));
    }
    debug_assert!(std::str::from_utf8(line).is_ok());
    // SAFETY: the scan accepted every byte of `line`: each one outside a string is ASCII (JSON's
    // syntax, whitespace, digits, literals), each one inside a string is ASCII or part of a
    // character `utf8_char` checked with `std::str::from_utf8`; so `line` is UTF-8.
    let text = unsafe { std::str::from_utf8_unchecked(line) };
    Ok(match shape {
        Shape::Object(_) => {
            let span = |slot: Option<(usize, usize)>| slot.and_then(|(a, b)| text.get(a..b));
            let field = |k: usize| span(s.slots[k]);
            Shape::Object(Fields {
                jsonrpc: field(0),
                id: field(1),
                method: field(2),
                params: field(3),
                result: field(4),
                error: field(5),
                keys: ParamsKeys {
                    session_id: span(s.session_id),
                    ..s.keys
                },
            })
        }
        other => other,
    })
}

/// Which containers are open: objects are 1 bits. Sixty-four levels need no allocation.
#[derive(Default)]
struct Nest {
    depth: usize,
    shallow: u64,
    deep: Vec<bool>,
}

impl Nest {
    fn push(&mut self, object: bool) {
        if self.depth < 64 {
            self.shallow = (self.shallow & !(1 << self.depth)) | (u64::from(object) << self.depth);
        } else {
            self.deep.push(object);
        }
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth -= 1;
        if self.depth >= 64 {
            self.deep.pop();
        }
    }

    fn in_object(&self) -> bool {
        match self.depth - 1 {
            d if d < 64 => self.shallow >> d & 1 == 1,
            _ => self.deep.last().copied().unwrap_or(false),
        }
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    nest: Nest,
    /// Set while the top-level `params` object is scanned: its keys are counted in `keys`.
    in_params: bool,
    /// The next value is the first top-level `sessionId`'s: kept when it is a string.
    capture: bool,
    keys: ParamsKeys<'a>,
    /// Where the first top-level `sessionId`'s string value lies.
    session_id: Option<(usize, usize)>,
    /// Where each envelope key's value lies, in [`KEYS`]' order.
    slots: [Option<(usize, usize)>; 6],
}

impl<'a> Scanner<'a> {
    fn new(b: &'a [u8]) -> Self {
        Scanner {
            b,
            i: 0,
            nest: Nest::default(),
            in_params: false,
            capture: false,
            keys: ParamsKeys::default(),
            session_id: None,
            slots: [None; 6],
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn err(&self, what: &'static str) -> ScanError {
        ScanError::Syntax {
            what,
            column: self.i + 1,
        }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// The top-level object after its `{`: every key decoded, the envelope keys' values kept.
    fn top_object(&mut self) -> Result<(), ScanError> {
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            match self.peek() {
                Some(b'"') => self.i += 1,
                Some(_) => return Err(self.err("key must be a string")),
                None => return Err(self.err("EOF while parsing an object")),
            }
            let column = self.i;
            let key_index = self.key()?;
            if let Some(k) = key_index
                && self.slots[k].is_some()
            {
                return Err(ScanError::Duplicate {
                    key: KEYS[k],
                    column,
                });
            }
            self.ws();
            match self.peek() {
                Some(b':') => self.i += 1,
                Some(_) => return Err(self.err("expected `:`")),
                None => return Err(self.err("EOF while parsing an object")),
            }
            self.ws();
            let start = self.i;
            self.in_params = key_index == Some(3) && self.peek() == Some(b'{');
            self.value()?;
            self.in_params = false;
            if let Some(k) = key_index {
                self.slots[k] = Some((start, self.i));
            }
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b'}') {
                        return Err(self.err("trailing comma"));
                    }
                }
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(_) => return Err(self.err("expected `,` or `}`")),
                None => return Err(self.err("EOF while parsing an object")),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let from = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - from
    }

    /// A number, its sign already passed.
    fn number(&mut self) -> Result<(), ScanError> {
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.err("invalid number"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.err("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("invalid number"));
            }
        }
        Ok(())
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), ScanError> {
        for &c in word {
            match self.peek() {
                Some(b) if b == c => self.i += 1,
                Some(_) => return Err(self.err("expected ident")),
                None => return Err(self.err("EOF while parsing a value")),
            }
        }
        Ok(())
    }

    /// One value of any depth, iteratively (a hostile line nests as deep as it is long).
    fn value(&mut self) -> Result<(), ScanError> {
        let base = self.nest.depth;
        loop {
            // A value is expected here.
            self.ws();
            let capture = std::mem::replace(&mut self.capture, false);
            match self.peek() {
                Some(b'"') => {
                    let start = self.i;
                    self.i += 1;
                    self.string()?;
                    if capture {
                        self.session_id = Some((start, self.i));
                    }
                }
                Some(b'-') => {
                    self.i += 1;
                    self.number()?;
                }
                Some(b'0'..=b'9') => self.number()?,
                Some(b'n') => self.literal(b"null")?,
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(open @ (b'{' | b'[')) => {
                    self.i += 1;
                    self.ws();
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                    } else {
                        self.nest.push(open == b'{');
                        if open == b'{' {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                Some(_) => return Err(self.err("expected value")),
                None => return Err(self.err("EOF while parsing a value")),
            }
            // A value ended: a comma, or the end of its container (and maybe more).
            loop {
                if self.nest.depth == base {
                    return Ok(());
                }
                self.ws();
                let object = self.nest.in_object();
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        if object {
                            self.ws();
                            self.member_key()?;
                        }
                        break;
                    }
                    Some(b'}') if object => {
                        self.i += 1;
                        self.nest.pop();
                    }
                    Some(b']') if !object => {
                        self.i += 1;
                        self.nest.pop();
                    }
                    Some(_) if object => return Err(self.err("expected `,` or `}`")),
                    Some(_) => return Err(self.err("expected `,` or `]`")),
                    None if object => return Err(self.err("EOF while parsing an object")),
                    None => return Err(self.err("EOF while parsing a list")),
                }
            }
        }
    }

    /// A nested object's key (skipped, as serde_json skips it) and its colon.
    #[inline]
    fn member_key(&mut self) -> Result<(), ScanError> {
        match self.peek() {
            Some(b'"') => self.i += 1,
            Some(_) => return Err(self.err("key must be a string")),
            None => return Err(self.err("EOF while parsing an object")),
        }
        let start = self.i;
        let escaped = self.string()?;
        if self.in_params {
            self.count_key(start, escaped);
        }
        self.ws();
        match self.peek() {
            Some(b':') => {
                self.i += 1;
                Ok(())
            }
            Some(_) => Err(self.err("expected `:`")),
            None => Err(self.err("EOF while parsing an object")),
        }
    }

    /// Counts a key of the params object (`start` is its first byte after the quote) in `keys`.
    fn count_key(&mut self, start: usize, escaped: bool) {
        let k = &mut self.keys;
        if escaped {
            k.escaped = true;
            return;
        }
        let key = &self.b[start..self.i - 1];
        let top = self.nest.depth == 1;
        let count = match key {
            b"sessionId" if top => {
                self.capture = k.session_ids == 0;
                &mut k.session_ids
            }
            b"update" if top => &mut k.updates,
            b"sessionUpdate" => &mut k.session_updates,
            b"sessionId" => &mut k.other_sessions,
            _ if key.ends_with(b"SessionId") => &mut k.other_sessions,
            _ => return,
        };
        *count = count.saturating_add(1);
    }
}
