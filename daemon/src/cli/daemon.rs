//! The daemon's commands: `serve`, `connect` (the stdio↔socket shim editors launch), `status`,
//! `runs` and `doctor`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::SignalKind;
use tokio_util::sync::CancellationToken;

use super::{EXIT_USAGE, config_or_usage, load_config};
use crate::runtime::{self, ServeOptions};

#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The daemon's socket (default: $XDG_RUNTIME_DIR/acpd/acpd.sock).
    #[arg(long, value_name = "PATH", env = "ACPD_SOCKET")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Also serve ACP to remote editors at URL (repeatable; added to the config's `listen`):
    /// `https://0.0.0.0:8443` (needs tls_cert and tls_key), or `http://127.0.0.1:8080` for
    /// local development only.
    #[arg(long, value_name = "URL", value_parser = parse_listen)]
    pub listen: Vec<crate::config::network::ListenUrl>,
    #[command(flatten)]
    pub setup: super::Setup,
}

#[derive(Debug, clap::Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// With no daemon running, serve this one connection in-process instead of failing.
    #[arg(long)]
    pub or_stdio: bool,
    /// How long the connect step may take (a stopped daemon, a full backlog).
    #[command(flatten)]
    pub timeout: super::client::TimeoutArg,
    /// Make provider NAME this connection's default (as `acpd stdio --provider`); the daemon
    /// is told with `_acpd/connect` before anything of the editor's, and an unknown NAME ends
    /// connect at once (exit 2).
    #[arg(long, value_name = "NAME")]
    pub provider: Option<String>,
    /// Read by --or-stdio only.
    #[command(flatten)]
    pub setup: super::Setup,
}

#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub timeout: super::client::TimeoutArg,
}

/// `acpd status`: the daemon's status, or its metrics.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub query: QueryArgs,
    /// Print the daemon's metrics in Prometheus text format (what `metrics_listen` serves).
    #[arg(long, conflicts_with = "json")]
    pub metrics: bool,
}

fn socket_path(arg: &SocketArg) -> Result<PathBuf, u8> {
    match &arg.socket {
        Some(p) => Ok(p.clone()),
        None => runtime::default_socket_path().map_err(|e| {
            errln!("acpd: {e}");
            EXIT_USAGE
        }),
    }
}

fn parse_listen(text: &str) -> Result<crate::config::network::ListenUrl, String> {
    text.parse()
}

pub(super) async fn serve(
    config_path: Option<&Path>,
    args: ServeArgs,
    activated: crate::runtime::Activated,
) -> u8 {
    let listen = args.listen;
    let with_flags = move |mut config: crate::config::Config| {
        config.network.listen.extend(listen.iter().copied());
        config
    };
    let config = match config_or_usage(config_path) {
        Ok(c) => with_flags.clone()(c),
        Err(code) => return code,
    };
    if let Err(code) = contain(&config) {
        return code;
    }
    if config.child_stderr == Some(crate::supervise::ChildStderrMode::Forward) {
        crate::supervise::forward_child_stderr();
    }
    let explicit = config_path.map(Path::to_path_buf);
    let opts = ServeOptions {
        activated: activated.unix,
        activated_tcp: activated.tcp,
        socket: args.socket.socket,
        load: Box::new(move || load_config(explicit.as_deref()).map(&with_flags)),
    };
    let shutdown =
        match runtime::Shutdown::on_signals(&[SignalKind::terminate(), SignalKind::interrupt()]) {
            Ok(s) => s,
            Err(e) => {
                errln!("acpd: cannot set up signal handling: {e}");
                return 1;
            }
        };
    match runtime::serve(opts, config, shutdown).await {
        Ok(()) => 0,
        Err(e) => {
            errln!("acpd: {e}");
            1
        }
    }
}

/// Sets up containment (cgroups or process groups, and the sentinel) before any child starts;
/// exit code 1 with the reason when `containment = "cgroup"` cannot be honoured.
/// Warns (once, at start) for each provider whose `memory_max` / `pids_max` cannot take
/// effect here.
pub(crate) fn contain(config: &crate::config::Config) -> Result<(), u8> {
    crate::supervise::contain(config.containment, config.wants_limits()).map_err(|e| {
        errln!("acpd: {e}");
        1u8
    })?;
    for line in crate::supervise::limit_warnings(&provider_limits(config)) {
        tracing::warn!("{line}");
    }
    Ok(())
}

