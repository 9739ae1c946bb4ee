//! Cutting text to a byte bound without splitting a character: titles, diagnostics, quoted
//! cursors and stderr lines are all bounded in bytes, and a cut inside a multi-byte character
//! would panic on slicing.

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn head(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(head("abc", 5), "abc");
        assert_eq!(head("abc", 2), "ab");
        // 'é' is two bytes, '€' three: a bound inside either backs off to its start.
        assert_eq!(head("aé", 2), "a");
        assert_eq!(head("a€b", 3), "a");
        assert_eq!(head("a€b", 4), "a€");
        assert_eq!(head("€", 0), "");
    }
}
