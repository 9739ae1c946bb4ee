//! The operator's methods: `_acpd/status` (daemon-wide, any connection may ask), `_acpd/runs`
//! (every live run and bridge session, as far as the caller may see them), `_acpd/reload`
//! ("re-read the config, and tell me whether it took") and `_acpd/tokens/reload` ("read the
//! network tokens again": `acpd token create`/`revoke` ask it).
//!
//! Only acpd's own user may reload either, over the Unix socket (never a network token), and
//! not from inside a child's process tree (agents run as acpd's user too, but reloading is the
//! operator's). Group members (`allow_group`) cannot
//! write the config, so a reload is not theirs to trigger, and its answer would show them the
//! file's path and, in a rejection, the offending key and value of a file they may not be
//! allowed to read. (Root is not special: it is not admitted to the socket at all unless it is
//! acpd's user or a group member; `systemctl reload` runs `acpd reload` as the unit's `User=`.)

use std::collections::BTreeMap;
use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::errors::ErrorName;
use acpd_protocol::methods::{
    ProviderLoad, ReloadReply, RunBudget, RunInfo, RunsReply, StatusLimits, StatusReply,
};

use super::delegation::live_runs;
use super::{Conn, Principal};
use crate::config::{Config, ConfigError};
use crate::registry::Parent;

/// `_acpd/status`: daemon-wide, any connection may ask.
pub(super) async fn status(conn: &Conn, id: Id) {
    let _ = conn.peer.respond_ok(&id, &status_reply(conn)).await;
}

/// `_acpd/runs`: the operator's view. acpd's own user (and an in-process caller) sees every
/// run; any other user (`allow_group`) and every network token only the runs it started.
pub(super) async fn runs(conn: &Conn, id: Id) {
    let own = Principal::Uid(nix::unistd::Uid::effective().as_raw());
    let caller = conn.ctx.principal.as_ref().filter(|&p| *p != own);
    let runs = live_runs(conn)
        .filter(|r| caller.is_none_or(|p| r.principal.as_ref() == Some(p)))
        .map(|r| RunInfo {
            run_id: r.run_id.clone(),
            provider: r.provider.name.clone(),
            label: r.label.clone(),
            state: r.state().name().to_string(),
            age_s: r.started_at.elapsed().as_secs(),
            pid: r.pid(),
            depth: r.depth,
            connection: r.owner,
            parent: r.parent.as_ref().map(|p| match p {
                Parent::Run(id) => format!("run:{id}"),
                Parent::Session(id) => format!("session:{id}"),
            }),
            tokens: r.spend.tokens(),
            budget: {
                let limit = r.spend.limit();
                (limit.tokens.is_some() || limit.wall.is_some()).then(|| RunBudget {
                    tokens: limit.tokens,
                    wall_s: limit.wall.map(|d| d.as_secs()),
                })
            },
        })
        .collect();
    let sessions = conn.ctx.sessions.entries(conn.ctx.principal.as_ref());
    let _ = conn
        .peer
        .respond_ok(&id, &RunsReply { runs, sessions })
        .await;
}

/// `_acpd/metrics`: what `metrics_listen` serves, to any connection `_acpd/status` answers.
pub(super) async fn metrics(conn: &Conn, id: Id) {
    let reply = acpd_protocol::methods::MetricsReply {
        content_type: crate::metrics::CONTENT_TYPE.to_owned(),
        text: metrics_text(&conn.ctx),
    };
    let _ = conn.peer.respond_ok(&id, &reply).await;
}

/// The exposition: the process's counters, and the levels read now from `ctx`'s registry and
/// live sessions.
pub(crate) fn metrics_text(ctx: &super::ServerContext) -> String {
    crate::metrics::render(&gauges(ctx))
}

