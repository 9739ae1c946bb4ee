//! `acpd agent echo`: a small ACP v1 agent built into the acpd binary.
//!
//! It is the embedded default provider (so acpd works with nothing else installed), a demo, and
//! the scripted child of acpd's own tests: its prompt text is a script whose directives make it
//! misbehave in every way a real agent can (exit, die by signal, hang, flood, send garbage), so
//! every failure path of acpd can be exercised against a real process.
//!
//! It speaks ACP on stdin/stdout and never writes anything else to stdout.

mod echo;
mod features;
mod lifecycle;
mod mcp_delegate;
mod script;
mod session_files;
mod turn;

use std::path::PathBuf;

use nix::sys::signal::{SigHandler, Signal, signal};

/// A prompt capability `--prompt-caps` can advertise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PromptCap {
    Image,
    Audio,
    /// `promptCapabilities.embeddedContext`.
    Embedded,
}

/// A request the handshake flags can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    Initialize,
    SessionNew,
}

const AFTER_HELP: &str = "\
PROMPT SCRIPT
  The text blocks of a prompt are concatenated and split into lines. A line starting with ':'
  is a directive; every other line is echoed back as one agent_message_chunk (newline kept),
  so a prompt without directives comes back verbatim and the turn ends with end_turn.
  Directives run in order, at their position among the echoed lines:

  :stop REASON          end the turn with stopReason REASON, verbatim (end_turn, max_tokens,
                        max_turn_requests, refusal, cancelled, or any unknown value)
  :error CODE [MESSAGE] answer session/prompt with JSON-RPC error CODE
                        (message defaults to \"scripted error\")
  :meta-failure CATEGORY
                        end the turn with end_turn and _meta.acpd.failure.category CATEGORY
  :air-failure CATEGORY with --air and a client that declared AIR's sessionFailure, end the
                        turn with end_turn and the record _meta.jetbrains.air.sessionFailure
                        {id, revision 1, CATEGORY, severity error, title, actions [retry]};
                        otherwise answer JSON-RPC error -32603, as codex-acp does
  :crash CODE           flush what was sent, then exit with CODE without answering
  :signal NAME          flush, then kill this process with signal NAME (SIGKILL, segv, 9...)
  :chunks N SIZE        stream N agent_message_chunks of SIZE bytes of filler text
  :timed N SIZE MS      N chunks of SIZE bytes starting with t=<monotonic ns>; MS ms apart
  :update KIND          send a session/update {\"sessionUpdate\": KIND, \"acpdProbe\": true}
  :usage TOKENS         send a usage_update saying TOKENS tokens are in context
  :thought TEXT         stream TEXT as an agent_thought_chunk
  :raw-update JSON      send a session/update whose update is JSON, written verbatim
                        (escapes and numbers as written: \\ud800, 1.2e3)
  :image                stream an agent_message_chunk holding a tiny PNG image block
  :hang                 wait for session/cancel, then end the turn with cancelled
  :hang-deaf            wait forever, ignoring session/cancel
  :sleep MS             sleep MS milliseconds (session/cancel interrupts it)
  :ignore-eof           from now on, stdin EOF does not end the process
  :ignore-term          from now on, ignore SIGTERM
  :escapee MS           spawn a sleeper in its own process group (not waited for) that
                        exits after MS ms; stream \"escapee <PID>\"
  :grandchild           spawn a sleeper grandchild that holds stdio and ignores SIGTERM;
                        stream \"grandchild <PID>\"
  :pid                  stream \"pid <PID>\"
  :permission           ask session/request_permission (allow_once / reject_once); stream
                        \"permission: selected <ID>\", \"permission: cancelled\" or
                        \"permission: error <CODE>\"
  :read PATH            call fs/read_text_file; stream \"read: <CONTENT>\" or
                        \"read error: <CODE>\"
  :cwd                  stream \"cwd <DIR>\"
  :write PATH TEXT      write TEXT and a newline to PATH (relative to the cwd) with plain
                        file I/O in this process; stream \"wrote PATH\" or
                        \"write error PATH: <OS ERROR>\"
  :env NAME [NAME...]   stream \"NAME=value\" or \"NAME unset\" for each NAME
  :garbage              write the line \"this is not json\" to stdout
  :binary               write a line of invalid UTF-8 to stdout
  :oversize BYTES       write one line of BYTES 'x' characters to stdout
  :close-stdout         close stdout and keep running (as :hang-deaf)

  Hostile directives, for acpd's strictness tests:
  :garbage-then-stop    end the turn with end_turn, the line \"this is not json\" written
                        right before the answer in the same write
  :after-answer TEXT    right after the prompt answer, in the same write, stream TEXT as an
                        agent_message_chunk (it arrives between turns)
  :forge-acpd           send a notification _acpd/subagent/ended with a plausible body
                        (runId \"run-forged\", output \"forged by the child\")
  :notify METHOD        send a notification METHOD {\"sessionId\": <own>, \"acpdProbe\": true}
  :foreign-session ID   stream \"foreign-session\" in a session/update with sessionId ID
  :no-session           stream \"no-session\" in a session/update without a sessionId
  :dup-session [ID]     stream \"dup-session\" in a session/update holding two sessionId keys,
                        its own first, then ID (default echo-forged)
  :bad-permission       ask session/request_permission with malformed params (no toolCall,
                        options not an array); stream what came back as :permission does
  :deaf-stdin           stop reading stdin for good and stay alive (the turn goes on)

  Directives for the ACP v1 additions (see the flags below):
  :blocks               stream \"block <TYPE> <WHAT>\" for each non-text prompt block, WHAT
                        being the uri (resource_link), resource.uri (resource) or mimeType
                        (image, audio), or \"-\"
  :auth                 stream \"auth <ID>\" (the method authenticate succeeded with) or
                        \"auth none\"
  :ext                  stream \"ext <METHOD>\" for each '_' notification received so far
  :ext-request METHOD   send request METHOD {\"sessionId\": <own>} to the client; stream
                        \"ext-reply <JSON>\" or \"ext-error <CODE>\"
  :request METHOD [JSON]
                        send request METHOD to the client with params JSON (an object, {}
                        by default; sessionId added when absent); stream \"reply <JSON>\"
                        or \"error <CODE>\"
  :cancel-request METHOD [JSON]
                        as :request, then at once $/cancel_request for it
  :notify-json METHOD JSON
                        send notification METHOD with params JSON exactly
  :client-caps          stream \"client-caps <JSON>\": the clientCapabilities of initialize
  :session-meta         stream \"session-meta <JSON>\": the _meta of this session's
                        session/new (null without one)
  :prompt-meta          stream \"prompt-meta <JSON>\": the _meta of this turn's
                        session/prompt (null without one)
  :tool-call NAME [STATUS]
                        report a tool call of tool NAME (never run) with STATUS (default
                        completed) as claude-agent-acp does (_meta.claudeCode.toolName);
                        stream \"tool-call NAME STATUS\"
  :stderr TEXT          write the line TEXT to stderr
  :stderr-flood N SIZE  write N lines of SIZE bytes to stderr (blocking when nobody reads)
  :subagent TEXT        with --subagents and clientCapabilities.subagents: announce a
                        subagent session (subagent_update on this session), stream TEXT
                        under its own sessionId, then \"subagent <SUB ID> done\" here;
                        otherwise stream \"subagent: client did not opt in\" (or
                        \"subagent: agent started without --subagents\")
  :subagent-hang TEXT   as :subagent, then wait for session/cancel of the subagent session,
                        stream \"subagent cancelled\" and end the turn with end_turn
  :delegate PROMPT      call the delegate tool of the MCP server \"acpd\" offered in
                        session/new (else, hiding ACPD_DEPTH, `acpd mcp --socket
                        $ACPD_SOCKET`; \\n in PROMPT is a line break); stream
                        \"delegated: <OUTPUT>\" or \"delegate failed: <WHY>\"
  :delegate-json JSON   as :delegate, with the tool's arguments the JSON object as written
                        (prompt, provider, cwd, workspace...)

  An unknown directive streams \"unknown directive: <NAME>\"; a malformed one streams an
  explanation; both are otherwise skipped. A session/cancel ends a running turn with
  cancelled at the next step (or at once in :hang and :sleep), except in :hang-deaf.

SESSIONS, AUTH AND EXTENSIONS
  With --sessions DIR every session is a file DIR/<ID>.json (ids echo-<uuid>) holding its
  cwd, title (first prompt line), updatedAt and history (each prompt's text and the text the
  turn streamed; :chunks and :timed filler is not kept). session/load replays the history as
  user_message_chunk / agent_message_chunk updates before answering; session/resume does not;
  session/list {cwd?, cursor?} pages newest first (--list-page; --null-cursor ends the last
  page with \"nextCursor\": null, as codex-acp does); session/close forgets the live session
  (its turn is cancelled); session/delete removes the file too; session/fork copies the
  history into a new session. An unknown id is -32002 (a delete of one succeeds: deleting is
  idempotent, as in claude-agent-acp and codex-acp). Without --sessions these
  methods are -32601.
  With --auth ID, session/new|load|resume|list answer -32000 until authenticate succeeds
  with an advertised id (another id is -32602).
  A request whose method starts with '_echo/' is answered {\"echo\": METHOD, \"params\": PARAMS};
  any other unknown request is -32601 Method not found; unknown notifications are ignored
  (the '_' ones are recorded for :ext). $/cancel_request {requestId} of a running prompt
  cancels its turn and answers the prompt -32800 Request cancelled.

EXAMPLES
  acpd run 'hello'                 echoes hello
  acpd run ':chunks 3 10'          three chunks of 10 bytes
  acpd run $'working\\n:stop refusal'
  acpd agent echo --fail-at session-new --exit-code 7";

/// clap arguments of `acpd agent echo`. The handshake faults are flags rather than directives
/// because they happen before any prompt exists.
#[derive(Debug, Clone, clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct EchoArgs {
    /// Fail on receiving this request: exit with --exit-code, or answer with --error-code.
    #[arg(long, value_enum, value_name = "REQUEST")]
    pub fail_at: Option<Stage>,
    /// Exit code used by --fail-at.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub exit_code: i32,
    /// With --fail-at, answer the request with this JSON-RPC error code instead of exiting.
    #[arg(long, allow_negative_numbers = true)]
    pub error_code: Option<i64>,
    /// Never answer this request.
    #[arg(long, value_enum, value_name = "REQUEST")]
    pub hang_at: Option<Stage>,
    /// protocolVersion to answer initialize with.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub protocol_version: u16,
    /// Do not exit on stdin EOF (keep running until killed).
    #[arg(long)]
    pub ignore_eof: bool,
    /// Ignore SIGTERM.
    #[arg(long)]
    pub ignore_term: bool,
    /// Write TEXT as a line to stderr at start.
    #[arg(long, value_name = "TEXT")]
    pub stderr: Option<String>,
    /// Advertise sessionCapabilities.systemPrompt; a session's system prompt is then streamed
    /// as "system: TEXT" at the start of each turn.
    #[arg(long)]
    pub system_prompt: bool,
    /// Answer initialize only after MS milliseconds: an agent whose start dominates (the warm
    /// spare benchmark's).
    #[arg(long, value_name = "MS")]
    pub init_delay: Option<u64>,
    /// Persist sessions in DIR (one JSON file each, shared by every echo using DIR) and offer
    /// session/load, resume, list, close, delete and fork.
    #[arg(long, value_name = "DIR")]
    pub sessions: Option<PathBuf>,
    /// Page size of session/list (with --sessions).
    #[arg(long, default_value_t = 50, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub list_page: u64,
    /// End session/list's last page with `"nextCursor": null` instead of leaving the key out,
    /// as codex-acp does.
    #[arg(long)]
    pub null_cursor: bool,
    /// Advertise auth method ID (repeatable) and refuse session/new, load, resume and list
    /// with -32000 until `authenticate` succeeded with one of them.
    #[arg(long = "auth", value_name = "ID")]
    pub auth: Vec<String>,
    /// Advertise these promptCapabilities as true (comma list of image, audio, embedded).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "LIST")]
    pub prompt_caps: Vec<PromptCap>,
    /// Advertise sessionCapabilities.subagents and run the :subagent directives for clients
    /// that opted in with clientCapabilities.subagents.
    #[arg(long)]
    pub subagents: bool,
    /// Speak codex-acp's AIR session-failure extension: to a client that declares
    /// clientCapabilities._meta.jetbrains.air with "sessionFailure", advertise it in the
    /// initialize result's _meta and end :air-failure turns with the typed record.
    #[arg(long)]
    pub air: bool,
}

/// Runs the agent until stdin closes; returns the process exit code.
///
/// Directives such as `:crash` and flags such as `--fail-at` end the process themselves with
/// `std::process::exit`, so this only returns on stdin EOF. Callers should exit the process
/// with the returned code without waiting for the runtime to drain: a write to a stdout nobody
/// reads could otherwise hold the runtime's shutdown forever. `stdin` and `stdout` are the
/// process's own (the caller chooses how they are driven).
pub(crate) async fn run_echo<R, W>(args: EchoArgs, stdin: R, stdout: W) -> i32
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if let Some(text) = &args.stderr {
        eprintln!("{text}");
    }
    // Set the disposition explicitly either way: an inherited SIG_IGN would otherwise make a
    // plain echo agent deaf to SIGTERM, which tests of acpd's teardown depend on.
    set_sigterm(if args.ignore_term {
        SigHandler::SigIgn
    } else {
        SigHandler::SigDfl
    });
    echo::serve(args, stdin, stdout).await
}

/// Hidden helper used by the `:grandchild` directive: sleeps forever with SIGTERM ignored.
///
/// It stands in for a stray descendant that a careless teardown would leave holding the
/// agent's pipes; only SIGKILL of its process group ends it.
pub fn run_sleeper(exit_after_ms: Option<u64>) -> ! {
    set_sigterm(SigHandler::SigIgn);
    if let Some(ms) = exit_after_ms {
        std::thread::sleep(std::time::Duration::from_millis(ms));
        std::process::exit(0);
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

fn set_sigterm(handler: SigHandler) {
    // SAFETY: SIG_IGN and SIG_DFL run no code in the process, so no handler can observe
    // inconsistent state.
    let _ = unsafe { signal(Signal::SIGTERM, handler) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        echo: EchoArgs,
    }

    #[test]
    fn flags_parse_including_negative_codes() {
        let cli = Cli::parse_from([
            "echo",
            "--fail-at",
            "session-new",
            "--error-code",
            "-32000",
            "--protocol-version",
            "2",
        ]);
        assert_eq!(cli.echo.fail_at, Some(Stage::SessionNew));
        assert_eq!(cli.echo.error_code, Some(-32000));
        assert_eq!(cli.echo.exit_code, 1);
        assert_eq!(cli.echo.protocol_version, 2);
        assert!(cli.echo.sessions.is_none() && cli.echo.auth.is_empty());
        assert!(cli.echo.prompt_caps.is_empty() && !cli.echo.subagents);
        Cli::command().debug_assert();
    }

    #[test]
    fn feature_flags_parse() {
        let cli = Cli::parse_from([
            "echo",
            "--sessions",
            "/tmp/s",
            "--list-page",
            "2",
            "--auth",
            "a",
            "--auth",
            "b",
            "--prompt-caps",
            "image,embedded",
            "--subagents",
        ]);
        assert_eq!(cli.echo.sessions, Some(PathBuf::from("/tmp/s")));
        assert_eq!(cli.echo.list_page, 2);
        assert_eq!(cli.echo.auth, ["a", "b"]);
        assert_eq!(
            cli.echo.prompt_caps,
            [PromptCap::Image, PromptCap::Embedded]
        );
        assert!(cli.echo.subagents);
        assert!(Cli::try_parse_from(["echo", "--list-page", "0"]).is_err());
        assert!(Cli::try_parse_from(["echo", "--prompt-caps", "video"]).is_err());
    }

    #[test]
    fn help_documents_every_directive() {
        let cmd = EchoArgs::augment_args(clap::Command::new("echo"));
        let help = cmd.get_after_long_help().map(|h| h.to_string());
        let help = help.expect("after_long_help is set by the Args derive");
        for name in [
            "stop",
            "error",
            "meta-failure",
            "air-failure",
            "crash",
            "signal",
            "chunks",
            "update",
            "thought",
            "image",
            "hang",
            "hang-deaf",
            "sleep",
            "ignore-eof",
            "ignore-term",
            "grandchild",
            "pid",
            "permission",
            "read",
            "cwd",
            "write",
            "env",
            "garbage",
            "binary",
            "oversize",
            "close-stdout",
            "garbage-then-stop",
            "after-answer",
            "forge-acpd",
            "notify",
            "foreign-session",
            "no-session",
            "dup-session",
            "bad-permission",
            "deaf-stdin",
            "blocks",
            "auth",
            "ext",
            "ext-request",
            "request",
            "cancel-request",
            "notify-json",
            "client-caps",
            "session-meta",
            "prompt-meta",
            "stderr",
            "stderr-flood",
            "subagent",
            "subagent-hang",
            "delegate",
            "delegate-json",
        ] {
            assert!(
                help.contains(&format!("  :{name} ")),
                "{name} is undocumented"
            );
        }
    }
}
