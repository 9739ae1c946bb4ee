//! Delegation for parent agents: `_acpd/providers` and `_acpd/subagent/*`. Every method that
//! waits (start, wait, send, dispose) runs in its own task; a connection acts only on the runs
//! it started.

use std::sync::Arc;

use acpd_protocol::acp::ContentBlock;
use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::subagent::StartRequest;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use serde_json::value::RawValue;

use super::events::RunMeta;
use super::{Conn, lock, typed_error};
use crate::registry::{RegistryError, RunState, StartOptions};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunRef {
    run_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Send {
    run_id: String,
    prompt: Vec<ContentBlock>,
}

fn parse<T: DeserializeOwned>(params: Option<&RawValue>) -> Result<T, RpcError> {
    let text = params.map_or("null", |p| p.get());
    serde_json::from_str(text).map_err(|e| {
        typed_error(&RegistryError::InvalidRequest {
            reason: e.to_string(),
        })
    })
}

pub async fn handle(conn: &Arc<Conn>, id: Id, method: &str, params: Option<Box<RawValue>>) {
    let params = params.as_deref();
    match method {
        "_acpd/providers" => {
            let providers = conn.ctx.registry.providers();
            let _ = conn
                .peer
                .respond_ok(&id, &json!({ "providers": providers }))
                .await;
        }
        "_acpd/subagent/start" => match parse::<StartRequest>(params) {
            Ok(req) => start(conn, id, req).await,
            Err(e) => conn.reply_err(&id, &e).await,
        },
        "_acpd/subagent/wait" => match parse::<RunRef>(params) {
            Ok(r) => {
                let conn2 = conn.clone();
                conn.tracker.spawn(async move {
                    match conn2.ctx.registry.wait(conn2.owner, &r.run_id).await {
                        // Serialised by the writer when the parent has room for it: many
                        // waits on one large result hold one copy, not one each.
                        Ok(result) => {
                            let _ = conn2.peer.respond_lazy(&id, result).await;
                        }
                        Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
                    }
                });
            }
            Err(e) => conn.reply_err(&id, &e).await,
        },
        "_acpd/subagent/cancel" => match parse::<RunRef>(params) {
            Ok(r) => match conn.ctx.registry.cancel(conn.owner, &r.run_id) {
                Ok(()) => {
                    let _ = conn.peer.respond_ok(&id, &json!({})).await;
                }
                Err(e) => conn.reply_err(&id, &typed_error(&e)).await,
            },
            Err(e) => conn.reply_err(&id, &e).await,
        },
        "_acpd/subagent/dispose" => match parse::<RunRef>(params) {
            Ok(r) => {
                let conn2 = conn.clone();
                conn.tracker.spawn(async move {
                    match conn2.ctx.registry.dispose(conn2.owner, &r.run_id).await {
                        Ok(()) => {
                            conn2.forget_run(&r.run_id);
                            let _ = conn2.peer.respond_ok(&id, &json!({})).await;
                        }
                        Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
                    }
                });
            }
            Err(e) => conn.reply_err(&id, &e).await,
        },
        "_acpd/subagent/send" => match parse::<Send>(params) {
            Ok(s) => {
                let conn2 = conn.clone();
                conn.tracker.spawn(async move {
                    match conn2
                        .ctx
                        .registry
                        .send(conn2.owner, &s.run_id, s.prompt)
                        .await
                    {
                        Ok(turn) => {
                            let reply = json!({ "runId": s.run_id, "turn": turn });
                            let _ = conn2.peer.respond_ok(&id, &reply).await;
                        }
                        Err(e) => conn2.reply_err(&id, &typed_error(&e)).await,
                    }
                });
            }
            Err(e) => conn.reply_err(&id, &e).await,
        },
        "_acpd/subagent/list" => {
            let runs: Vec<serde_json::Value> = conn
                .ctx
                .registry
                .runs()
                .into_iter()
                .filter(|r| r.owner == conn.owner)
                .map(|r| {
                    let state = r.state();
                    let turn = match &state {
                        RunState::Running { turn } | RunState::Settled { turn, .. } => Some(*turn),
                        RunState::Disposed => None,
                    };
                    json!({
                        "runId": r.run_id,
                        "sessionId": r.session_id,
                        "provider": r.provider.name,
                        "label": r.label,
                        "state": state.name(),
                        "turn": turn,
                        "depth": r.depth,
                    })
                })
                .collect();
            let _ = conn.peer.respond_ok(&id, &json!({ "runs": runs })).await;
        }
        "_acpd/status" => {
            let _ = conn.peer.respond_ok(&id, &status(conn)).await;
        }
        "_acpd/runs" => {
            let runs: Vec<serde_json::Value> = conn
                .ctx
                .registry
                .runs()
                .into_iter()
                .filter(|r| !matches!(r.state(), RunState::Disposed))
                .map(|r| {
                    json!({
                        "runId": r.run_id,
                        "provider": r.provider.name,
                        "label": r.label,
                        "state": r.state().name(),
                        "ageS": r.started_at.elapsed().as_secs(),
                        "pid": r.pid(),
                        "depth": r.depth,
                        "connection": r.owner,
                    })
                })
                .collect();
            let _ = conn.peer.respond_ok(&id, &json!({ "runs": runs })).await;
        }
        _ => {
            conn.reply_err(&id, &RpcError::method_not_found(method))
                .await
        }
    }
}

/// `_acpd/status`: daemon-wide, any connection may ask.
fn status(conn: &Conn) -> serde_json::Value {
    let registry = &conn.ctx.registry;
    let config = registry.config();
    let runs = registry
        .runs()
        .iter()
        .filter(|r| !matches!(r.state(), RunState::Disposed))
        .count();
    let providers: serde_json::Map<String, serde_json::Value> = config
        .providers
        .values()
        .map(|p| {
            let live = registry.live_children_of(&p.name);
            (
                p.name.clone(),
                json!({ "maxConcurrent": p.max_concurrent, "live": live }),
            )
        })
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "uptimeS": conn.ctx.daemon.started.elapsed().as_secs(),
        "connections": conn.ctx.daemon.connections.load(std::sync::atomic::Ordering::Relaxed),
        "runs": runs,
        "providers": config.providers.keys().collect::<Vec<_>>(),
        "limits": {
            "maxChildren": config.max_children,
            "liveChildren": registry.live_children(),
            "queued": registry.queued(),
            "queueTimeoutS": config.queue_timeout.map(|d| d.as_secs_f64()),
            "providers": providers,
        },
    })
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
    let run_id = uuid::Uuid::new_v4().to_string();
    let subagent = conn.client().subagents && req.parent_session_id.is_some();
    let provider = req
        .provider
        .clone()
        .unwrap_or_else(|| conn.ctx.registry.config().default_provider.clone());
    lock(&conn.runs).insert(
        run_id.clone(),
        RunMeta {
            parent_session: req.parent_session_id.clone(),
            subagent,
            session_id: None,
            title: req.label.clone().unwrap_or_else(|| provider.clone()),
            running: false,
            _seat: seat,
        },
    );
    let conn2 = conn.clone();
    conn.tracker.spawn(async move {
        let opts = StartOptions {
            request: req,
            caller_cwd: conn2.ctx.caller_cwd.clone(),
            owner: conn2.owner,
            events: Some(conn2.events.clone()),
            forward_updates: subagent,
            forward_permissions: true,
            cancel: conn2.closing.child_token(),
            run_id: Some(run_id.clone()),
            ..Default::default()
        };
        match conn2.ctx.registry.start(opts).await {
            Ok(p) => {
                let reply = json!({ "runId": p.run_id, "sessionId": p.session_id });
                let _ = conn2.peer.respond_ok(&id, &reply).await;
            }
            Err(e) => {
                lock(&conn2.runs).remove(&run_id);
                conn2.reply_err(&id, &typed_error(&e)).await;
            }
        }
    });
}