/// Live children by provider and state, sessions, spares and queued starts, read now. A
/// child not yet (or no longer) filed as a run's, a session's or a spare is `starting`.
fn gauges(ctx: &super::ServerContext) -> crate::metrics::Gauges {
    let registry = &ctx.registry;
    let mut by: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
    for run in registry.runs() {
        if run.pid().is_some() {
            let state = match run.state() {
                crate::registry::RunState::Running { .. } => "running",
                _ => "idle",
            };
            *by.entry((run.provider.name.clone(), state)).or_default() += 1;
        }
    }
    for (provider, attached) in ctx.sessions.provider_states() {
        let state = if attached { "attached" } else { "detached" };
        *by.entry((provider, state)).or_default() += 1;
    }
    let spares = registry.spare_counts();
    for (provider, n) in &spares {
        *by.entry((provider.clone(), "spare")).or_default() += n;
    }
    let mut providers: Vec<String> = registry.config().providers.keys().cloned().collect();
    providers.extend(by.keys().map(|(p, _)| p.clone()));
    providers.sort();
    providers.dedup();
    for provider in providers {
        let filed: u64 = by
            .iter()
            .filter(|((p, _), _)| *p == provider)
            .map(|(_, n)| n)
            .sum();
        let live = registry.live_children_of(&provider) as u64;
        by.insert((provider, "starting"), live.saturating_sub(filed));
    }
    let sessions = ctx.sessions.counts();
    let (spans_exported, spans_dropped, spans_cut) = crate::otel::span_counts();
    let mut spares = spares;
    for provider in registry.config().providers.keys() {
        spares.entry(provider.clone()).or_default();
    }
    crate::metrics::Gauges {
        children: by.into_iter().map(|((p, s), n)| (p, s, n)).collect(),
        sessions_attached: sessions.attached as u64,
        sessions_detached: sessions.detached as u64,
        spares: spares.into_iter().collect(),
        queued: registry.queued() as u64,
        spans_exported,
        spans_dropped,
        spans_cut,
    }
}

/// What `_acpd/status` answers.
fn status_reply(conn: &Conn) -> StatusReply {
    let registry = &conn.ctx.registry;
    let config = registry.config();
    let providers: BTreeMap<String, ProviderLoad> = config
        .providers
        .values()
        .map(|p| {
            let load = ProviderLoad {
                max_concurrent: p.max_concurrent as u64,
                live: registry.live_children_of(&p.name) as u64,
                sandbox: Some(crate::registry::sandbox_enforced(p)),
            };
            (p.name.clone(), load)
        })
        .collect();
    StatusReply {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        uptime_s: conn.ctx.daemon.started.elapsed().as_secs(),
        connections: conn
            .ctx
            .daemon
            .connections
            .load(std::sync::atomic::Ordering::Relaxed) as u64,
        runs: live_runs(conn).count() as u64,
        providers: config.providers.keys().cloned().collect(),
        limits: StatusLimits {
            max_children: config.max_children as u64,
            live_children: registry.live_children() as u64,
            queued: registry.queued() as u64,
            queue_timeout_s: config.queue_timeout.map(|d| d.as_secs_f64()),
            providers,
        },
        sessions: {
            let counts = conn.ctx.sessions.counts();
            acpd_protocol::methods::SessionLoad {
                attached: counts.attached as u64,
                detached: counts.detached as u64,
            }
        },
        spares: registry.spare_counts(),
        containment: containment(),
        listening: conn.ctx.daemon.listening.get().cloned().unwrap_or_default(),
    }
}

/// The containment in force in this process (process groups when it was never set up).
fn containment() -> acpd_protocol::methods::StatusContainment {
    crate::supervise::containment_status()
}

pub(super) async fn reload(conn: Arc<Conn>, id: Id) {
    let Some(load) = conn.ctx.daemon.reload.clone() else {
        let e = RpcError::method_not_found(acpd_protocol::methods::name::RELOAD);
        return conn.reply_err(&id, &e).await;
    };
    if let Err(e) = operator_only(&conn, "reload it") {
        return conn.reply_err(&id, &e).await;
    }
    // Reading and checking the file is blocking work, off this task; the connection keeps
    // being served.
    match load.reload().await {
        Ok(config) => {
            let _ = conn.peer.respond_ok(&id, &reply(&config)).await;
        }
        Err(e) => conn.reply_err(&id, &rejected(&e)).await,
    }
}

