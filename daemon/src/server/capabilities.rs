//! What the editor and acpd learn of each other, and authentication. `_acpd/connect` (`acpd
//! connect --provider NAME`) picks the connection's default provider before `initialize`;
//! `initialize` is answered with what the default provider's agent advertises (prompt, MCP and
//! session capabilities, `loadSession`, its auth methods), learned from a live child, an
//! earlier probe, the durable probe cache or a probe now, with acpd's own `_meta.acpd` added;
//! `authenticate` and `logout` are performed on a child of the provider, and a successful
//! `authenticate` is replayed on every later child of that provider this connection starts.

use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use serde_json::json;
use serde_json::value::RawValue;

use super::{CONNECT, ClientInfo, Conn, METHODS, bridge_error, lock};
use crate::child::AgentInfo;

/// `_acpd/connect {"provider": NAME}`, before `initialize`: NAME is this connection's
/// default provider (what `initialize` mirrors, what `session/new` without
/// `_meta.acpd.provider` opens). An unknown name is refused, so `acpd connect` can say so.
pub(super) fn connect(conn: &Conn, params: Option<&RawValue>) -> Result<(), RpcError> {
    if lock(&conn.client).is_some() {
        return Err(RpcError::invalid_request(format!(
            "{CONNECT} must come before initialize"
        )));
    }
    let name = params
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
        .and_then(|v| v.get("provider")?.as_str().map(str::to_string))
        .ok_or_else(|| RpcError::invalid_params(format!("{CONNECT} needs a provider name")))?;
    let config = conn.ctx.registry.config();
    if !config.providers.contains_key(&name) {
        return Err(RpcError::invalid_params(format!(
            "no provider named {name:?} in {}; {}",
            config.source.as_deref().map_or_else(
                || "the built-in config".to_string(),
                |p| p.display().to_string()
            ),
            crate::config::suggest::unknown_provider(&config, &name)
        )));
    }
    *lock(&conn.provider) = Some(name);
    Ok(())
}

/// The editor's `initialize`: its capabilities noted at once, so requests it sends right
/// after are served even before the answer (which may wait for a probe) is out.
/// Returns whether the client is only querying acpd (`_meta.acpd.query`: `acpd status`,
/// `acpd runs`), which needs no word from the agent.
pub(super) fn note_client(conn: &Conn, params: Option<&RawValue>) -> bool {
    let params_text = params;
    let params: serde_json::Value = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default();
    let query = params.pointer("/_meta/acpd/query") == Some(&json!(true));
    let capabilities = params
        .get("clientCapabilities")
        .cloned()
        .unwrap_or(json!({}));
    /// The key's value as written (read again: `params` above is a value).
    #[derive(serde::Deserialize)]
    struct Written {
        #[serde(rename = "clientCapabilities")]
        caps: Option<Box<RawValue>>,
    }
    let written = params_text
        .and_then(|p| serde_json::from_str::<Written>(p.get()).ok())
        .and_then(|w| w.caps);
    let subagents = capabilities.get("subagents").is_some_and(|v| !v.is_null());
    *lock(&conn.client) = Some(ClientInfo {
        capabilities,
        written: crate::child::ClientCaps::from_raw(written),
        subagents,
    });
    query
}

/// Answers `initialize` with the default agent's capabilities, mirrored (acpd's own to a
/// query).
pub(super) async fn initialize(conn: Arc<Conn>, id: Id, query: bool) {
    let registry = &conn.ctx.registry;
    let agent = if query { None } else { learn(&conn).await };
    let providers: Vec<String> = registry.providers().into_iter().map(|p| p.name).collect();
    let _ = conn
        .peer
        .respond_ok(&id, &answer(agent.as_ref(), &providers))
        .await;
}

/// What the default agent advertises, or `None` (logged) when it cannot be learned.
async fn learn(conn: &Conn) -> Option<AgentInfo> {
    let registry = &conn.ctx.registry;
    let default = conn.default_provider();
    match registry
        .agent_info(
            Some(&default),
            Some(&conn.ctx.sessions.store),
            &conn.closing,
        )
        .await
    {
        Ok(agent) => Some(agent),
        Err(e) => {
            tracing::warn!(provider = %default,
                "cannot learn what the default agent advertises; answering initialize conservatively: {e}");
            None
        }
    }
}

/// The `initialize` result: the agent's own, with `_meta.acpd`; acpd's conservative one when
/// the agent could not be asked.
fn answer(agent: Option<&AgentInfo>, providers: &[String]) -> serde_json::Value {
    let acpd = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "methods": METHODS,
        "providers": providers,
    });
    let Some(agent) = agent else {
        return json!({
            "protocolVersion": 1,
            "agentCapabilities": {
                "loadSession": false,
                "promptCapabilities": { "image": false, "audio": false, "embeddedContext": false },
                "mcpCapabilities": { "http": false, "sse": false },
                "sessionCapabilities": {},
                "_meta": { "acpd": acpd },
            },
            "authMethods": [],
            "agentInfo": { "name": "acpd", "version": env!("CARGO_PKG_VERSION") },
        });
    };
    let mut caps = match &agent.capabilities {
        serde_json::Value::Object(_) => agent.capabilities.clone(),
        _ => json!({}),
    };
    if !caps.get("_meta").is_some_and(|m| m.is_object()) {
        caps["_meta"] = json!({});
    }
    caps["_meta"]["acpd"] = acpd;
    let mut result = json!({
        "protocolVersion": 1,
        "agentCapabilities": caps,
        "authMethods": agent.auth_methods,
    });
    if !agent.agent_info.is_null() {
        result["agentInfo"] = agent.agent_info.clone();
    }
    if agent.meta.is_object() {
        result["_meta"] = agent.meta.clone();
    }
    result
}

/// What a request asked of a new child does to the connection's login with the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Login {
    /// `authenticate`: the login is replayed first, and these params replace it once the agent
    /// accepted them.
    Take,
    /// `logout`: the login is forgotten first, so no later child replays it.
    Drop,
    /// Anything else: the login is replayed, and kept.
    Keep,
}

/// `authenticate`, `logout` and any other request naming no session that acpd has no part in:
/// asked of a new child of the provider (`_meta.acpd.provider`, else the default), with the
/// connection's login replayed, whose answer, error included, goes to the editor as it is.
pub(super) async fn ask_new_child(
    conn: Arc<Conn>,
    id: Id,
    method: String,
    login: Login,
    params: Option<Box<RawValue>>,
) {
    let provider = params
        .as_deref()
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok())
        .and_then(|v| {
            v.pointer("/_meta/acpd/provider")?
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_else(|| conn.default_provider());
    let params = params.unwrap_or_else(|| super::raw(&json!({})));
    // A logout forgets the login first, so no later child replays it.
    let prior = if login == Login::Drop {
        lock(&conn.auth).remove(&provider);
        None
    } else {
        conn.auth_for(&provider)
    };
    let ready = conn
        .ctx
        .registry
        .ready(
            Some(&provider),
            None,
            crate::child::ClientCaps::default(),
            prior.as_deref(),
            &conn.closing,
        )
        .await;
    let mut ready = match ready {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &bridge_error(&e)).await,
    };
    let answer = ready.call(&method, &params, &conn.closing).await;
    ready.close().await;
    match answer {
        Ok(result) => {
            if login == Login::Take {
                lock(&conn.auth).insert(provider, params);
            }
            let _ = conn.peer.respond(&id, Ok(&result)).await;
        }
        Err(e) => {
            let e: RpcError = bridge_error(&e);
            conn.reply_err(&id, &e).await
        }
    }
}