/// Each provider's name and `memory_max` / `pids_max`: what containment needs of the config.
fn provider_limits(config: &crate::config::Config) -> Vec<(&str, crate::supervise::ChildLimits)> {
    config
        .providers
        .values()
        .map(|p| (p.name.as_str(), p.child_limits()))
        .collect()
}

/// Bridges stdin/stdout to the daemon byte for byte: no ACP parsing, so the daemon sees the
/// editor's own bytes.
pub(super) async fn connect(config_path: Option<&Path>, args: ConnectArgs) -> u8 {
    let path = match socket_path(&args.socket) {
        Ok(p) => p,
        Err(_) if args.or_stdio => {
            return super::stdio(config_path, args.provider.as_deref()).await;
        }
        Err(code) => return code,
    };
    let within = args.timeout.timeout;
    let deadline = tokio::time::Instant::now() + within;
    let stream = match super::client::connect(&path, within, deadline).await {
        Ok(s) => s,
        Err(super::client::ClientError::NoDaemon { .. }) if args.or_stdio => {
            return super::stdio(config_path, args.provider.as_deref()).await;
        }
        Err(e) => {
            errln!("acpd: {e}; or use `acpd connect --or-stdio`");
            return 1;
        }
    };
    let (mut from_daemon, mut to_daemon) = stream.into_split();
    if let Some(name) = &args.provider
        && let Err(code) = choose_provider(&mut from_daemon, &mut to_daemon, name).await
    {
        return code;
    }
    let (stdin, stdout) = runtime::stdio();
    match pipe(stdin, stdout, from_daemon, to_daemon).await {
        Piped::Done | Piped::EditorGone => 0,
        Piped::DaemonGone(why) => {
            errln!(
                "acpd: the daemon at {} went away mid-connection ({why})",
                path.display()
            );
            1
        }
    }
}

/// Whether the config has provider `name`; else why not, naming the ones it has.
pub(super) fn known_provider(config: &crate::config::Config, name: &str) -> Result<(), String> {
    if config.providers.contains_key(name) {
        return Ok(());
    }
    Err(format!(
        "no provider named {name:?}; {}",
        crate::config::suggest::unknown_provider(config, name)
    ))
}

/// `acpd connect --provider NAME`: one `_acpd/connect` request and its one-line answer, read
/// a byte at a time so nothing of what follows is taken from the pipe. `Err` is the exit code,
/// the reason on stderr.
async fn choose_provider(
    from_daemon: &mut tokio::net::unix::OwnedReadHalf,
    to_daemon: &mut tokio::net::unix::OwnedWriteHalf,
    name: &str,
) -> Result<(), u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const ANSWER_MAX: usize = 64 * 1024;
    let request = serde_json::json!({"jsonrpc": "2.0", "id": "acpd-connect",
        "method": crate::server::CONNECT, "params": {"provider": name}});
    let exchange = async {
        to_daemon
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while line.len() < ANSWER_MAX {
            if from_daemon.read(&mut byte).await? == 0 {
                break;
            }
            if byte[0] == b'\n' {
                break;
            }
            line.push(byte[0]);
        }
        Ok::<_, std::io::Error>(line)
    };
    let line = match tokio::time::timeout(std::time::Duration::from_secs(30), exchange).await {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => {
            errln!("acpd: cannot tell the daemon the provider: {e}");
            return Err(1);
        }
        Err(_) => {
            errln!("acpd: the daemon did not answer --provider within 30s");
            return Err(1);
        }
    };
    let answer: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
    if answer.get("result").is_some() {
        return Ok(());
    }
    match answer.pointer("/error/message").and_then(|m| m.as_str()) {
        // The daemon's refusal of this very request (another error, a LIMIT line, is no
        // usage error).
        Some(why) if answer["id"] == "acpd-connect" => {
            errln!("acpd: --provider: {why}");
            Err(super::EXIT_USAGE)
        }
        _ => {
            errln!(
                "acpd: the daemon did not take --provider (it answered {:?})",
                String::from_utf8_lossy(&line)
            );
            Err(1)
        }
    }
}

