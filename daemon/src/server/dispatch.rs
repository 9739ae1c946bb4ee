//! The router's one dispatch. A parent's message is parsed once into a [`Request`] or a
//! [`Notification`] — which method acpd reads it as, its params as far as routing needs them
//! (the `_acpd/*` bodies typed, the session a forwarded message names) — then passes the
//! connection's gates in order, then one match hands it to its handler. Method names are read
//! here and nowhere else in `server/`.
//!
//! The router never waits on a turn: a handler that takes time (opening a child, a start, a
//! wait, a dispose, a probe) is spawned on the connection's tracker and answers from there;
//! what is answered here is answered at once.

use std::sync::Arc;

use acpd_protocol::envelope::{self, Id, RpcError};
use acpd_protocol::errors::ErrorName;
use acpd_protocol::methods::{DisposeRequest, Empty, RunRef, SendRequest, name, parse_params};
use acpd_protocol::session_id::{duplicate_routing_key, session_id};
use acpd_protocol::subagent::StartRequest;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::bridge::{self, Reopen};
use super::capabilities::{self, Login};
use super::forward::{self, Forwarded};
use super::{CONNECT, Conn, delegation, lock, operator, session_delete, session_list, typed_error};
use crate::registry::{Lineage, RegistryError};
use crate::wire::{self, LineFault};

type Params = Option<Box<RawValue>>;

/// A parent's request, as acpd reads it.
pub(super) enum Request {
    /// `_acpd/connect`: this connection's default provider, before `initialize`.
    Connect(Params),
    Initialize(Params),
    /// `authenticate` or `logout`, performed on a new child of the provider.
    Login(Login, Params),
    /// `session/new`: a bridge session.
    NewSession(Params),
    /// `session/load` or `session/resume` of an acpd id.
    Reopen(Reopen, Params),
    ForkSession(Params),
    ListSessions(Params),
    DeleteSession(Params),
    /// `session/close`: passed to the session's agent when it is open here, else ended by id.
    CloseSession {
        session: Option<String>,
        params: Params,
    },
    /// `_acpd/providers`.
    Providers,
    /// `_acpd/subagent/start`.
    Start(Box<StartRequest>),
    /// `_acpd/subagent/wait`.
    Wait(RunRef),
    /// `_acpd/subagent/cancel`.
    CancelRun(RunRef),
    /// `_acpd/subagent/dispose`.
    Dispose(DisposeRequest),
    /// `_acpd/subagent/send`.
    Send(SendRequest),
    /// `_acpd/subagent/list`.
    ListRuns,
    /// `_acpd/status`.
    Status,
    /// `_acpd/runs`.
    Runs,
    /// `_acpd/reload`.
    Reload,
    /// `_acpd/tokens/reload`.
    ReloadTokens,
    /// `_acpd/metrics`.
    Metrics,
    /// An `_acpd/*` request whose params do not read as its body: why.
    Invalid(String),
    /// An `_acpd/*` method acpd does not serve.
    UnknownAcpd,
    /// Any other method: to the session it names, else to a new child (see
    /// [`forward::request`]).
    Forward {
        kind: Forwarded,
        session: Option<String>,
        params: Params,
    },
}

impl Request {
    /// The one reading of a request's method (and, where routing needs it, its params).
    fn parse(method: &str, params: Params) -> Request {
        let forward = |kind, params: Params| Request::Forward {
            kind,
            session: params.as_deref().and_then(session_id),
            params,
        };
        match method {
            CONNECT => Request::Connect(params),
            m if m.starts_with(name::PREFIX) => Request::acpd(m, params.as_deref()),
            "initialize" => Request::Initialize(params),
            "authenticate" => Request::Login(Login::Take, params),
            "logout" => Request::Login(Login::Drop, params),
            "session/new" => Request::NewSession(params),
            "session/load" => Request::Reopen(Reopen::Load, params),
            "session/resume" => Request::Reopen(Reopen::Resume, params),
            "session/fork" => Request::ForkSession(params),
            "session/list" => Request::ListSessions(params),
            "session/delete" => Request::DeleteSession(params),
            "session/close" => Request::CloseSession {
                session: params.as_deref().and_then(session_id),
                params,
            },
            "session/prompt" => forward(Forwarded::Prompt, params),
            "session/set_title" => forward(Forwarded::SetTitle, params),
            m if m.starts_with("session/") => forward(Forwarded::Session, params),
            // An extension, or an ACP method acpd has no part in or that is newer than acpd.
            _ => forward(Forwarded::Other, params),
        }
    }

