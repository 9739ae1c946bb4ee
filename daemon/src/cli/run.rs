//! `acpd run`: one delegation, streamed to stdout, disposed at the end, mapped to an exit code.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use acpd_protocol::acp::ContentBlock;
use acpd_protocol::subagent::{
    Budget, Category, StartRequest, StopReason, SubagentResult, WorkspaceKind,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::progress::Progress;
use super::{EXIT_IO, EXIT_USAGE, config_or_usage, stdout_failed};
use crate::registry::{DepthContext, Registry, RegistryError, RunEvent, StartOptions};

const EXIT_ERROR: u8 = 1;
const EXIT_START_FAILED: u8 = 3;
const EXIT_REFUSAL: u8 = 4;
const EXIT_MAX_TOKENS: u8 = 5;
const EXIT_ABORTED: u8 = 6;
/// The agent needs credentials: at any stage (its start, or its first prompt), one code.
const EXIT_AUTH: u8 = 7;
/// The turn completed, but git refused to commit its work: the worktree stays, named on
/// stderr and in the result's `workspace.failure`.
const EXIT_UNCOMMITTED: u8 = 8;
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Provider to delegate to (default: the config's default_provider).
    #[arg(long)]
    provider: Option<String>,
    /// Working directory for the child (default: the current directory).
    #[arg(long, value_name = "DIR")]
    cwd: Option<PathBuf>,
    /// Print exactly one JSON object (the result, or {"error":…}) and nothing else on stdout.
    #[arg(long)]
    json: bool,
    /// No status line on stderr (it is shown only when stderr is a terminal).
    #[arg(long, short)]
    quiet: bool,
    /// Overrides the provider's run_timeout: `30s`, `1m30s`, or a bare number of seconds;
    /// reached: error, category timeout.
    #[arg(long, value_name = "DURATION", value_parser = super::client::parse_timeout)]
    timeout: Option<Duration>,
    /// Only these tools (repeatable): a tool filter, for providers that take one.
    #[arg(long = "allow-tool", value_name = "NAME")]
    allow_tools: Vec<String>,
    /// Never these tools (repeatable): a tool filter, for providers that take one.
    #[arg(long = "deny-tool", value_name = "NAME")]
    deny_tools: Vec<String>,
    /// Where the child works: `shared` (the cwd itself) or `worktree` (a git worktree of the
    /// cwd's repository on branch acpd/<run id>, where the provider allows it); default: the
    /// provider's `workspace`.
    #[arg(long, value_enum, value_name = "KIND")]
    workspace: Option<Workspace>,
    /// The commit the worktree starts from (a branch, tag or sha; default: the cwd's HEAD).
    #[arg(long = "ref", value_name = "REF")]
    base_ref: Option<String>,
    /// At most N tokens as the agent reports them, nested runs included; at most the
    /// provider's `budget.tokens`. Spent: error, category budget.
    #[arg(long, value_name = "N", value_parser = parse_tokens)]
    budget_tokens: Option<u64>,
    /// At most this long from the start, across turns: `30m`, `90s`, or bare seconds; at most
    /// the provider's `budget.wall`. Spent: error, category budget.
    #[arg(long, value_name = "DURATION", value_parser = parse_wall)]
    budget_wall: Option<String>,
    #[command(flatten)]
    pub setup: super::Setup,
    /// The prompt; `-` reads it from stdin.
    #[arg(required = true, num_args = 1.., value_name = "PROMPT")]
    prompt: Vec<String>,
}

/// `--workspace`: the start request's `workspace`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Workspace {
    Shared,
    Worktree,
}

impl From<Workspace> for WorkspaceKind {
    fn from(w: Workspace) -> WorkspaceKind {
        match w {
            Workspace::Shared => WorkspaceKind::Shared,
            Workspace::Worktree => WorkspaceKind::Worktree,
        }
    }
}

/// `--budget-tokens`: a count of at least one.
fn parse_tokens(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("the token budget must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!(
            "{text:?} is not a count of tokens ({e}); write e.g. 200000"
        )),
    }
}