/// `_acpd/tokens/reload`: reads the network tokens again, so a token just created is accepted
/// and the live connections of one just revoked end at once (they watch
/// [`crate::store::tokens::TokenBook::changed`]). Answers `{}` once the book is read.
pub(super) async fn reload_tokens(conn: Arc<Conn>, id: Id) {
    let Some(book) = conn.ctx.daemon.tokens.clone() else {
        let e = RpcError::method_not_found(acpd_protocol::methods::name::TOKENS_RELOAD);
        return conn.reply_err(&id, &e).await;
    };
    if let Err(e) = operator_only(&conn, "read its tokens again") {
        return conn.reply_err(&id, &e).await;
    }
    match book.reload().await {
        Ok(()) => {
            tracing::info!("network tokens read again");
            let _ = conn.peer.respond_ok(&id, &serde_json::json!({})).await;
        }
        Err(e) => {
            tracing::warn!("cannot read the network tokens again: {e}");
            let e = RpcError::internal(format!(
                "the daemon cannot read the network tokens again: {e}; the tokens it read \
                 before stay in force"
            ));
            conn.reply_err(&id, &e).await;
        }
    }
}

/// `Err` unless the caller is acpd's own user over the socket, from outside its children's
/// trees: the operator. `what` is what they asked, as "may {what}" says it.
fn operator_only(conn: &Conn, what: &str) -> Result<(), RpcError> {
    let own = nix::unistd::Uid::effective().as_raw();
    if conn.ctx.principal != Some(Principal::Uid(own)) {
        tracing::warn!(principal = ?conn.ctx.principal, "refused to {what}: not acpd's own user");
        let why = format!("only acpd's own user (uid {own}), over its socket, may {what}");
        return Err(not_permitted(why));
    }
    if !matches!(conn.lineage(), crate::registry::Lineage::Outside) {
        tracing::warn!("refused to {what} from inside a child's tree");
        let why = format!(
            "a connection from inside the process tree of one of this acpd's children (an \
             agent) may not {what}; that is the operator's"
        );
        return Err(not_permitted(why));
    }
    Ok(())
}

fn not_permitted(why: String) -> RpcError {
    RpcError::new(ErrorName::NotPermitted.code(), why)
        .with_data(serde_json::json!({ "code": ErrorName::NotPermitted.as_str() }))
}

fn reply(config: &Config) -> ReloadReply {
    ReloadReply {
        source: config.source.as_ref().map(|p| p.display().to_string()),
        providers: config.providers.keys().cloned().collect(),
        default_provider: config.default_provider.clone(),
    }
}

/// CONFIG_REJECTED with the message `acpd serve` logs, and its parts in `data`.
fn rejected(e: &ConfigError) -> RpcError {
    let mut data = serde_json::json!({
        "code": ErrorName::ConfigRejected.as_str(),
        "file": e.path().display().to_string(),
    });
    if let ConfigError::Invalid { line, key, .. } = e {
        data["line"] = serde_json::json!(line);
        data["key"] = serde_json::json!(key);
    }
    RpcError::new(
        ErrorName::ConfigRejected.code(),
        format!("config rejected, the previous one stays in force: {e}"),
    )
    .with_data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_names_file_line_and_key() {
        let e = ConfigError::Invalid {
            path: "/etc/acpd/config.toml".into(),
            line: Some(3),
            key: "max_children".into(),
            message: "invalid type".into(),
            text: None,
        };
        let r = rejected(&e);
        assert_eq!(r.code, -33014);
        assert!(
            r.message.contains("/etc/acpd/config.toml:3: max_children"),
            "{}",
            r.message
        );
        assert_eq!(
            r.data_value(),
            Some(
                serde_json::json!({"code": "CONFIG_REJECTED", "file": "/etc/acpd/config.toml",
                "line": 3, "key": "max_children"})
            )
        );
    }
}
