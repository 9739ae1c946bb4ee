//! The echo agent's answers to everything but `session/prompt`: the handshake, auth, the
//! session lifecycle (new, and with `--sessions` load, resume, list, close, delete, fork) and
//! `_` extension requests.
//!
//! Apart from a session/load replay these answer at once, from the incoming loop.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use acpd_protocol::envelope::{AUTH_REQUIRED, RESOURCE_NOT_FOUND, RpcError};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::echo::{Agent, Session, lock, parse_params, text_of};
use super::session_files::{self, SessionFile, Store};
use super::{EchoArgs, PromptCap};

type Reply = Result<serde_json::Value, RpcError>;

/// Prefix of the extension requests the echo agent answers (with what it received).
const ECHO_EXT: &str = "_echo/";

/// Answers `method`; `session/prompt` is the caller's.
pub(super) async fn handle(agent: &Arc<Agent>, method: &str, params: Option<&RawValue>) -> Reply {
    let store = agent.store.as_ref();
    match (method, store) {
        ("initialize", _) => {
            let params = parse_params::<serde_json::Value>(params).ok();
            let subagents = params
                .as_ref()
                .and_then(|p| p.pointer("/clientCapabilities/subagents"))
                .is_some_and(|v| !v.is_null());
            agent.client_subagents.store(subagents, Ordering::Release);
            *lock(&agent.client_caps) = params
                .as_ref()
                .and_then(|p| p.get("clientCapabilities"))
                .cloned()
                .unwrap_or_default();
            let air = agent.args.air && params.as_ref().is_some_and(declares_air_session_failure);
            agent.client_air.store(air, Ordering::Release);
            let mut result = initialize_result(&agent.args);
            if air {
                result["_meta"] = json!({"jetbrains": {"air": {
                    "version": 1, "capabilities": ["sessionFailure"],
                }}});
            }
            Ok(result)
        }
        ("authenticate", _) if !agent.args.auth.is_empty() => authenticate(agent, params),
        ("session/new", _) => {
            require_auth(agent)?;
            new_session(agent, params)
        }
        ("session/load", Some(store)) => {
            require_auth(agent)?;
            load(agent, store, params).await
        }
        ("session/resume", Some(store)) => {
            require_auth(agent)?;
            resume(agent, store, params)
        }
        ("session/list", Some(store)) => {
            require_auth(agent)?;
            list(agent, store, params)
        }
        ("session/close", Some(store)) => close(agent, store, params, false),
        ("session/delete", Some(store)) => close(agent, store, params, true),
        ("session/fork", Some(store)) => fork(agent, store, params),
        // The echo agent's own extension namespace answers with what it was sent, so tests can
        // see a request arrive; any other `_` method is unknown, as in every ACP agent.
        (other, _) if other.starts_with(ECHO_EXT) => {
            let params = parse_params::<serde_json::Value>(params).unwrap_or_default();
            Ok(json!({ "echo": other, "params": params }))
        }
        (other, _) => Err(RpcError::method_not_found(other)),
    }
}

/// codex-acp's rule for an AIR client: `clientCapabilities._meta.jetbrains.air` with an
/// integer `version` of at least 1 and a `capabilities` array holding the exact name.
fn declares_air_session_failure(params: &serde_json::Value) -> bool {
    let Some(air) = params.pointer("/clientCapabilities/_meta/jetbrains/air") else {
        return false;
    };
    air.get("version")
        .and_then(serde_json::Value::as_u64)
        .is_some_and(|v| v >= 1)
        && air
            .get("capabilities")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|c| c.iter().any(|c| c == "sessionFailure"))
}