    /// An `_acpd/*` request, its body typed.
    fn acpd(method: &str, params: Option<&RawValue>) -> Request {
        match method {
            name::PROVIDERS => empty(params, Request::Providers),
            name::START => body(params, |r| Request::Start(Box::new(r))),
            name::WAIT => body(params, Request::Wait),
            name::CANCEL => body(params, Request::CancelRun),
            name::DISPOSE => body(params, Request::Dispose),
            name::SEND => body(params, Request::Send),
            name::LIST => empty(params, Request::ListRuns),
            name::STATUS => empty(params, Request::Status),
            name::RUNS => empty(params, Request::Runs),
            name::RELOAD => empty(params, Request::Reload),
            name::TOKENS_RELOAD => empty(params, Request::ReloadTokens),
            name::METRICS => empty(params, Request::Metrics),
            _ => Request::UnknownAcpd,
        }
    }

    /// What an observer token may ask: to read, never to start, change or prompt.
    fn observes_only(&self) -> bool {
        matches!(
            self,
            Request::Connect(_)
                | Request::Initialize(_)
                | Request::ListSessions(_)
                | Request::Providers
                | Request::ListRuns
                | Request::Status
                | Request::Runs
                | Request::Metrics
        )
    }

    /// What a connection from inside a child's process tree may not ask: a bridge session it
    /// opened would start at the top of the depth count, and one it loaded, closed, deleted or
    /// renamed could be its own ancestor's (the prompts and settings of a session pass only to
    /// those this connection holds, and it holds none).
    fn bridge_only(&self) -> bool {
        match self {
            Request::Login(..)
            | Request::NewSession(_)
            | Request::Reopen(..)
            | Request::ForkSession(_)
            | Request::ListSessions(_)
            | Request::DeleteSession(_)
            | Request::CloseSession { .. } => true,
            Request::Forward { kind, .. } => *kind == Forwarded::SetTitle,
            _ => false,
        }
    }
}

/// `T` read from an `_acpd/*` request's params, or why it cannot be.
fn body<T: DeserializeOwned>(
    params: Option<&RawValue>,
    wrap: impl FnOnce(T) -> Request,
) -> Request {
    match parse_params(params) {
        Ok(t) => wrap(t),
        Err(reason) => Request::Invalid(reason),
    }
}

/// An `_acpd/*` request that takes no params (`{}` or none).
fn empty(params: Option<&RawValue>, request: Request) -> Request {
    body(params, |Empty {}| request)
}

/// The connection's gates, in order: `initialize` first (but `_acpd/connect` before it), and
/// nothing of bridge sessions from inside a child's process tree.
fn gate(conn: &Conn, request: &Request, method: &str) -> Result<(), RpcError> {
    if matches!(request, Request::Connect(_) | Request::Initialize(_)) {
        return Ok(());
    }
    if lock(&conn.client).is_none() {
        return Err(RpcError::invalid_request(format!(
            "initialize must complete before {method}"
        )));
    }
    if let Some(crate::server::Principal::Token { name, role, .. }) = &conn.ctx.principal
        && *role == crate::store::tokens::Role::Observer
        && !request.observes_only()
    {
        return Err(RpcError::new(
            ErrorName::NotPermitted.code(),
            format!(
                "{method}: token {name:?} is an observer; it may list sessions and read acpd's \
             status, not open, change or prompt (make a controller token with \
             `acpd token create NAME --role controller`)"
            ),
        )
        .with_data(
            serde_json::json!({ "code": ErrorName::NotPermitted.as_str(), "role": "observer" }),
        ));
    }
    if request.bridge_only() && !matches!(conn.lineage(), Lineage::Outside) {
        return Err(RpcError::invalid_request(format!(
            "{method}: this connection comes from inside the process tree of a child of \
             this acpd, which may delegate (_acpd/subagent/*, depth counted from it) but not \
             open or touch bridge sessions"
        )));
    }
    Ok(())
}