/// How a `connect` pipe ended.
#[derive(Debug)]
enum Piped {
    /// The editor closed stdin, then the daemon finished and closed its side.
    Done,
    /// The editor closed stdout (it is gone; nobody is left to tell).
    EditorGone,
    /// The daemon closed or reset the connection while the editor was still there.
    DaemonGone(String),
}

/// Copies editor → daemon and daemon → editor until the connection ends, telling apart an
/// editor that finished from a daemon that went away (SIGKILLed, stopped, refused).
async fn pipe(
    mut stdin: runtime::Reader,
    mut stdout: runtime::Writer,
    mut from_daemon: tokio::net::unix::OwnedReadHalf,
    mut to_daemon: tokio::net::unix::OwnedWriteHalf,
) -> Piped {
    use tokio::io::AsyncReadExt;
    const BUF: usize = 64 * 1024;
    let editor_done = std::cell::Cell::new(false);
    let upstream = async {
        let mut buf = vec![0u8; BUF];
        loop {
            let n = match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Err(e) = to_daemon.write_all(&buf[..n]).await {
                return Piped::DaemonGone(e.to_string());
            }
        }
        // The editor is done: let the daemon see EOF, and keep reading its last words.
        editor_done.set(true);
        let _ = to_daemon.shutdown().await;
        std::future::pending().await
    };
    let downstream = async {
        let mut buf = vec![0u8; BUF];
        loop {
            let n = match from_daemon.read(&mut buf).await {
                Ok(0) if editor_done.get() => return Piped::Done,
                Ok(0) => return Piped::DaemonGone("it closed the connection".into()),
                Err(e) => return Piped::DaemonGone(e.to_string()),
                Ok(n) => n,
            };
            if stdout.write_all(&buf[..n]).await.is_err() || stdout.flush().await.is_err() {
                return Piped::EditorGone;
            }
        }
    };
    tokio::select! {
        ended = upstream => ended,
        ended = downstream => ended,
    }
}

/// One request to the daemon over its socket, as an ACP client, all of it within `within`.
async fn query(
    path: &Path,
    method: &'static str,
    within: std::time::Duration,
) -> Result<Value, super::client::ClientError> {
    let mut client = super::client::Client::open(path, within).await?;
    let raw = client.call(method, &json!({})).await?;
    client.close();
    serde_json::from_str(raw.get()).map_err(|e| super::client::ClientError::Garbage {
        path: path.to_path_buf(),
        detail: format!("a {method} result that is not JSON ({e})"),
    })
}

/// Asks the daemon; `Err` is the exit code, with the reason already on stderr. With `--json`
/// the answer is printed here and `None` returned.
async fn ask(args: &QueryArgs, method: &'static str) -> Result<Option<Value>, u8> {
    let path = socket_path(&args.socket)?;
    let v = query(&path, method, args.timeout.timeout)
        .await
        .map_err(|e| {
            errln!("acpd: {e}");
            1
        })?;
    if args.json {
        return match outln!("{v}") {
            Ok(()) => Ok(None),
            Err(e) => Err(super::stdout_failed(&e)),
        };
    }
    Ok(Some(v))
}

pub(super) async fn status(args: StatusArgs) -> u8 {
    if args.metrics {
        return match ask(&args.query, acpd_protocol::methods::name::METRICS).await {
            Ok(Some(v)) => printed(super::write_stdout(format_args!(
                "{}",
                v["text"].as_str().unwrap_or_default()
            ))),
            Ok(None) => 0,
            Err(code) => code,
        };
    }
    let args = args.query;
    let v = match ask(&args, "_acpd/status").await {
        Ok(Some(v)) => v,
        Ok(None) => return 0,
        Err(code) => return code,
    };
    printed(super::report::print_status(&v))
}

/// Text a child, a parent or a config controls, made safe for a terminal: control characters
/// (ESC, CR, BEL, … C1 too) and the bidi overrides that reorder what is shown are printed as
/// escapes (`\u{1b}`, `\r`), never acted on.
pub(super) fn shown(text: &str) -> String {
    crate::trace::escape_controls(text).into_owned()
}

