//! The hot path's output: an own update spliced for the parent (the minted session id in place
//! of the child's), and the shape of the last one, so that a streamed chunk that differs from
//! it only in its text is forwarded as three copies with nothing parsed.

use std::ops::Range;

use acpd_protocol::envelope::{LineTemplate, lone_surrogates};

/// A forwarded update up to its params.
const UPDATE_PREFIX: &[u8] = br#"{"jsonrpc":"2.0","method":"session/update","params":"#;

/// Appends the update whose params are `before` the child's session id, then `minted` (the
/// parent's, as a JSON string), then `after` it, with its newline.
pub(super) fn splice(out: &mut Vec<u8>, before: &str, minted: &str, after: &str) {
    out.extend_from_slice(UPDATE_PREFIX);
    out.extend_from_slice(before.as_bytes());
    out.extend_from_slice(minted.as_bytes());
    out.extend_from_slice(after.as_bytes());
    out.extend_from_slice(b"}\n");
}

/// Own-session updates spliced and not yet queued toward the parent, each with its newline.
#[derive(Default)]
pub(super) struct UpdateBatch {
    pub(super) bytes: Vec<u8>,
    /// How many updates `bytes` holds (counted in the metrics when the batch is queued).
    pub(super) count: usize,
}

impl UpdateBatch {
    /// An update was appended from `start` on: counted, and traced when the session is.
    fn appended(&mut self, start: usize, tracer: Option<&crate::trace::Trace>) {
        self.count += 1;
        if let Some(trace) = tracer {
            let line = &self.bytes[start..self.bytes.len() - 1];
            trace.record(crate::trace::Hop::AcpdToParent, line);
        }
    }

    /// Appends the update [`splice`] makes.
    pub(super) fn splice(
        &mut self,
        before: &str,
        minted: &str,
        after: &str,
        tracer: Option<&crate::trace::Trace>,
    ) {
        let start = self.bytes.len();
        splice(&mut self.bytes, before, minted, after);
        self.appended(start, tracer);
    }
}

/// The last own update the hot path took: the template a line is held to, and that line's
/// spliced output before its last string's content and after it. A line that fits the
/// template has the same keys in the same places and differs only in that content (see
/// [`LineTemplate`]), so its output is `head`, its content, `tail`.
pub(super) struct UpdateShape {
    template: LineTemplate<4>,
    head: Box<[u8]>,
    tail: Box<[u8]>,
}

impl UpdateShape {
    /// `line`'s shape, where `before` and `after` (the params around the child's session id)
    /// lie in `line`, and `minted` is what [`splice`] puts between them; none when the line's
    /// last string is not a value in those params that a template can keep.
    pub(super) fn learn(line: &[u8], before: &str, after: &str, minted: &str) -> Option<Self> {
        let at = |piece: &str| (piece.as_ptr() as usize).wrapping_sub(line.as_ptr() as usize);
        let (a, c) = (at(before), at(after));
        let (b, e) = (a + before.len(), c + after.len());
        let text = std::str::from_utf8(line).ok()?;
        let template = LineTemplate::learn(text, a..e, [a, b, c, e])?;
        let content = match template.fits(line)? {
            (n, content) if n == line.len() => content,
            _ => return None,
        };
        // Where the content lands in the output: inside `after` (it is the line's last string,
        // so it comes after the session id).
        if content.start < c || content.end > e {
            return None;
        }
        let out_at = UPDATE_PREFIX.len() + before.len() + minted.len() + content.start - c;
        let mut out = Vec::new();
        splice(&mut out, before, minted, after);
        Some(UpdateShape {
            template,
            head: out[..out_at].into(),
            tail: out[out_at + content.len()..].into(),
        })
    }

    /// The line at the front of `bytes` when it fits this shape: its length and where its
    /// text lies (see [`LineTemplate::fits`]; it holds no newline). A text with a lone
    /// surrogate escape does not fit: the full path replaces it (`envelope::surrogates`), and
    /// only a text with an escape is looked at for one.
    pub(super) fn fits(&self, bytes: &[u8]) -> Option<(usize, Range<usize>)> {
        let (n, content, plain) = self.template.fits_plain(bytes)?;
        if !plain && lone_surrogates(&bytes[content.clone()]).next().is_some() {
            return None;
        }
        Some((n, content))
    }