/// Answers, or hands on, one request of the parent.
pub(super) async fn request(conn: &Arc<Conn>, id: Id, method: String, params: Params) {
    match conn.peer.admit(&id) {
        wire::Admit::Yes => {}
        wire::Admit::Full => {
            crate::metrics::get().limit_hit(crate::metrics::Limit::MaxPendingRequests);
            let max = conn.ctx.registry.config().max_pending_requests;
            let e = RpcError::limit("max_pending_requests", max as u64);
            let _ = conn.peer.respond_err(Some(&id), &e).await;
            return;
        }
        wire::Admit::DuplicateId => {
            let e = RpcError::invalid_request(format!(
                "id {id} is already used by a request that has not been answered"
            ));
            let _ = conn
                .peer
                .send_line(envelope::encode_error(Some(&id), &e))
                .await;
            return;
        }
    }
    // A session id (or another routing key) written twice means one session to a reader
    // that takes the first and another to one that takes the last: refused, not guessed.
    if let Some(key) = params
        .as_deref()
        .and_then(|p| duplicate_routing_key(p.get()))
    {
        let e = RpcError::invalid_request(format!(
            "{method}: the key \"{key}\" appears twice in the params; send it once"
        ));
        return conn.reply_err(&id, &e).await;
    }
    let request = Request::parse(&method, params);
    if let Err(e) = gate(conn, &request, &method) {
        return conn.reply_err(&id, &e).await;
    }
    handle(conn, id, method, request).await;
}

/// The one match: each request to its handler. `method` is the name as the parent sent it,
/// for the answers that quote it.
async fn handle(conn: &Arc<Conn>, id: Id, method: String, request: Request) {
    let tracker = &conn.tracker;
    match request {
        Request::Connect(params) => match capabilities::connect(conn, params.as_deref()) {
            Ok(()) => {
                let _ = conn.peer.respond_ok(&id, &serde_json::json!({})).await;
            }
            Err(e) => conn.reply_err(&id, &e).await,
        },
        Request::Initialize(params) => {
            // Spawned: learning what the agent advertises may take a probe.
            let query = capabilities::note_client(conn, params.as_deref());
            tracker.spawn(capabilities::initialize(conn.clone(), id, query));
        }
        Request::Login(login, params) => {
            tracker.spawn(capabilities::ask_new_child(
                conn.clone(),
                id,
                method,
                login,
                params,
            ));
        }
        Request::NewSession(params) => {
            tracker.spawn(bridge::open(conn.clone(), id, params));
        }
        Request::Reopen(reopen, params) => {
            tracker.spawn(bridge::load(conn.clone(), id, reopen, params));
        }
        Request::ForkSession(params) => {
            tracker.spawn(bridge::fork(conn.clone(), id, params));
        }
        Request::ListSessions(params) => {
            tracker.spawn(session_list::list(conn.clone(), id, params));
        }
        Request::DeleteSession(params) => {
            tracker.spawn(session_delete::delete(conn.clone(), id, params));
        }
        Request::CloseSession { session, params }
            if session
                .as_deref()
                .is_some_and(|s| conn.session(s).is_some()) =>
        {
            let kind = Forwarded::Session;
            forward::request(conn, id, method, kind, session, params).await;
        }
        Request::CloseSession { params, .. } => {
            tracker.spawn(session_delete::close_elsewhere(conn.clone(), id, params));
        }
        Request::Providers => delegation::providers(conn, id).await,
        Request::Start(req) => delegation::start(conn, id, *req).await,
        Request::Wait(req) => delegation::wait(conn, id, req),
        Request::CancelRun(req) => delegation::cancel(conn, id, req).await,
        Request::Dispose(req) => delegation::dispose(conn, id, req),
        Request::Send(req) => delegation::send(conn, id, req),
        Request::ListRuns => delegation::list(conn, id).await,
        Request::Status => operator::status(conn, id).await,
        Request::Runs => operator::runs(conn, id).await,
        Request::Metrics => operator::metrics(conn, id).await,
        Request::Reload => {
            // In its own task, like every method that waits: the read may block.
            tracker.spawn(operator::reload(conn.clone(), id));
        }
        Request::ReloadTokens => {
            tracker.spawn(operator::reload_tokens(conn.clone(), id));
        }
        Request::Invalid(reason) => {
            let e = typed_error(&RegistryError::InvalidRequest { reason });
            conn.reply_err(&id, &e).await;
        }
        Request::UnknownAcpd => {
            conn.reply_err(&id, &RpcError::method_not_found(&method))
                .await
        }
        Request::Forward {
            kind,
            session,
            params,
        } => forward::request(conn, id, method, kind, session, params).await,
    }
}