/// `containment: cgroup (why) at PATH` from `_acpd/status`'s `containment` object.
pub(super) fn containment_line(c: &Value) -> String {
    let mut line = format!(
        "containment: {} ({})",
        shown(c["mode"].as_str().unwrap_or("unknown")),
        shown(c["reason"].as_str().unwrap_or("no reason given"))
    );
    if let Some(path) = c["path"].as_str() {
        line.push_str(&format!(" at {}", shown(path)));
    }
    if let Some(list) = c["controllers"].as_array().filter(|l| !l.is_empty()) {
        let names: Vec<String> = list.iter().filter_map(Value::as_str).map(shown).collect();
        line.push_str(&format!("; limits via {}", names.join(", ")));
    }
    line
}

/// 0, or [`super::EXIT_IO`] when stdout could not be written.
fn printed(result: std::io::Result<()>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) => super::stdout_failed(&e),
    }
}

pub(super) async fn runs(args: QueryArgs) -> u8 {
    let v = match ask(&args, "_acpd/runs").await {
        Ok(Some(v)) => v,
        Ok(None) => return 0,
        Err(code) => return code,
    };
    printed(super::report::print_runs(&v))
}

/// What `doctor` says about a provider's authentication.
struct AuthReport {
    text: String,
    /// False when the configured `auth_method` is not advertised: every start would fail.
    ok: bool,
}

/// The advertised auth method ids, the configured `auth_method` and whether the environment
/// variables that would satisfy them are set in acpd's environment — names only, never values.
fn auth_report(
    provider: &crate::config::ProviderConfig,
    agent: &crate::child::AgentInfo,
    is_set: impl Fn(&str) -> bool,
) -> AuthReport {
    let ids = &agent.auth_method_ids;
    let mut text = if ids.is_empty() {
        "none advertised".to_string()
    } else {
        ids.join(", ")
    };
    let mut ok = true;
    if let Some(wanted) = &provider.auth_method {
        if ids.contains(wanted) {
            text.push_str(&format!("; auth_method {wanted} is advertised"));
        } else {
            ok = false;
            text.push_str(&format!(
                "; auth_method {wanted} is NOT advertised (starts fail)"
            ));
        }
    }
    let env = crate::registry::auth_env_names(provider.preset.as_deref(), ids);
    if env.is_empty() {
        if !ids.is_empty() {
            text.push_str("; no environment variable known to satisfy them");
        }
    } else {
        let states: Vec<String> = env
            .iter()
            .map(|n| format!("{n} {}", if is_set(n) { "set" } else { "unset" }))
            .collect();
        text.push_str(&format!("; env: {}", states.join(", ")));
    }
    AuthReport { text, ok }
}

/// How many providers `doctor` checks at once, at most.
const DOCTOR_AT_ONCE: usize = 8;

