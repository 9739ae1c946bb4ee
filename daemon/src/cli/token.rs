//! `acpd token create|list|revoke`: the network tokens in acpd's state DB. A token is shown
//! once, on stdout, when it is made; only its SHA-256 is kept. After a change, a daemon
//! answering on its socket is asked to read the tokens again (`_acpd/tokens/reload`), so a new
//! token works at once and the live connections of a revoked one end at once.
//!
//! Exit codes: 0 done; 1 the state DB failed, or the change is made but the daemon that
//! answered did not take it in; 2 a usage error (a bad or taken name, an unknown one, no state
//! directory); 74 stdout closed.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use acpd_protocol::methods::name;
use clap::Subcommand;

use super::client::{Client, ClientError, TimeoutArg};
use super::daemon::SocketArg;
use super::output::{Col, Grid};
use super::{EXIT_USAGE, help, stdout_failed};
use crate::store::tokens::{Revoked, Role, TokenRow};
use crate::store::{Store, StoreError};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token for `acpd connect --url` and other network clients; it is printed once.
    #[command(after_help = help::TOKEN_CREATE)]
    Create(CreateArgs),
    /// List the tokens: name, role, state, when made, expiring and last used (never a token).
    #[command(after_help = help::TOKEN_LIST)]
    List(ListArgs),
    /// Revoke a token: it is refused from now on and its live connections end.
    #[command(after_help = help::TOKEN_REVOKE)]
    Revoke(RevokeArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The token's name (1 to 64 letters, digits, `-`, `_`, `.`): what `list` shows and
    /// `revoke` takes.
    pub name: String,
    /// `controller` drives sessions; `observer` only watches them.
    #[arg(long, default_value = "controller", value_parser = parse_role)]
    pub role: Role,
    /// Refuse the token after this long: `30d`, `12h`, `1y` (default: never).
    #[arg(long, value_name = "DURATION", value_parser = parse_expiry)]
    pub expires: Option<Duration>,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// The token's name, as `acpd token list` shows it.
    pub name: String,
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

/// The daemon told of the change.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub socket: SocketArg,
    #[command(flatten)]
    pub timeout: TimeoutArg,
}

/// The longest `--expires`: ten years.
const MAX_EXPIRY: Duration = Duration::from_secs(3650 * 24 * 60 * 60);

fn parse_role(text: &str) -> Result<Role, String> {
    Role::parse(text).ok_or_else(|| format!("{text:?} is not a role; use controller or observer"))
}

/// `--expires`: humantime (`30d`, `12h`) or bare seconds, above zero, at most ten years (a
/// token's life is not a timeout, so not the 30-day ceiling of the other duration flags).
fn parse_expiry(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let d = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(text)
            .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 30d, 12h or 1y"))?,
    };
    if d.is_zero() {
        return Err("a token must live above zero seconds".into());
    }
    if d > MAX_EXPIRY {
        return Err(format!(
            "{text:?} is longer than ten years; write at most 3650d"
        ));
    }
    Ok(d)
}

pub(super) async fn token(command: TokenCommand) -> u8 {
    let store = match open_store() {
        Ok(s) => s,
        Err(code) => return code,
    };
    match command {
        TokenCommand::Create(args) => create(&store, args).await,
        TokenCommand::List(args) => list(&store, args.json).await,
        TokenCommand::Revoke(args) => revoke(&store, args).await,
    }
}

fn open_store() -> Result<Store, u8> {
    let Some(path) = crate::store::default_path() else {
        errln!(
            "acpd: no state directory to keep tokens in (STATE_DIRECTORY, XDG_STATE_HOME and \
             HOME are all unset); set one as the daemon has it, e.g. STATE_DIRECTORY=/var/lib/acpd"
        );
        return Err(EXIT_USAGE);
    };
    Store::open(&path).map_err(|e| failed(&e))
}

/// The exit code for a store error, with it on stderr: 2 for what the user typed, else 1.
fn failed(e: &StoreError) -> u8 {
    errln!("acpd: {e}");
    match e {
        StoreError::TokenName { .. }
        | StoreError::TokenNameTaken { .. }
        | StoreError::NoSuchToken { .. } => EXIT_USAGE,
        _ => 1,
    }
}

