//! The permission prompt of an interactive `acpd run`: the agent's question on stderr, the
//! answer read from the controlling terminal. A typo asks again instead of deciding; only an
//! empty line, end of input or an unreadable terminal rejects.

use std::io::{BufRead, BufReader, Read, Write};

use acpd_protocol::acp::{
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome,
};
use acpd_protocol::permission::{Decision, cancelled, decide};

/// The longest answer line read; the rest of a longer one is discarded.
const MAX_LINE: u64 = 1024;

/// Answers that are not a choice before the prompt gives up and rejects (a terminal that
/// keeps sending noise is not a person choosing).
const MAX_TRIES: usize = 20;

/// Asks on the terminal (`/dev/tty`) and returns the answer; a terminal that cannot be opened
/// rejects.
pub(super) fn ask_tty(request: &RequestPermissionRequest) -> RequestPermissionResponse {
    let mut stderr = std::io::stderr();
    let chosen = std::fs::File::open("/dev/tty")
        .ok()
        .and_then(|tty| choose(request, &mut BufReader::new(tty), &mut stderr));
    answer(request, chosen)
}

/// The answer when nobody chose: the rejecting option (or `cancelled` when there is none).
pub(super) fn rejected(request: &RequestPermissionRequest) -> RequestPermissionResponse {
    answer(request, None)
}

fn answer(request: &RequestPermissionRequest, chosen: Option<usize>) -> RequestPermissionResponse {
    match chosen.and_then(|i| request.options.get(i)) {
        Some(option) => RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
            SelectedPermissionOutcome::new(option.option_id.clone()),
        )),
        None if request.options.is_empty() => cancelled(),
        None => decide(request, Decision::Reject),
    }
}

/// Shows the question and its numbered options on `out`, reads lines from `input` until one
/// is an option's number (its index), or is empty or the end (`None`: reject). The agent's
/// text is escaped: it must not move the cursor or rewrite what the user reads.
fn choose(
    request: &RequestPermissionRequest,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Option<usize> {
    let shown = crate::trace::escape_controls;
    let n = request.options.len();
    if n == 0 {
        return None;
    }
    let title = request
        .tool_call
        .fields
        .title
        .as_deref()
        .unwrap_or("a tool call");
    let mut question = format!("\nacpd: the agent asks permission for {}:\n", shown(title));
    for (i, o) in request.options.iter().enumerate() {
        question.push_str(&format!("  {}) {}\n", i + 1, shown(&o.name)));
    }
    question.push_str(&format!("choose 1-{n} (Enter rejects): "));
    let _ = out
        .write_all(question.as_bytes())
        .and_then(|()| out.flush());
    for _ in 0..MAX_TRIES {
        let mut line = Vec::new();
        match input.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') && line.len() as u64 == MAX_LINE {
            // Drop the rest of an overlong line, so it is not read as the next answer.
            let _ = input.skip_until(b'\n');
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        match text.parse::<usize>() {
            Ok(k) if (1..=n).contains(&k) => return Some(k - 1),
            _ => {
                let again = format!(
                    "acpd: \"{}\" is not one of 1-{n}; type a number, or press Enter to reject: ",
                    shown(text)
                );
                let _ = out.write_all(again.as_bytes()).and_then(|()| out.flush());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RequestPermissionRequest {
        serde_json::from_str(
            r#"{"sessionId":"s","toolCall":{"toolCallId":"t","title":"rm \u001b[2J"},
                "options":[{"optionId":"a","name":"Allow","kind":"allow_once"},
                           {"optionId":"r","name":"Reject","kind":"reject_once"}]}"#,
        )
        .unwrap()
    }

    fn asked(typed: &str) -> (Option<usize>, String) {
        let mut out = Vec::new();
        let chosen = choose(&request(), &mut typed.as_bytes(), &mut out);
        (chosen, String::from_utf8(out).unwrap())
    }

    #[test]
    fn a_typo_asks_again_and_a_number_then_chooses() {
        let (chosen, shown) = asked("yes\n9\n1\n");
        assert_eq!(chosen, Some(0));
        assert_eq!(shown.matches("is not one of 1-2").count(), 2, "{shown}");
        assert!(shown.contains(r"rm \u{1b}[2J"), "escaped: {shown}");
    }

    #[test]
    fn an_empty_line_or_the_end_rejects() {
        assert_eq!(asked("\n1\n").0, None);
        assert_eq!(asked("x\n").0, None);
        let r = rejected(&request());
        assert_eq!(serde_json::to_value(r).unwrap()["outcome"]["optionId"], "r");
    }

    #[test]
    fn an_overlong_line_is_one_wrong_answer() {
        let typed = format!("{}\n2\n", "9".repeat(5000));
        let (chosen, shown) = asked(&typed);
        assert_eq!(chosen, Some(1));
        assert_eq!(shown.matches("is not one of").count(), 1, "{shown}");
    }
}
