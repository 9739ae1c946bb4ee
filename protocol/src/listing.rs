//! Cursor pagination as ACP defines it for `session/list`: the client passes back the
//! `nextCursor` it was given, treats it as opaque, and the last page has no `nextCursor`.
//!
//! The cursor is an offset into the list as it is when each page is asked for. acpd builds the
//! list afresh for every request (merged from its store and its agents), so there is no
//! snapshot to hold a key into; a session created between two pages may shift the next one by
//! one entry, which ACP's listing, a convenience for pickers, tolerates.

/// Sessions per page when the caller has no reason to choose.
pub const PAGE: usize = 50;

/// Marks a cursor as ours, so one from an agent (or a stale client) is refused, not misread.
const PREFIX: &str = "acpd-p";

/// The page of `items` after `cursor` (an opaque token made by this function), and the cursor
/// of the next page. A cursor that is not one of ours is Err (the caller answers -32602). A
/// cursor past the end (the list shrank) gives an empty last page. `size` 0 counts as 1, so
/// paging always ends.
pub fn page<T>(
    items: Vec<T>,
    cursor: Option<&str>,
    size: usize,
) -> Result<(Vec<T>, Option<String>), String> {
    let start = match cursor {
        None => 0,
        Some(c) => offset(c).ok_or_else(|| unknown_cursor(c))?,
    };
    let size = size.max(1);
    let total = items.len();
    let end = start.saturating_add(size).min(total);
    let page: Vec<T> = items
        .into_iter()
        .skip(start)
        .take(end.saturating_sub(start))
        .collect();
    let next = (end < total).then(|| format!("{PREFIX}{end}"));
    Ok((page, next))
}

/// Like [`page`], but the page also stays within `budget` bytes, each item costing
/// `cost(item)` (the caller counts separators in it): no answer line outgrows the peer's line
/// limit however long the items are; the rest follows under the next cursor. An item that
/// alone exceeds `budget` can never be sent: it is passed over (counted in the third value),
/// so paging still ends.
pub fn page_within<T>(
    items: Vec<T>,
    cursor: Option<&str>,
    size: usize,
    budget: usize,
    cost: impl Fn(&T) -> usize,
) -> Result<(Vec<T>, Option<String>, usize), String> {
    let start = match cursor {
        None => 0,
        Some(c) => offset(c).ok_or_else(|| unknown_cursor(c))?,
    };
    let size = size.max(1);
    let total = items.len();
    let (mut page, mut used, mut skipped, mut end) = (Vec::new(), 0usize, 0usize, start);
    for item in items.into_iter().skip(start) {
        if page.len() >= size {
            break;
        }
        let c = cost(&item);
        if c > budget {
            skipped += 1;
            end += 1;
            continue;
        }
        if used.saturating_add(c) > budget {
            break;
        }
        used += c;
        page.push(item);
        end += 1;
    }
    let next = (end < total).then(|| format!("{PREFIX}{end}"));
    Ok((page, next, skipped))
}

/// The longest part of a refused cursor quoted back, in bytes: the error names what was sent
/// without echoing a megabyte of it (the answer line must stay within the peer's `max_line`).
const QUOTED_CURSOR: usize = 64;

/// The error for a cursor that is not one of ours, quoting at most [`QUOTED_CURSOR`] bytes of
/// it (cut on a character boundary; the full length said when cut).
fn unknown_cursor(c: &str) -> String {
    let quoted = crate::utf8::head(c, QUOTED_CURSOR);
    let shown = if quoted.len() < c.len() {
        format!("{quoted:?}… ({} bytes)", c.len())
    } else {
        format!("{c:?}")
    };
    format!("unknown cursor {shown}: pass a nextCursor from an earlier answer")
}