async fn create(store: &Store, args: CreateArgs) -> u8 {
    let expires = args.expires.and_then(|d| SystemTime::now().checked_add(d));
    let (row, token) = match store.create_token(&args.name, args.role, expires).await {
        Ok(made) => made,
        Err(e) => return failed(&e),
    };
    if let Err(e) = outln!("{token}") {
        // Nobody saw it: it must not stay usable.
        let _ = store.revoke_token(&row.name).await;
        errln!("acpd: the token was not shown, so it is revoked again");
        return stdout_failed(&e);
    }
    errln!(
        "acpd: created token {} ({}, {}); it was printed once, on stdout, and will not be shown \
         again: keep it now, in a file only you can read (`acpd connect --url URL --token-file \
         FILE` reads it)",
        row.name,
        row.role.as_str(),
        match row.expires {
            Some(at) => format!("expires {}", humantime::format_rfc3339_seconds(at)),
            None => "never expires".into(),
        }
    );
    tell_daemon(&args.daemon, "accepts it").await
}

async fn revoke(store: &Store, args: RevokeArgs) -> u8 {
    match store.revoke_token(&args.name).await {
        Ok(Revoked::Now) => errln!("acpd: revoked token {}", args.name),
        Ok(Revoked::Already) => errln!("acpd: token {} was revoked already", args.name),
        Err(e) => return failed(&e),
    }
    tell_daemon(&args.daemon, "refuses it and has closed its connections").await
}

/// Asks the daemon on the socket to read the tokens again. No daemon there is fine: one reads
/// them when it starts.
async fn tell_daemon(args: &DaemonArgs, done: &str) -> u8 {
    let path: PathBuf = match &args.socket.socket {
        Some(p) => p.clone(),
        None => match crate::runtime::default_socket_path() {
            Ok(p) => p,
            Err(_) => return 0,
        },
    };
    let asked = async {
        let mut client = Client::open(&path, args.timeout.timeout).await?;
        client
            .call(name::TOKENS_RELOAD, &serde_json::json!({}))
            .await?;
        client.close();
        Ok::<(), ClientError>(())
    };
    match asked.await {
        Ok(()) => {
            errln!("acpd: the daemon at {} {done}", path.display());
            0
        }
        Err(ClientError::NoDaemon { .. }) => 0,
        Err(e) => {
            errln!(
                "acpd: the change is saved, but the daemon did not read it: {e}; it takes effect \
                 when that daemon reads its tokens (run this command again, or restart it)"
            );
            1
        }
    }
}

async fn list(store: &Store, json: bool) -> u8 {
    let rows = match store.tokens().await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let now = SystemTime::now();
    let printed = if json {
        let tokens: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "role": r.role.as_str(),
                    "state": state(r, now),
                    "createdAt": r.created_at,
                    "expiresAt": r.expires.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
                    "revokedAt": r.revoked_at,
                    "lastUsedAt": r.last_used_at,
                })
            })
            .collect();
        outln!("{}", serde_json::json!({ "tokens": tokens }))
    } else if rows.is_empty() {
        outln!("no tokens; make one with `acpd token create NAME`")
    } else {
        let mut grid = Grid::new(&[
            ("NAME", Col::Whole),
            ("ROLE", Col::Whole),
            ("STATE", Col::Whole),
            ("CREATED", Col::Whole),
            ("EXPIRES", Col::Whole),
            ("LAST USED", Col::Whole),
        ]);
        for r in &rows {
            grid.row([
                r.name.clone(),
                r.role.as_str().to_owned(),
                state(r, now).to_owned(),
                seconds(&r.created_at),
                r.expires.map_or("never".into(), |t| {
                    humantime::format_rfc3339_seconds(t).to_string()
                }),
                r.last_used_at.as_deref().map_or("-".into(), seconds),
            ]);
        }
        grid.print()
    };
    match printed {
        Ok(()) => 0,
        Err(e) => stdout_failed(&e),
    }
}

fn state(r: &TokenRow, now: SystemTime) -> &'static str {
    if r.revoked_at.is_some() {
        "revoked"
    } else if r.expires.is_some_and(|t| t <= now) {
        "expired"
    } else {
        "live"
    }
}

/// A stored time (RFC 3339 with milliseconds) to the second.
fn seconds(text: &str) -> String {
    match text.get(..19) {
        Some(head) if text.ends_with('Z') => format!("{head}Z"),
        _ => text.to_owned(),
    }
}