/// `--budget-wall`: checked here with the one duration parser, above zero, and sent as the
/// user wrote it, so the registry reads the same duration and its errors quote the same text.
fn parse_wall(text: &str) -> Result<String, String> {
    if crate::durations::parse_flag(text)?.is_zero() {
        return Err("the wall budget must be above zero".into());
    }
    Ok(text.trim().to_string())
}

impl RunArgs {
    /// The request's `budget`, when a `--budget-*` flag asks for one.
    fn budget(&self) -> Option<Budget> {
        (self.budget_tokens.is_some() || self.budget_wall.is_some()).then(|| Budget {
            tokens: self.budget_tokens,
            wall: self.budget_wall.clone(),
        })
    }
}

pub(super) async fn run(config_path: Option<&Path>, args: RunArgs) -> u8 {
    let code = run_disposed(config_path, args).await;
    // Every way out has disposed of the run (or never started one): the record goes.
    crate::supervise::forget_records();
    code
}

async fn run_disposed(config_path: Option<&Path>, args: RunArgs) -> u8 {
    let config = match config_or_usage(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let from_stdin = args.prompt.len() == 1 && args.prompt[0] == "-";
    let prompt = if from_stdin {
        let mut text = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut text) {
            errln!("acpd: cannot read the prompt from stdin: {e}");
            return EXIT_USAGE;
        }
        text
    } else {
        args.prompt.join(" ")
    };
    let caller_cwd = match std::env::current_dir() {
        Ok(d) => d,
        Err(e) => {
            errln!("acpd: cannot read the current directory: {e}");
            return EXIT_USAGE;
        }
    };
    let cwd = args.cwd.as_ref().map(|d| caller_cwd.join(d));
    let provider = args
        .provider
        .clone()
        .unwrap_or_else(|| config.default_provider.clone());

    if let Err(code) = super::daemon::contain(&config) {
        return code;
    }
    crate::supervise::init();
    crate::supervise::keep_records();
    let registry = Registry::new(config, DepthContext::from_env());
    // What the child is offered to delegate in turn (`offer_delegation`), nested under this run.
    let nest = crate::runtime::NestSocket::open_for(&registry);
    // `stop` ends the run early: on a signal (`interrupted`) or when stdout is gone.
    let stop = CancellationToken::new();
    let interrupted = CancellationToken::new();
    tokio::spawn(watch_signals(interrupted.clone(), stop.clone()));
    let stdout_closed = CancellationToken::new();
    watch_stdout(stdout_closed.clone(), stop.clone());

    let progress = Progress::new(!args.json && !args.quiet);
    progress.set(format!("starting {provider}…"));
    let (sink, printer) = if args.json {
        (None, None)
    } else {
        let (tx, rx) = mpsc::channel::<String>(64);
        let printing = print_stream(rx, stop.clone(), progress.clone());
        (Some(tx), Some(tokio::spawn(printing)))
    };
    let interactive =
        !from_stdin && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let events = (interactive || progress.active()).then(|| {
        let (tx, rx) = mpsc::channel::<RunEvent>(4);
        tokio::spawn(on_events(rx, progress.clone()));
        tx
    });

    let request = StartRequest {
        provider: args.provider.clone(),
        prompt: vec![ContentBlock::from(prompt)],
        cwd,
        tool_filter: (!args.allow_tools.is_empty() || !args.deny_tools.is_empty()).then(|| {
            acpd_protocol::tool_filter::ToolFilter {
                allow: (!args.allow_tools.is_empty()).then(|| args.allow_tools.clone()),
                deny: (!args.deny_tools.is_empty()).then(|| args.deny_tools.clone()),
            }
        }),
        workspace: args.workspace.map(WorkspaceKind::from),
        base_ref: args.base_ref.clone(),
        budget: args.budget(),
        ..Default::default()
    };
    let started = registry
        .start(StartOptions {
            request,
            caller_cwd: Some(caller_cwd),
            run_timeout: args.timeout,
            sink,
            forward_permissions: interactive,
            events,
            cancel: stop.clone(),
            ..Default::default()
        })
        .await;
    let published = match started {
        Ok(p) => p,
        Err(_) if stdout_closed.is_cancelled() => return closed_stdout(),
        Err(e) => {
            progress.done();
            if args.json {
                if let Err(e) = outln!("{}", serde_json::json!({ "error": e.body() })) {
                    return stdout_failed(&e);
                }
            } else {
                errln!("acpd: {e}");
            }
            if let Some(hint) = flag_hint(&e, &args) {
                errln!("acpd: {hint}");
            }
            return if interrupted.is_cancelled() {
                EXIT_INTERRUPTED
            } else if is_auth(e.data().pointer("/failure/category")) {
                EXIT_AUTH
            } else {
                EXIT_START_FAILED
            };
        }
    };

    let canceller = {
        let registry = registry.clone();
        let run_id = published.run_id.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            let _ = registry.cancel(0, &run_id);
        })
    };
    let result = registry.wait(0, &published.run_id).await;
    let kept = registry
        .dispose_with(0, &published.run_id, true, false)
        .await
        .ok()
        .flatten();
    canceller.abort();
    if let Some(nest) = nest {
        nest.close().await;
    }
    // Every sender of the output stream is gone with the run; the printer drains and ends.
    drop(registry);
    let streamed = match printer {
        Some(printer) => printer.await.unwrap_or(Ok(())),
        None => Ok(()),
    };
    progress.done();
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            errln!("acpd: {e}");
            return EXIT_ERROR;
        }
    };
    if stdout_closed.is_cancelled() && streamed.is_ok() {
        return closed_stdout();
    }
    if let Err(e) = streamed.and_then(|()| report(&result, args.json)) {
        return stdout_failed(&e);
    }
    if let Some(kept) = &kept {
        errln!(
            "acpd: the worktree {} stays: its work is not committed on the run's branch ({}); commit or copy it there, then `git worktree remove --force {}`",
            kept.path.display(),
            kept.message,
            kept.path.display()
        );
    }
    if interrupted.is_cancelled() {
        return EXIT_INTERRUPTED;
    }
    if result
        .failure
        .as_ref()
        .is_some_and(|f| f.category == Category::Auth)
    {
        return EXIT_AUTH;
    }
    match result.stop_reason {
        StopReason::Completed if kept.is_some() => EXIT_UNCOMMITTED,
        StopReason::Completed => 0,
        StopReason::Error => EXIT_ERROR,
        StopReason::Refusal => EXIT_REFUSAL,
        StopReason::MaxTokens => EXIT_MAX_TOKENS,
        StopReason::Aborted => EXIT_ABORTED,
    }
}

