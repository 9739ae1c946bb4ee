//! A one-line status on stderr (indicatif), redrawn in place while a command waits on
//! something slow (an agent starting, npm, a round of probes), so a terminal is never silent
//! for seconds. It exists only when stderr is a terminal and the command was not asked for
//! `--json` or `--quiet`; everywhere else every call is a no-op and nothing extra is written.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the spinner and the elapsed time are redrawn.
const TICK: Duration = Duration::from_millis(120);

/// The status line on the terminal now, so every other write to stderr (a log line, an
/// `acpd:` message) can take it off first ([`cleared_for`]).
static SHOWN: Mutex<Option<Weak<Mutex<Line>>>> = Mutex::new(None);

/// Runs `write` (to stderr) with the status line taken off the terminal and drawn again after,
/// so the text never lands in the middle of the line.
pub(crate) fn cleared_for<R>(write: impl FnOnce() -> R) -> R {
    let line = SHOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(Weak::upgrade);
    match line.and_then(|line| lock(&line).bar.clone()) {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

/// The status line; cheap to clone (clones share the line).
#[derive(Clone, Default)]
pub(crate) struct Progress(Option<Arc<Mutex<Line>>>);

struct Line {
    /// `None` while paused (a prompt owns the terminal) and once done.
    bar: Option<ProgressBar>,
    message: Cow<'static, str>,
    since: Instant,
    done: bool,
}

fn lock(line: &Mutex<Line>) -> MutexGuard<'_, Line> {
    line.lock().unwrap_or_else(|e| e.into_inner())
}

impl Line {
    fn show(&mut self) {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_elapsed(self.since.elapsed())
            .with_message(self.message.clone());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {wide_msg} {elapsed}") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(TICK);
        self.bar = Some(bar);
    }
}

impl Progress {
    /// A status line when `wanted` (no `--json`, no `--quiet`) and stderr is a terminal.
    pub(crate) fn new(wanted: bool) -> Progress {
        if !wanted || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let line = Arc::new(Mutex::new(Line {
            bar: None,
            message: Cow::Borrowed(""),
            since: Instant::now(),
            done: false,
        }));
        *SHOWN.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::downgrade(&line));
        Progress(Some(line))
    }

    /// Whether anything is drawn at all.
    pub(crate) fn active(&self) -> bool {
        self.0.is_some()
    }

    /// Shows `message` (escaped: it may name a provider or an agent) in place of the last.
    pub(crate) fn set(&self, message: impl Into<Cow<'static, str>>) {
        let Some(line) = &self.0 else {
            return;
        };
        let message: Cow<'static, str> = message.into();
        let message = match crate::trace::escape_controls(&message) {
            Cow::Borrowed(_) => message,
            Cow::Owned(escaped) => Cow::Owned(escaped),
        };
        let mut line = lock(line);
        if line.done {
            return;
        }
        line.message = message.clone();
        match &line.bar {
            Some(bar) => bar.set_message(message),
            None => line.show(),
        }
    }

    /// Takes the line off the terminal until [`Progress::resume`] (a prompt is shown).
    pub(crate) fn pause(&self) {
        if let Some(line) = &self.0
            && let Some(bar) = lock(line).bar.take()
        {
            bar.finish_and_clear();
        }
    }

    /// Puts a paused line back, unless it is done.
    pub(crate) fn resume(&self) {
        if let Some(line) = &self.0 {
            let mut line = lock(line);
            if !line.done && line.bar.is_none() {
                line.show();
            }
        }
    }

    /// Clears the line for good: what follows on the terminal says the rest.
    pub(crate) fn done(&self) {
        if let Some(line) = &self.0 {
            let mut line = lock(line);
            line.done = true;
            if let Some(bar) = line.bar.take() {
                bar.finish_and_clear();
            }
        }
    }

    /// Writes `f`'s output with the line taken off the terminal for the moment, so a report
    /// line (on stdout, the same terminal) never lands in the middle of the status line.
    pub(crate) fn above<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.0.as_ref().and_then(|line| lock(line).bar.clone()) {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
