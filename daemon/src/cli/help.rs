//! The examples at the end of each command's `--help`: what a newcomer types first.

pub(super) const ACPD: &str = "\
Examples:
  acpd run 'summarise README.md'            one delegation to the default provider
  acpd install claude && acpd doctor        install a preset's agent, check it starts
  acpd serve                                the daemon; editors then run `acpd connect`
  acpd <command> --help                     each command's options and examples";

pub(super) const RUN: &str = "\
Examples:
  acpd run 'what does src/main.rs do?'
  acpd run --provider claude --cwd ~/project 'fix the failing test'
  git diff | acpd run --json -               the prompt from stdin, the result as JSON
  acpd run --timeout 5m 'long task'          durations: 30, 30s, 1m30s, 500ms
  acpd run --workspace worktree --budget-tokens 200000 --budget-wall 30m 'fix the bug'
                                             on a branch acpd/<run id>, within a budget

Exit codes: 0 completed, 1 error (a spent budget too: category budget), 2 usage or config,
3 the agent did not start (a flag the provider refuses too), 4 refusal, 5 max tokens,
6 aborted, 7 the agent needs credentials, 74 stdout closed, 130 interrupted.";

pub(super) const STDIO: &str = "\
Examples:
  acpd stdio                                 what an editor's agent entry runs
  acpd stdio --provider claude               one editor entry per agent
  acpd stdio --config ./acpd.toml --trace /tmp/acpd-trace";

pub(super) const SERVE: &str = "\
Examples:
  acpd serve                                 socket at $XDG_RUNTIME_DIR/acpd/acpd.sock
  acpd serve --socket /tmp/acpd.sock
  systemctl --user enable --now acpd.socket  the same, started on the first connection";

pub(super) const CONNECT: &str = "\
Examples:
  acpd connect                               an editor's agent entry, through the daemon
  acpd connect --provider codex
  acpd connect --or-stdio                    serve in-process when no daemon runs";

pub(super) const MCP: &str = "\
Examples:
  acpd mcp                                   tools over the daemon, else in-process
  acpd mcp --in-process --config ./acpd.toml";

pub(super) const STATUS: &str = "\
Examples:
  acpd status
  acpd status --json --timeout 2             durations: 2, 2s, 1m30s, 500ms";

pub(super) const RUNS: &str = "\
Examples:
  acpd runs
  acpd runs --json | jq '.runs[].runId'";

pub(super) const RELOAD: &str = "\
Examples:
  acpd reload                                after editing config.toml
  acpd reload --timeout 30s --json";

pub(super) const DOCTOR: &str = "\
Examples:
  acpd doctor                                every provider, checked at once
  acpd doctor claude
  acpd doctor --quiet > report.txt";

pub(super) const INIT: &str = "\
Examples:
  acpd init                                  a config for the built-in echo agent
  acpd init claude codex                     configure, install and check two agents
  acpd init claude --config ./acpd.toml --force";

pub(super) const PROVIDERS: &str = "\
Examples:
  acpd providers
  acpd providers --presets                   what `preset = \"NAME\"` offers
  acpd providers --json";

pub(super) const INSTALL: &str = "\
Examples:
  acpd install claude                        a second run says \"already installed\"
  acpd install codex --force                 install the same version again";

pub(super) const REGISTRY: &str = "\
Examples:
  acpd registry list
  acpd registry list --json";

pub(super) const REGISTRY_LIST: &str = REGISTRY;

pub(super) const SUPERVISE: &str = "\
Examples:
  acpd supervise -- my-agent --acp           run a command as acpd runs its children
  acpd supervise --term-grace 10s -- my-agent";

pub(super) const TOKEN: &str = "\
Examples:
  acpd token create laptop --expires 30d > laptop.token
                                             the token on stdout, once; keep the file private
  acpd token list
  acpd token revoke laptop                   refused from now on, its connections end";

pub(super) const TOKEN_CREATE: &str = "\
Examples:
  acpd token create laptop > laptop.token    a controller token that never expires
  acpd token create ci --role observer --expires 12h";

pub(super) const TOKEN_LIST: &str = "\
Examples:
  acpd token list
  acpd token list --json | jq '.tokens[] | select(.state == \"live\") | .name'";

pub(super) const TOKEN_REVOKE: &str = "\
Examples:
  acpd token revoke laptop
  acpd token revoke laptop --socket /run/acpd/acpd.sock   the daemon to tell";

pub(super) const AGENT: &str = "\
Examples:
  acpd agent echo                            the built-in scripted ACP agent
  acpd agent echo --help                     its directives (:crash, :permission, …)";

pub(super) const AGENT_ECHO: &str = "\
Examples:
  acpd agent echo
  acpd run --provider echo ':permission'     the echo agent asks for a permission";

pub(super) const TRACE: &str = "\
Examples:
  acpd run --trace /tmp/t 'hello' && acpd trace show /tmp/t/run-*.ndjson";

pub(super) const TRACE_SHOW: &str = TRACE;
