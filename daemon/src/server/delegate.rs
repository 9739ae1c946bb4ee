//! Delegation for parent agents: `_acpd/providers`, `_acpd/subagent/*` and the operator's
//! `_acpd/status` and `_acpd/runs`, one handler per method with the typed bodies of
//! `acpd_protocol::methods`. Every method that waits (start, wait, send, dispose) runs in its
//! own task; a connection acts only on the runs it started.

use std::collections::BTreeMap;
use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::methods::{
    DisposeRequest, Empty, ListReply, ProviderLoad, ProvidersReply, RunInfo, RunRef, RunSummary,
    RunsReply, SendReply, SendRequest, StartReply, StatusLimits, StatusReply, name, parse_params,
};
use acpd_protocol::subagent::StartRequest;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::events::{NestedUnder, RunMeta};
use super::{Conn, lock, typed_error};
use crate::registry::{Nest, Parent, RegistryError, Run, RunState, StartOptions};

pub async fn handle(conn: &Arc<Conn>, id: Id, method: &str, params: Option<Box<RawValue>>) {
    let params = params.as_deref();
    match method {
        name::PROVIDERS => {
            if let Some(Empty {}) = parsed(conn, &id, params).await {
                providers(conn, id).await;
            }
        }
        name::START => {
            if let Some(req) = parsed(conn, &id, params).await {
                start(conn, id, req).await;
            }
        }
        name::WAIT => {
            if let Some(req) = parsed(conn, &id, params).await {
                wait(conn, id, req);
            }
        }
        name::CANCEL => {
            if let Some(req) = parsed(conn, &id, params).await {
                cancel(conn, id, req).await;
            }
        }
        name::DISPOSE => {
            if let Some(req) = parsed(conn, &id, params).await {
                dispose(conn, id, req);
            }
        }
        name::SEND => {
            if let Some(req) = parsed(conn, &id, params).await {
                send(conn, id, req);
            }
        }
        name::LIST => {
            if let Some(Empty {}) = parsed(conn, &id, params).await {
                list(conn, id).await;
            }
        }
        name::STATUS => {
            if let Some(Empty {}) = parsed(conn, &id, params).await {
                let _ = conn.peer.respond_ok(&id, &status(conn)).await;
            }
        }
        name::RUNS => {
            if let Some(Empty {}) = parsed(conn, &id, params).await {
                runs(conn, id).await;
            }
        }
        name::RELOAD => {
            if let Some(Empty {}) = parsed(conn, &id, params).await {
                // In its own task, like every method that waits: the read may block.
                let conn2 = conn.clone();
                conn.tracker
                    .spawn(async move { super::reload::reload(&conn2, id).await });
            }
        }
        _ => {
            conn.reply_err(&id, &RpcError::method_not_found(method))
                .await
        }
    }
}

/// The method's typed params, or `None` once the parent has been told why they are invalid.
async fn parsed<T: DeserializeOwned>(conn: &Conn, id: &Id, params: Option<&RawValue>) -> Option<T> {
    match parse_params(params) {
        Ok(t) => Some(t),
        Err(reason) => {
            let e = typed_error(&RegistryError::InvalidRequest { reason });
            conn.reply_err(id, &e).await;
            None
        }
    }
}

async fn providers(conn: &Conn, id: Id) {
    let reply = ProvidersReply {
        providers: conn.ctx.registry.providers(),
    };
    let _ = conn.peer.respond_ok(&id, &reply).await;
}

fn wait(conn: &Arc<Conn>, id: Id, req: RunRef) {
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        match conn2.ctx.registry.wait(conn2.owner, &req.run_id).await {
            // Serialised by the writer when the parent has room for it: many waits on one
            // large result hold one copy, not one each.
            Ok(result) => {
                let _ = conn2.peer.respond_lazy(&id, result).await;
            }
            Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
        }
    });
}

async fn cancel(conn: &Conn, id: Id, req: RunRef) {
    match conn.ctx.registry.cancel(conn.owner, &req.run_id) {
        Ok(()) => {
            let _ = conn.peer.respond_ok(&id, &Empty {}).await;
        }
        Err(e) => conn.reply_err(&id, &typed_error(&e)).await,
    }
}

fn dispose(conn: &Arc<Conn>, id: Id, req: DisposeRequest) {
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        let keep_branch = req.keep_branch.unwrap_or(true);
        let registry = &conn2.ctx.registry;
        match registry
            .dispose_keeping(conn2.owner, &req.run_id, keep_branch)
            .await
        {
            Ok(()) => {
                conn2.forget_run(&req.run_id);
                let _ = conn2.peer.respond_ok(&id, &Empty {}).await;
            }
            Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
        }
    });
}

fn send(conn: &Arc<Conn>, id: Id, req: SendRequest) {
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        let sent = conn2
            .ctx
            .registry
            .send(conn2.owner, &req.run_id, req.prompt)
            .await;
        match sent {
            Ok(turn) => {
                let reply = SendReply {
                    run_id: req.run_id,
                    turn,
                };
                let _ = conn2.peer.respond_ok(&id, &reply).await;
            }
            Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
        }
    });
}

