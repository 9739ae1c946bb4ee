//! The one ceiling every duration acpd accepts is held to, and deadline arithmetic that cannot
//! overflow.
//!
//! `Instant + Duration` panics when the sum does not fit (`"18446744073709551615s"` parses as a
//! `Duration` fine), so a duration from a file, a flag or a request is refused above
//! [`CEILING`], and every deadline is computed with [`deadline`] (saturating), so a value that
//! slipped past a check still cannot crash a task.

use std::time::Duration;

/// The longest duration acpd accepts anywhere (config keys, flags, setup lines): 30 days.
/// Longer than any sensible timeout or grace, short enough that `now + d` always fits.
pub(crate) const CEILING: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// How [`CEILING`] is named in errors.
pub(crate) const CEILING_TEXT: &str = "30days";

/// `Err` with the reason when `d` is above [`CEILING`]; `shown` is the value as the user wrote it.
pub(crate) fn check(d: Duration, shown: &str) -> Result<Duration, String> {
    if d > CEILING {
        Err(format!(
            "{shown:?} is longer than the ceiling of {CEILING_TEXT} (write at most \"{CEILING_TEXT}\")"
        ))
    } else {
        Ok(d)
    }
}

/// Every duration flag's one parser (`--timeout 30s`): humantime syntax (`500ms`, `1m30s`),
/// a bare number being seconds (`5`), at most [`CEILING`].
pub(crate) fn parse_flag(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let d = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(text).map_err(|e| {
            format!("{text:?} is not a duration ({e}); write e.g. 5 (seconds), 5s, 1m30s or 500ms")
        })?,
    };
    check(d, text)
}

/// A duration a request carries (`budget.wall`): [`parse_flag`]'s syntax, written exactly as
/// it: letters, digits and single spaces between them. A request is a program's, not a
/// shell's: `"5s\n"` is a bug to name, not white space to guess past.
pub(crate) fn parse_exact(text: &str) -> Result<Duration, String> {
    let tidy = text.trim() == text
        && !text.contains("  ")
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b' ');
    if !tidy {
        return Err(format!(
            "{text:?} is not a duration: only letters, digits and single spaces between them; \
             write e.g. \"90s\" or \"30m\""
        ));
    }
    parse_flag(text)
}

/// `now + d`, capped at [`CEILING`] past now: never panics, whatever `d` is.
pub(crate) fn deadline(d: Duration) -> tokio::time::Instant {
    deadline_from(tokio::time::Instant::now(), d)
}

/// `from + d`, capped at [`CEILING`] past `from`.
pub(crate) fn deadline_from(from: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    let d = d.min(CEILING);
    // With d ≤ 30 days this only fails on a clock near the end of its range; then `from`
    // itself is the latest instant that is certain to exist.
    from.checked_add(d).unwrap_or(from)
}

/// [`deadline`] on the std clock (for waits on a plain thread).
pub(crate) fn deadline_std(d: Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d.min(CEILING)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_durations_make_deadlines_without_panicking() {
        let now = tokio::time::Instant::now();
        for d in [Duration::MAX, Duration::from_secs(u64::MAX), CEILING * 2] {
            assert!(deadline(d) >= now + CEILING);
            assert!(deadline_std(d) > std::time::Instant::now());
        }
        assert_eq!(
            deadline_from(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
    }

    #[test]
    fn flags_above_the_ceiling_are_refused() {
        assert_eq!(parse_flag("30days"), Ok(CEILING));
        let e = parse_flag("18446744073709551615s").unwrap_err();
        assert!(e.contains("ceiling of 30days"), "{e}");
        assert!(parse_flag("31days").is_err());
        assert!(parse_flag("soon").is_err());
    }

    #[test]
    fn a_requests_duration_is_written_exactly() {
        assert_eq!(parse_exact("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_exact("1m 30s"), Ok(Duration::from_secs(90)));
        for bad in [
            "5s\n", " 5s", "5s ", "5s\t", "1m\n30s", "1m  30s", "", "5\u{a0}s",
        ] {
            let e = parse_exact(bad).unwrap_err();
            assert!(e.contains("is not a duration"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn flags_take_bare_seconds_and_humantime_alike() {
        assert_eq!(parse_flag("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_flag("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_flag(" 1m30s "), Ok(Duration::from_secs(90)));
        assert_eq!(parse_flag("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_flag("2592001").unwrap_err().contains("ceiling"));
        let e = parse_flag("5 parsecs").unwrap_err();
        assert!(e.contains("write e.g. 5 (seconds), 5s"), "{e}");
    }
}