/// A parent's notification, as acpd reads it.
pub(super) enum Notification<'a> {
    /// `_acpd/*`: acpd's own to send, never a parent's; ignored.
    Acpd,
    /// `$/cancel_request`: for whichever bridge session's agent got the request.
    CancelRequest(Option<&'a RawValue>),
    /// `session/cancel`.
    Cancel {
        session: Option<String>,
        params: Option<&'a RawValue>,
    },
    /// Anything else: to the agent of the session it names.
    Other {
        session: Option<String>,
        params: Option<&'a RawValue>,
    },
}

impl<'a> Notification<'a> {
    /// The one reading of a notification's method.
    fn parse(method: &str, params: Option<&'a RawValue>) -> Notification<'a> {
        match method {
            m if m.starts_with(name::PREFIX) => Notification::Acpd,
            "$/cancel_request" => Notification::CancelRequest(params),
            "session/cancel" => Notification::Cancel {
                session: params.and_then(session_id),
                params,
            },
            _ => Notification::Other {
                session: params.and_then(session_id),
                params,
            },
        }
    }
}

/// Acts on one notification of the parent; never waits.
pub(super) fn notification(conn: &Arc<Conn>, method: &str, params: Option<&RawValue>) {
    let notification = Notification::parse(method, params);
    if !matches!(notification, Notification::Acpd)
        && let Some(key) = params.and_then(|p| duplicate_routing_key(p.get()))
    {
        tracing::warn!(owner = conn.owner, %method,
            "dropping a notification whose params carry \"{key}\" twice");
        return;
    }
    match notification {
        Notification::Acpd => {}
        Notification::CancelRequest(params) => forward::cancel_request(conn, method, params),
        // A notification naming no session has nowhere to go: ignored, as JSON-RPC asks.
        Notification::Cancel {
            session: Some(sid),
            params,
        } => forward::cancel(conn, method, &sid, params),
        Notification::Other {
            session: Some(sid),
            params,
        } => forward::notify(conn, method, &sid, params),
        Notification::Cancel { session: None, .. } | Notification::Other { session: None, .. } => {}
    }
}

/// A line from the parent that is not a message: answered with what was wrong with it.
pub(super) async fn fault(conn: &Conn, fault: LineFault) {
    tracing::warn!(owner = conn.owner, "parent sent a bad line: {fault}");
    let (id, error) = fault.to_rpc_error();
    let _ = conn.peer.respond_err(id.as_ref(), &error).await;
}