fn initialize_result(args: &EchoArgs) -> serde_json::Value {
    let mut session_capabilities = serde_json::Map::new();
    if args.system_prompt {
        session_capabilities.insert("systemPrompt".into(), json!({}));
    }
    if args.sessions.is_some() {
        for name in ["list", "resume", "close", "delete", "fork"] {
            session_capabilities.insert(name.into(), json!({}));
        }
    }
    if args.subagents {
        session_capabilities.insert("subagents".into(), json!({}));
    }
    let cap = |c| args.prompt_caps.contains(&c);
    let auth_methods: Vec<_> = args
        .auth
        .iter()
        .map(|id| json!({"id": id, "name": id}))
        .collect();
    json!({
        "protocolVersion": args.protocol_version,
        "agentCapabilities": {
            "loadSession": args.sessions.is_some(),
            "promptCapabilities": {
                "image": cap(PromptCap::Image),
                "audio": cap(PromptCap::Audio),
                "embeddedContext": cap(PromptCap::Embedded),
            },
            "mcpCapabilities": {"http": false, "sse": false},
            "sessionCapabilities": session_capabilities,
        },
        "authMethods": auth_methods,
        "agentInfo": {"name": "acpd-echo", "version": env!("CARGO_PKG_VERSION")},
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthenticateParams {
    method_id: String,
}

fn authenticate(agent: &Agent, params: Option<&RawValue>) -> Reply {
    let params: AuthenticateParams = parse_params(params)?;
    if !agent.args.auth.contains(&params.method_id) {
        return Err(RpcError::invalid_params(format!(
            "unknown auth method {:?}",
            params.method_id
        )));
    }
    *lock(&agent.authenticated) = Some(params.method_id);
    Ok(json!({}))
}

/// With `--auth`, refuses until `authenticate` succeeded, as ACP's AUTH_REQUIRED.
fn require_auth(agent: &Agent) -> Result<(), RpcError> {
    if agent.args.auth.is_empty() || lock(&agent.authenticated).is_some() {
        return Ok(());
    }
    Err(RpcError::new(AUTH_REQUIRED, "Authentication required")
        .with_data(json!({ "authMethods": agent.args.auth })))
}

fn not_found(session_id: &str) -> RpcError {
    RpcError::new(RESOURCE_NOT_FOUND, "Session not found")
        .with_data(json!({ "sessionId": session_id }))
}

fn absolute_cwd(cwd: Option<String>) -> Result<String, RpcError> {
    match cwd {
        Some(cwd) if Path::new(&cwd).is_absolute() => Ok(cwd),
        Some(cwd) => Err(RpcError::invalid_params(format!(
            "cwd must be an absolute path, got {cwd:?}"
        ))),
        None => Err(RpcError::invalid_params("missing cwd")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSessionParams {
    cwd: Option<String>,
    #[serde(default)]
    system_prompt: Option<SystemPrompt>,
    #[serde(default)]
    mcp_servers: Vec<serde_json::Value>,
    #[serde(default, rename = "_meta")]
    meta: serde_json::Value,
}

#[derive(Deserialize)]
struct SystemPrompt {
    content: Vec<serde_json::Value>,
}

fn new_session(agent: &Agent, params: Option<&RawValue>) -> Reply {
    let params: NewSessionParams = parse_params(params)?;
    let cwd = absolute_cwd(params.cwd)?;
    let system_prompt = params.system_prompt.map(|p| text_of(&p.content));
    let (session_id, file) = match &agent.store {
        // Counted ids without --sessions: what every test before them expects.
        None => {
            let n = agent.next_session.fetch_add(1, Ordering::Relaxed);
            (format!("echo-{n}"), None)
        }
        Some(store) => {
            let file = SessionFile {
                session_id: session_files::new_id(),
                cwd,
                title: None,
                updated_at: session_files::now(),
                history: Vec::new(),
            };
            store.save(&file).map_err(RpcError::internal)?;
            (file.session_id.clone(), Some(file))
        }
    };
    let mut session = Session::new(system_prompt, file);
    session.mcp_servers = params.mcp_servers;
    session.meta = params.meta;
    lock(&agent.sessions).insert(session_id.clone(), session);
    Ok(json!({ "sessionId": session_id }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionParams {
    session_id: String,
    #[serde(default)]
    cwd: Option<String>,
}

/// The session's current state: the live copy if this process has it, else its file.
fn find(agent: &Agent, store: &Store, session_id: &str) -> Result<SessionFile, RpcError> {
    let live = lock(&agent.sessions)
        .get(session_id)
        .and_then(|s| s.file.clone());
    match live {
        Some(file) => Ok(file),
        None => store
            .load(session_id)
            .map_err(RpcError::internal)?
            .ok_or_else(|| not_found(session_id)),
    }
}

/// Makes `file` live in this process unless it already is (a running turn is kept).
fn make_live(agent: &Agent, file: SessionFile) {
    lock(&agent.sessions)
        .entry(file.session_id.clone())
        .or_insert_with(|| Session::new(None, Some(file)));
}

/// Opens a stored session: the client's cwd (when given) becomes the session's.
fn open(agent: &Agent, store: &Store, params: SessionParams) -> Result<SessionFile, RpcError> {
    let mut file = find(agent, store, &params.session_id)?;
    if let Some(cwd) = params.cwd {
        file.cwd = absolute_cwd(Some(cwd))?;
    }
    make_live(agent, file.clone());
    Ok(file)
}

/// `session/load`: the history replayed as updates, then the answer.
async fn load(agent: &Agent, store: &Store, params: Option<&RawValue>) -> Reply {
    let file = open(agent, store, parse_params(params)?)?;
    for entry in &file.history {
        let params = json!({
            "sessionId": file.session_id,
            "update": {
                "sessionUpdate": entry.role.update_kind(),
                "content": {"type": "text", "text": entry.text},
            },
        });
        let _ = agent.peer.notify("session/update", &params).await;
    }
    Ok(json!({}))
}

fn resume(agent: &Agent, store: &Store, params: Option<&RawValue>) -> Reply {
    open(agent, store, parse_params(params)?)?;
    Ok(json!({}))
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
}

fn list(agent: &Agent, store: &Store, params: Option<&RawValue>) -> Reply {
    let params: ListParams = match params {
        None => ListParams::default(),
        Some(raw) if raw.get() == "null" => ListParams::default(),
        Some(_) => parse_params(params)?,
    };
    let all = store
        .list(params.cwd.as_deref())
        .map_err(RpcError::internal)?;
    let size = usize::try_from(agent.args.list_page).unwrap_or(usize::MAX);
    let (page, next) = session_files::page(all, params.cursor.as_deref(), size)
        .map_err(RpcError::invalid_params)?;
    let sessions: Vec<_> = page
        .into_iter()
        .map(|s| {
            let mut info = json!({
                "sessionId": s.session_id,
                "cwd": s.cwd,
                "updatedAt": s.updated_at,
            });
            if let Some(title) = s.title {
                info["title"] = json!(title);
            }
            info
        })
        .collect();
    let mut result = json!({ "sessions": sessions });
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    } else if agent.args.null_cursor {
        result["nextCursor"] = serde_json::Value::Null;
    }
    Ok(result)
}

/// `session/close` forgets the live session (its turn cancelled); `session/delete` also
/// removes its file. A close of a session neither live nor stored is -32002; a delete of one
/// succeeds, as claude-agent-acp's and codex-acp's do (deleting is idempotent).
fn close(agent: &Agent, store: &Store, params: Option<&RawValue>, delete: bool) -> Reply {
    let params: SessionParams = parse_params(params)?;
    let live = lock(&agent.sessions).remove(&params.session_id);
    if let Some(session) = &live {
        session.cancel_turn();
    }
    let stored = if delete {
        store
            .delete(&params.session_id)
            .map_err(RpcError::internal)?
    } else {
        store
            .load(&params.session_id)
            .map_err(RpcError::internal)?
            .is_some()
    };
    if live.is_none() && !stored && !delete {
        return Err(not_found(&params.session_id));
    }
    Ok(json!({}))
}

fn fork(agent: &Agent, store: &Store, params: Option<&RawValue>) -> Reply {
    let params: SessionParams = parse_params(params)?;
    let source = find(agent, store, &params.session_id)?;
    let cwd = match params.cwd {
        Some(cwd) => absolute_cwd(Some(cwd))?,
        None => source.cwd.clone(),
    };
    let file = SessionFile {
        session_id: session_files::new_id(),
        cwd,
        updated_at: session_files::now(),
        ..source
    };
    store.save(&file).map_err(RpcError::internal)?;
    let session_id = file.session_id.clone();
    make_live(agent, file);
    Ok(json!({ "sessionId": session_id }))
}