/// The result: on stdout with `--json` (an error is a stdout that cannot be written),
/// else its diagnostic on stderr.
fn report(result: &SubagentResult, json: bool) -> std::io::Result<()> {
    if json {
        return outln!("{}", serde_json::to_string(result).unwrap_or_default());
    }
    if result.output_truncated {
        errln!("acpd: output truncated at max_output");
    }
    if let Some(d) = &result.diagnostic {
        errln!("acpd: {} — {d}", result.stop_reason);
    }
    Ok(())
}

/// Streams text to stdout as it arrives, ending with a newline if the text did not; on a
/// terminal, with the agent's control characters escaped (its lines and tabs kept). When
/// stdout cannot be written the run is stopped (`stop`), the rest of the stream is drained
/// unprinted, and the error returned. The status line goes when the text starts on the same
/// terminal; with stdout elsewhere it says the reply is streaming.
async fn print_stream(
    mut rx: mpsc::Receiver<String>,
    stop: CancellationToken,
    progress: Progress,
) -> std::io::Result<()> {
    let mut last = b'\n';
    let mut first = true;
    let terminal = std::io::stdout().is_terminal();
    while let Some(text) = rx.recv().await {
        let text = if terminal {
            crate::trace::escape_controls_keeping_lines(&text).into_owned()
        } else {
            text
        };
        if std::mem::take(&mut first) {
            if terminal {
                progress.done();
            } else {
                progress.set("streaming the reply to stdout");
            }
        }
        if let Some(&b) = text.as_bytes().last() {
            last = b;
        }
        let written = {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        };
        if let Err(e) = written {
            stop.cancel();
            while rx.recv().await.is_some() {}
            return Err(e);
        }
    }
    if last != b'\n' {
        return outln!("");
    }
    Ok(())
}

