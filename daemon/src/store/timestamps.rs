//! The one time format of the map: RFC 3339 UTC with milliseconds, so rows sort as text.

use std::time::{Duration, SystemTime};

/// Now, as the map writes times: RFC 3339 UTC with milliseconds, so sessions updated within
/// one second still sort newest first.
pub(crate) fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// A child's timestamp in our one format, so rows sort as text. Agents write RFC 3339 with
/// fractions or offsets (`2026-12-01T11:00:00.5+01:00`); what cannot be read becomes now,
/// which keeps the row listed rather than losing it.
pub(super) fn normalize_time(text: &str) -> String {
    parse_time(text.trim()).map_or_else(now, |t| humantime::format_rfc3339_millis(t).to_string())
}

fn parse_time(text: &str) -> Option<SystemTime> {
    // humantime reads UTC only (and after a fraction takes any `+HH:MM` for `+00:00`), so a
    // `±HH:MM` suffix is split off and applied here.
    let split = text
        .len()
        .checked_sub(6)
        .and_then(|at| text.split_at_checked(at));
    let Some((local, &[sign @ (b'+' | b'-'), h1, h2, b':', m1, m2])) =
        split.map(|(local, offset)| (local, offset.as_bytes()))
    else {
        return humantime::parse_rfc3339_weak(text).ok();
    };
    let digit = |b: u8| b.is_ascii_digit().then(|| u64::from(b - b'0'));
    let (hh, mm) = (digit(h1)? * 10 + digit(h2)?, digit(m1)? * 10 + digit(m2)?);
    if hh > 23 || mm > 59 {
        return None;
    }
    let shift = Duration::from_secs(hh * 3600 + mm * 60);
    let local = humantime::parse_rfc3339_weak(local).ok()?;
    if sign == b'+' {
        local.checked_sub(shift)
    } else {
        local.checked_add(shift)
    }
}
