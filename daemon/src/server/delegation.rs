//! Delegation for parent agents: `_acpd/providers` and `_acpd/subagent/*`, one handler per
//! method, each given its typed body (`acpd_protocol::methods`, read by [`super::dispatch`]).
//! Every method that waits (start, wait, send, dispose) runs in its own task; a connection
//! acts only on the runs it started.

use std::sync::Arc;

use acpd_protocol::envelope::Id;
use acpd_protocol::methods::{
    DisposeReply, DisposeRequest, Empty, ListReply, ProvidersReply, RunRef, RunSummary, SendReply,
    SendRequest, StartReply,
};
use acpd_protocol::subagent::StartRequest;

use super::events::{NestedUnder, RunMeta};
use super::{Conn, lock, typed_error};
use crate::registry::{Nest, Parent, RegistryError, Run, RunState, StartOptions};

/// `_acpd/providers`: what this acpd can delegate to.
pub(super) async fn providers(conn: &Conn, id: Id) {
    let reply = ProvidersReply {
        providers: conn.ctx.registry.providers(),
    };
    let _ = conn.peer.respond_ok(&id, &reply).await;
}

/// `_acpd/subagent/wait`: the run's result once its turn settled, in its own task.
pub(super) fn wait(conn: &Arc<Conn>, id: Id, req: RunRef) {
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

/// `_acpd/subagent/cancel`: the run's turn is cancelled; answered at once.
pub(super) async fn cancel(conn: &Conn, id: Id, req: RunRef) {
    match conn.ctx.registry.cancel(conn.owner, &req.run_id) {
        Ok(()) => {
            let _ = conn.peer.respond_ok(&id, &Empty {}).await;
        }
        Err(e) => conn.reply_err(&id, &typed_error(&e)).await,
    }
}

/// `_acpd/subagent/dispose`: the run ends and its seat is freed, in its own task.
pub(super) fn dispose(conn: &Arc<Conn>, id: Id, req: DisposeRequest) {
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        let keep_branch = req.keep_branch.unwrap_or(true);
        let force = req.force.unwrap_or(false);
        let registry = &conn2.ctx.registry;
        match registry
            .dispose_with(conn2.owner, &req.run_id, keep_branch, force)
            .await
        {
            Ok(kept) => {
                conn2.forget_run(&req.run_id);
                let _ = conn2.peer.respond_ok(&id, &DisposeReply { kept }).await;
            }
            Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
        }
    });
}

/// `_acpd/subagent/send`: another turn of a settled run, in its own task.
pub(super) fn send(conn: &Arc<Conn>, id: Id, req: SendRequest) {
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

/// `_acpd/subagent/list`: this connection's live runs.
pub(super) async fn list(conn: &Conn, id: Id) {
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
pub(super) fn live_runs(conn: &Conn) -> impl Iterator<Item = Arc<Run>> {
    conn.ctx
        .registry
        .runs()
        .into_iter()
        .filter(|r| !matches!(r.state(), RunState::Disposed))
}

/// `_acpd/subagent/start`: checked and given a seat here, started in its own task.
pub(super) async fn start(conn: &Arc<Conn>, id: Id, req: StartRequest) {
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
        principal: conn.ctx.principal.clone(),
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
