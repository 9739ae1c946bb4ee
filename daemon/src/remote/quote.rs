//! POSIX shell quoting for the one place a shell sits in the path: sshd hands the remote
//! command to the user's login shell as a string, so every word is quoted to come out as
//! exactly one argument again.

/// Characters a POSIX shell never treats specially in a word.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '_' | '-' | '.' | '/' | ',' | '+' | '=' | ':' | '@' | '%')
}

/// `word` as one shell word: unchanged when it has only plain characters (readable in logs),
/// else in single quotes, where nothing is special but the quote itself (`'` → `'\''`).
pub fn quote(word: &str) -> String {
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

// The round trip through a real `sh` is in tests/remote.rs: this library's test binary runs
// acpd's stray reaper, which may reap any child it did not spawn.
#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn plain_words_stay_readable() {
        assert_eq!(quote("/usr/bin/acpd"), "/usr/bin/acpd");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
    }
}