fn turn_of(state: &RunState) -> Option<u32> {
    match state {
        RunState::Running { turn } | RunState::Settled { turn, .. } => Some(*turn),
        RunState::Disposed => None,
    }
}

async fn list(conn: &Conn, id: Id) {
    let runs = live_runs(conn)
        .filter(|r| r.owner == conn.owner)
        .map(|r| {
            let state = r.state();
            RunSummary {
                run_id: r.run_id.clone(),
                session_id: r.session_id.clone(),
                provider: r.provider.name.clone(),
                label: r.label.clone(),
                state: state.name().to_string(),
                turn: turn_of(&state),
                depth: r.depth,
            }
        })
        .collect();
    let _ = conn.peer.respond_ok(&id, &ListReply { runs }).await;
}

/// Every run not disposed, of any connection.
fn live_runs(conn: &Conn) -> impl Iterator<Item = Arc<Run>> {
    conn.ctx
        .registry
        .runs()
        .into_iter()
        .filter(|r| !matches!(r.state(), RunState::Disposed))
}

/// `_acpd/runs`: the operator's view. acpd's own user (and an in-process caller) sees every
/// run; any other user (`allow_group`) only the runs it started.
async fn runs(conn: &Conn, id: Id) {
    let own = nix::unistd::Uid::effective().as_raw();
    let caller = conn.ctx.peer_uid.filter(|&uid| uid != own);
    let runs = live_runs(conn)
        .filter(|r| caller.is_none_or(|uid| r.uid == Some(uid)))
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
        })
        .collect();
    let sessions = conn.ctx.sessions.entries(conn.ctx.peer_uid);
    let _ = conn
        .peer
        .respond_ok(&id, &RunsReply { runs, sessions })
        .await;
}

/// `_acpd/status`: daemon-wide, any connection may ask.
fn status(conn: &Conn) -> StatusReply {
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
    }
}

/// The containment in force in this process (process groups when it was never set up).
fn containment() -> acpd_protocol::methods::StatusContainment {
    crate::supervise::containment_status()
}

async fn start(conn: &Arc<Conn>, id: Id, req: StartRequest) {
    if let Some(parent) = &req.parent_session_id
        && !lock(&conn.sessions).contains_key(parent)
    {
        let e = RegistryError::InvalidRequest {
            reason: format!("parentSessionId \"{parent}\" names no session of this connection"),
        };
        return conn.reply_err(&id, &typed_error(&e)).await;
    }
    let Some(seat) = conn.take_seat() else {
        return conn.reply_err(&id, &conn.seat_limit()).await;
    };
    let conn2 = conn.clone();
    // Spawned at once: finding where the run nests may wait for a child still starting.
    conn.tracker.spawn(async move {
        let nest = match conn2.nest().await {
            Ok(nest) => nest,
            Err(e) => return conn2.reply_err(&id, &e).await,
        };
        start_nested(conn2, id, req, seat, nest).await;
    });
}

async fn start_nested(
    conn: Arc<Conn>,
    id: Id,
    mut req: StartRequest,
    seat: super::Seat,
    nest: Option<Nest>,
) {
    let run_id = uuid::Uuid::new_v4().to_string();
    let subagent = conn.client().subagents && req.parent_session_id.is_some();
    // From inside a child's tree `maxDepth` counts from that child: `acpd mcp` asks for what
    // is left of the limit it inherited, not knowing where this acpd counts from.
    if let (Some(n), Some(m)) = (&nest, req.max_depth) {
        req.max_depth = Some(n.depth.saturating_add(m));
    }
    let nested_under = nest.as_ref().and_then(|n| match &n.parent {
        Parent::Session(s) => Some(NestedUnder::Session(s.clone())),
        Parent::Run(run_id) => Some(NestedUnder::Run {
            run_id: run_id.clone(),
            session_id: conn.ctx.registry.session_of_run(run_id)?,
        }),
    });
    let provider = req
        .provider
        .clone()
        .unwrap_or_else(|| conn.ctx.registry.config().default_provider.clone());
    lock(&conn.runs).insert(
        run_id.clone(),
        RunMeta {
            parent_session: req.parent_session_id.clone(),
            subagent,
            nested_under: nested_under.clone(),
            session_id: None,
            title: req.label.clone().unwrap_or_else(|| provider.clone()),
            running: false,
            _seat: seat,
        },
    );
    let opts = StartOptions {
        request: req,
        caller_cwd: conn.ctx.caller_cwd.clone(),
        owner: conn.owner,
        events: Some(conn.events.clone()),
        forward_updates: subagent || nested_under.is_some(),
        forward_permissions: true,
        cancel: conn.closing.child_token(),
        run_id: Some(run_id.clone()),
        nest,
        uid: conn.ctx.peer_uid,
        ..Default::default()
    };
    match conn.ctx.registry.start(opts).await {
        Ok(p) => {
            let reply = StartReply {
                run_id: p.run_id,
                session_id: p.session_id,
            };
            let _ = conn.peer.respond_ok(&id, &reply).await;
        }
        Err(e) => {
            lock(&conn.runs).remove(&run_id);
            conn.reply_err(&id, &typed_error(&e)).await;
        }
    }
}