    /// Appends `line`, which [fits](UpdateShape::fits) with its text at `content`, spliced as
    /// [`splice`] would.
    pub(super) fn put(
        &self,
        line: &[u8],
        content: Range<usize>,
        batch: &mut UpdateBatch,
        tracer: Option<&crate::trace::Trace>,
    ) {
        let start = batch.bytes.len();
        let out = &mut batch.bytes;
        out.reserve(self.head.len() + content.len() + self.tail.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(&line[content]);
        out.extend_from_slice(&self.tail);
        batch.appended(start, tracer);
    }

    /// Appends `line` (a whole line) spliced when it fits this shape; whether it did.
    pub(super) fn forward(
        &self,
        line: &[u8],
        batch: &mut UpdateBatch,
        tracer: Option<&crate::trace::Trace>,
    ) -> bool {
        match self.fits(line) {
            Some((n, content)) if n == line.len() => {
                self.put(line, content, batch, tracer);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use acpd_protocol::envelope::{MessageRef, parse_keyed};
    use proptest::prelude::*;

    use super::*;

    /// The params of `line` (an update) before its session id and after it, as the full path
    /// finds them.
    fn around(line: &[u8]) -> Option<(&str, &str)> {
        let (message, keys) = parse_keyed(line).ok()?;
        let MessageRef::Notification {
            params: Some(params),
            ..
        } = message
        else {
            return None;
        };
        keys.around_session_id(params.get())
    }

    /// What the full path makes of `line`: the params around its session id, spliced.
    fn full(line: &[u8], minted: &str) -> Option<Vec<u8>> {
        let (before, after) = around(line)?;
        let mut out = Vec::new();
        splice(&mut out, before, minted, after);
        Some(out)
    }

    fn learn(line: &str, minted: &str) -> Option<UpdateShape> {
        let (before, after) = around(line.as_bytes())?;
        UpdateShape::learn(line.as_bytes(), before, after, minted)
    }

    /// Chunks as agents write them: the text last, in the update or beside the session id,
    /// spaced or not.
    const SHAPES: &[(&str, &str)] = &[
        (
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""#,
            r#""}}}}"#,
        ),
        (
            r#"{"method":"session/update","jsonrpc":"2.0","params":{"update":{"sessionUpdate":"agent_thought_chunk","content":[{"type":"text","text":"a"}]},"sessionId":"s-1","note":""#,
            r#""}}"#,
        ),
        (
            r#"{ "jsonrpc" : "2.0" , "method" : "session/update" , "params" : { "update" : {} , "sessionId" : "s-1" , "_meta" : { "k" : [ ""#,
            r#"" ] } } } "#,
        ),
    ];

    #[test]
    fn a_line_that_does_not_name_its_text_last_has_no_shape() {
        let minted = r#""minted""#;
        let id_last = r#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{},"sessionId":"s-1"}}"#;
        assert!(learn(id_last, minted).is_none());
        let number_last =
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s-1","n":1}}"#;
        assert!(learn(number_last, minted).is_none());
    }

    proptest! {
        /// A line that fits the shape is forwarded byte for byte as the full path splices it;
        /// one that does not is left to the full path.
        #[test]
        fn a_fitting_line_is_spliced_as_the_full_path_splices_it(
            shape in 0..SHAPES.len(),
            first in "[a-z ]{0,8}",
            text in prop::collection::vec(prop_oneof![
                Just("a".to_owned()), Just("\\\"".to_owned()), Just("\"".to_owned()),
                Just("\\".to_owned()), Just("\\n".to_owned()), Just("\\u00e9".to_owned()),
                Just("é".to_owned()), Just("\u{1}".to_owned()), Just("}".to_owned()),
                Just(",\"sessionId\":\"x".to_owned()),
            ], 0..12),
        ) {
            let (head, tail) = SHAPES[shape];
            let minted = r#""minted-1""#;
            let learned = format!("{head}{first}{tail}");
            let fitted = learn(&learned, minted).expect("its text is its last string");
            let line = format!("{head}{}{tail}", text.concat());
            let mut batch = UpdateBatch::default();
            if fitted.forward(line.as_bytes(), &mut batch, None) {
                prop_assert_eq!(batch.count, 1);
                prop_assert_eq!(Some(batch.bytes), full(line.as_bytes(), minted));
            } else {
                prop_assert!(batch.bytes.is_empty());
                // Only a text that may break out of its string or is no JSON string's misses.
                let may_break = ["\"", "\\", "\u{1}", ",\"sessionId\":\"x"];
                prop_assert!(text.iter().any(|p| may_break.contains(&p.as_str())), "{}", line);
            }
        }
    }
}