/// For each provider: spawn it, run `initialize`, report what it says (its auth methods and
/// whether this environment can satisfy them), tear it down. The providers are checked all at
/// once (each probe waits on its own agent), a line each as its check finishes, in the order
/// they finish; a status line on stderr says what is still being checked.
pub(super) async fn doctor(config_path: Option<&Path>, only: Option<String>, quiet: bool) -> u8 {
    use futures::StreamExt;
    let config = match config_or_usage(config_path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Err(code) = contain(&config) {
        return code;
    }
    crate::supervise::init();
    let line = containment_line(&serde_json::json!(crate::supervise::containment_status()));
    if let Err(e) = outln!("{line}") {
        return super::stdout_failed(&e);
    }
    for warning in crate::supervise::limit_warnings(&provider_limits(&config)) {
        if let Err(e) = outln!("{}: {warning}", super::output::verdict("warning")) {
            return super::stdout_failed(&e);
        }
    }
    let registry = crate::registry::Registry::new(config.clone(), Default::default());
    let providers: Vec<_> = config
        .providers
        .values()
        .filter(|p| only.as_ref().is_none_or(|o| *o == p.name))
        .cloned()
        .collect();
    if providers.is_empty() {
        let name = only.unwrap_or_default();
        let hint = crate::config::suggest::unknown_provider(&config, &name);
        errln!("acpd: no provider named {name:?}; {hint}");
        return EXIT_USAGE;
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let progress = super::progress::Progress::new(!quiet);
    let mut pending: Vec<String> = providers.iter().map(|p| p.name.clone()).collect();
    let total = pending.len();
    let checking = |pending: &[String]| {
        format!(
            "checking {} ({} of {total} left)",
            pending.join(", "),
            pending.len()
        )
    };
    progress.set(checking(&pending));
    // At once, but never more than `max_children` (each probe takes a slot, and one over the
    // limit would be refused, not queued) nor so many agents that the machine thrashes.
    let at_once = config.max_children.clamp(1, DOCTOR_AT_ONCE);
    let mut checks = futures::stream::iter(providers)
        .map(|provider| {
            let registry = &registry;
            let cwd = &cwd;
            async move {
                // An unusable env_file fails the check before any agent starts.
                let checked = match provider.env_file.as_ref().map(|f| f.read()).transpose() {
                    Err(e) => (false, failed(&provider, &e.to_string())),
                    Ok(secrets) => {
                        let cancel = CancellationToken::new();
                        let probed = registry.probe(&provider.name, Some(cwd), &cancel).await;
                        checked(&provider, secrets.as_ref(), probed)
                    }
                };
                (provider, checked)
            }
        })
        .buffer_unordered(at_once);
    let mut healthy = true;
    while let Some((provider, (ok, report))) = checks.next().await {
        healthy &= ok;
        pending.retain(|n| *n != provider.name);
        let printed = progress.above(|| outln!("{report}"));
        if let Err(e) = printed {
            progress.done();
            return super::stdout_failed(&e);
        }
        progress.set(checking(&pending));
    }
    progress.done();
    if healthy { 0 } else { 1 }
}

/// One provider's lines of the doctor's report, and whether it is healthy: FAIL when it did
/// not start or its auth cannot work, WARN (unhealthy too) when no credential it could use is
/// present in what its child gets (the environment passed through, `env`, `env_file`).
fn checked(
    provider: &crate::config::ProviderConfig,
    secrets: Option<&crate::config::env_file::Secrets>,
    probed: Result<crate::child::AgentInfo, crate::registry::GateError>,
) -> (bool, String) {
    let agent = match probed {
        Ok(agent) => agent,
        Err(e) => return (false, failed(provider, &e.to_string())),
    };
    // What the kernel really enforces for this provider, not what the config asked for.
    let sandbox = match provider.sandbox {
        crate::config::SandboxMode::None => String::new(),
        _ => format!(
            "\n{}: sandbox: {}",
            shown(&provider.name),
            crate::registry::sandbox_enforced(provider)
        ),
    };
    let name = shown(agent.agent_info["name"].as_str().unwrap_or("?"));
    let version = shown(agent.agent_info["version"].as_str().unwrap_or("?"));
    let auth = auth_report(provider, &agent, |n| {
        std::env::var_os(n).is_some_and(|v| !v.is_empty()) || secrets.is_some_and(|s| s.is_set(n))
    });
    let view = super::credentials::ChildView::new(provider, secrets);
    let ids = agent.auth_method_ids.as_slice();
    let missing = super::credentials::missing(provider, Some(ids), &view);
    let state = match (auth.ok, &missing) {
        (false, _) => "FAIL",
        (true, Some(_)) => "WARN",
        (true, None) => "OK",
    };
    let mut report = format!(
        "{}: {} — ACP protocol {}, agent {name} {version}, auth methods: {}",
        shown(&provider.name),
        super::output::verdict(state),
        agent.protocol_version,
        shown(&auth.text)
    );
    report.push_str(&sandbox);
    if let Some(m) = &missing {
        report.push_str(&format!("\nwarning: {}", m.warning(&provider.name)));
    }
    (auth.ok && missing.is_none(), report)
}

/// A provider's FAIL line.
fn failed(provider: &crate::config::ProviderConfig, why: &str) -> String {
    format!(
        "{}: {} — {}",
        shown(&provider.name),
        super::output::verdict("FAIL"),
        shown(why)
    )
}