/// Stops the run as soon as stdout reports an error, which a pipe does once its reader has
/// closed: a long run is not sat through for nobody (`--json` writes only at the end).
/// Files and terminals report nothing; for them the first failed write is what counts.
fn watch_stdout(closed: CancellationToken, stop: CancellationToken) {
    use std::os::fd::AsFd;
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned() else {
        return;
    };
    // SAFETY: the AsyncFd owns `fd` (a duplicate of stdout), so it stays open and names the
    // same open file description for as long as the AsyncFd lives.
    let Ok(watched) = (unsafe { AsyncFd::register_with_interest(fd, Interest::ERROR) }) else {
        return;
    };
    tokio::spawn(async move {
        if watched.ready(Interest::ERROR).await.is_ok() {
            closed.cancel();
            stop.cancel();
        }
    });
}

/// What to do about a start error one of the isolation flags caused, in the flags' terms
/// (the registry's message names the request's fields).
fn flag_hint(e: &RegistryError, args: &RunArgs) -> Option<String> {
    match e {
        RegistryError::UnsupportedCapability {
            provider,
            capability: "workspace",
        } => Some(format!(
            "--workspace worktree needs a provider that allows worktrees: set workspace = \
             \"worktree\" under [providers.{provider}] in the config, or leave --workspace out"
        )),
        RegistryError::InvalidRequest { reason }
            if reason.starts_with("budget") && args.budget().is_some() =>
        {
            Some(
                "--budget-tokens and --budget-wall may lower the provider's budget, never raise \
                 it"
                .into(),
            )
        }
        RegistryError::InvalidRequest { reason } if reason.starts_with("`ref`") => Some(
            "--ref needs --workspace worktree (or a provider whose workspace is worktree)".into(),
        ),
        _ => None,
    }
}

/// Whether a start error's `failure.category` is `auth`.
fn is_auth(category: Option<&serde_json::Value>) -> bool {
    category.and_then(|c| c.as_str()) == Some(Category::Auth.as_str())
}

fn closed_stdout() -> u8 {
    errln!("acpd: cannot write to stdout: it was closed; the run was cancelled");
    EXIT_IO
}

/// Ctrl-C or SIGTERM cancels the run (the child is asked to cancel, then torn down).
async fn watch_signals(interrupted: CancellationToken, stop: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    errln!("acpd: interrupted; cancelling the run");
    interrupted.cancel();
    stop.cancel();
}

/// Follows the run for the status line, and asks the user on the terminal about each
/// forwarded permission request (only sent when stdin and stderr are a terminal).
async fn on_events(mut rx: mpsc::Receiver<RunEvent>, progress: Progress) {
    while let Some(event) = rx.recv().await {
        match event {
            RunEvent::Started(started) => progress.set(format!(
                "{} initialized · waiting for its reply",
                started.provider
            )),
            RunEvent::Ask { ask, .. } => {
                let ask = *ask;
                progress.pause();
                let request = ask.request.clone();
                let answer = tokio::task::spawn_blocking(move || super::prompt::ask_tty(&request))
                    .await
                    .ok();
                let response = answer.unwrap_or_else(|| super::prompt::rejected(&ask.request));
                let _ = ask.reply.send(response);
                progress.resume();
            }
            _ => {}
        }
    }
}