/// The offset in one of our cursors: digits only, written as we write them (no sign, no
/// leading zero), so every offset has exactly one cursor.
fn offset(cursor: &str) -> Option<usize> {
    let digits = cursor.strip_prefix(PREFIX)?;
    let n: usize = digits.parse().ok()?;
    (n > 0 && n.to_string() == digits).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_pages(n: usize, size: usize) -> Vec<Vec<usize>> {
        let mut pages = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let (page, next) = page((0..n).collect(), cursor.as_deref(), size).unwrap();
            pages.push(page);
            match next {
                Some(c) => cursor = Some(c),
                None => return pages,
            }
        }
    }

    #[test]
    fn pages_cover_the_list_once_in_order() {
        for n in [0, 1, 2, 49, 50, 51, 100, 101] {
            for size in [1, 2, 7, PAGE] {
                let pages = all_pages(n, size);
                let flat: Vec<usize> = pages.concat();
                assert_eq!(flat, (0..n).collect::<Vec<_>>(), "n={n} size={size}");
                assert!(pages.iter().all(|p| p.len() <= size));
                assert_eq!(pages.len(), n.div_ceil(size).max(1), "n={n} size={size}");
            }
        }
    }

    #[test]
    fn last_page_has_no_cursor() {
        assert_eq!(page(vec![1, 2], None, 2), Ok((vec![1, 2], None)));
        assert_eq!(page(Vec::<u8>::new(), None, PAGE), Ok((vec![], None)));
        let (first, next) = page(vec![1, 2, 3], None, 2).unwrap();
        assert_eq!(first, vec![1, 2]);
        assert_eq!(page(vec![1, 2, 3], next.as_deref(), 2), Ok((vec![3], None)));
    }

    #[test]
    fn cursor_past_the_end_is_an_empty_last_page() {
        let (_, next) = page((0..10).collect::<Vec<_>>(), None, 5).unwrap();
        assert_eq!(page(vec![1, 2], next.as_deref(), 5), Ok((vec![], None)));
    }

    #[test]
    fn zero_size_still_advances() {
        assert_eq!(all_pages(3, 0), vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn pages_within_a_budget_cover_the_fitting_items_once() {
        // Costs 1..=9 repeating, budget 10: every page fits, every item that fits is seen once.
        let items: Vec<usize> = (0..100).collect();
        let cost = |i: &usize| i % 9 + 1;
        let (mut seen, mut cursor) = (Vec::new(), None::<String>);
        loop {
            let (page, next, skipped) =
                page_within(items.clone(), cursor.as_deref(), PAGE, 10, cost).unwrap();
            assert_eq!(skipped, 0);
            assert!(!page.is_empty());
            assert!(page.iter().map(cost).sum::<usize>() <= 10);
            seen.extend(page);
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, items);
        // An item over budget alone is passed over, never stalls the paging.
        let (page, next, skipped) = page_within(vec![50, 1, 2], None, PAGE, 10, |i| *i).unwrap();
        assert_eq!((page, next, skipped), (vec![1, 2], None, 1));
    }

    #[test]
    fn foreign_cursors_are_err() {
        for c in [
            "",
            "5",
            "acpd-p",
            "acpd-p0",
            "acpd-p05",
            "acpd-p+5",
            "acpd-p-1",
            "acpd-p5 ",
            "acpd-p99999999999999999999999",
            "opaque-from-an-agent",
        ] {
            assert!(page(vec![1, 2, 3], Some(c), 1).is_err(), "{c:?}");
        }
    }

    /// Hostile review of issue 18: a refused cursor was quoted whole (escaped, so longer
    /// still), and a 1 MiB cursor made a 1 MiB error line past any `max_line`.
    #[test]
    fn a_refused_cursor_is_quoted_at_most_64_bytes() {
        for c in ["\u{1}".repeat(1 << 20), "é".repeat(1 << 19), "x".repeat(65)] {
            for e in [
                page(vec![1], Some(&c), 1).unwrap_err(),
                page_within(vec![1], Some(&c), 1, 10, |_| 1).unwrap_err(),
            ] {
                assert!(e.len() < 64 * 6 + 120, "{} bytes: {e:.200}", e.len());
                assert!(e.contains(&format!("({} bytes)", c.len())), "{e:.200}");
            }
        }
        let e = page(vec![1], Some("short"), 1).unwrap_err();
        assert!(e.contains("\"short\":"), "{e}");
    }
}
