//! A turn's output: `agent_message_chunk` content in order, consecutive text joined into one
//! text block, other blocks kept as their own, capped at `max_output` bytes.

use acpd_protocol::acp::{ContentBlock, TextContent};

#[derive(Debug, Default)]
pub(super) struct Output {
    blocks: Vec<ContentBlock>,
    /// Text accumulated since the last non-text block; becomes one text block.
    text: String,
    bytes: usize,
    max: usize,
    truncated: bool,
}

impl Output {
    pub(super) fn new(max: usize) -> Self {
        Output {
            max,
            ..Default::default()
        }
    }

    /// Appends text, keeping at most `max` bytes in all (cut on a char boundary). Returns the
    /// part that was kept, for whoever streams it.
    pub(super) fn push_text<'a>(&mut self, text: &'a str) -> &'a str {
        // Once cut, stay cut: later text must not appear after a hole.
        let room = if self.truncated {
            0
        } else {
            self.max.saturating_sub(self.bytes)
        };
        let kept = if text.len() <= room {
            text
        } else {
            self.truncated = true;
            acpd_protocol::utf8::head(text, room)
        };
        self.bytes += kept.len();
        self.text.push_str(kept);
        kept
    }

    /// Appends a non-text block; its serialised size counts against the cap.
    pub(super) fn push_block(&mut self, block: ContentBlock) {
        let size = serde_json::to_vec(&block).map_or(0, |v| v.len());
        if self.truncated || self.bytes + size > self.max {
            self.truncated = true;
            return;
        }
        self.bytes += size;
        self.flush_text();
        self.blocks.push(block);
    }

    fn flush_text(&mut self) {
        if !self.text.is_empty() {
            let text = std::mem::take(&mut self.text);
            self.blocks.push(ContentBlock::Text(TextContent::new(text)));
        }
    }

    pub(super) fn finish(mut self) -> (Vec<ContentBlock>, bool) {
        if self.truncated {
            crate::metrics::get().limit_hit(crate::metrics::Limit::MaxOutput)
        }
        self.flush_text();
        (self.blocks, self.truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(b: &ContentBlock) -> &str {
        match b {
            ContentBlock::Text(t) => &t.text,
            _ => "<block>",
        }
    }

    #[test]
    fn joins_text_and_keeps_blocks_in_order() {
        let mut out = Output::new(1024);
        out.push_text("a");
        out.push_text("b");
        out.push_block(ContentBlock::ResourceLink(
            acpd_protocol::acp::ResourceLink::new("f", "file:///f"),
        ));
        out.push_text("c");
        let (blocks, truncated) = out.finish();
        let texts: Vec<_> = blocks.iter().map(text_of).collect();
        assert_eq!(texts, ["ab", "<block>", "c"]);
        assert!(!truncated);
    }

    #[test]
    fn caps_on_a_char_boundary() {
        let mut out = Output::new(5);
        assert_eq!(out.push_text("abc"), "abc");
        assert_eq!(out.push_text("dé€"), "d", "é would cross the cap");
        assert_eq!(out.push_text("more"), "");
        let (blocks, truncated) = out.finish();
        assert_eq!(text_of(&blocks[0]), "abcd");
        assert!(truncated);
    }
}
