//! The Rust ACP SDK's own HTTP/WebSocket client (`agent-client-protocol-http`'s `HttpClient`)
//! driving a remote acpd, for tests/agents/remote_clients.rs: the same two phases, and the same
//! one-line JSON summary, as tests/interop/remote-client.mjs prints for the TypeScript SDK.
//!
//! `acpd-sdk-http-client URL CA_PEM first` | `… URL CA_PEM load SESSION`
//!
//! The URL's scheme picks the transport (`https://` POST + SSE, `wss://` WebSocket), as the
//! crate does; the server certificate must chain to CA_PEM (and only to it); the bearer token is
//! read from `$ACPD_TOKEN` (an argument would be readable by every local user in /proc).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test peer: a panic is its failure report

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_client_protocol::Agent;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, LoadSessionRequest, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, TextContent,
};
use agent_client_protocol_http::HttpClient;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// What the agent sent since the last `take`: `[kind, text]` per message chunk, the
/// `[optionId, kind]` pairs of each permission request.
#[derive(Default)]
struct Seen {
    updates: Vec<Value>,
    permissions: Vec<Value>,
}

impl Seen {
    fn take(seen: &Mutex<Seen>) -> Value {
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        json!({"updates": seen.updates, "permissions": seen.permissions})
    }
}

fn text(s: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::Text(TextContent::new(s))]
}

/// `base` with the fields of `more` (an object) added.
fn merged(mut base: Value, more: Value) -> Value {
    if let (Some(b), Value::Object(m)) = (base.as_object_mut(), more) {
        b.extend(m);
    }
    base
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, ca, phase) = match &args[..] {
        [url, ca, phase, ..] => (url.clone(), PathBuf::from(ca), phase.clone()),
        _ => return Err("usage: acpd-sdk-http-client URL CA_PEM first|load SESSION".into()),
    };
    let load_id = args.get(3).cloned();
    let root = reqwest::Certificate::from_pem(&std::fs::read(&ca)?)?;
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(token) = std::env::var("ACPD_TOKEN") {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    let transport = HttpClient::builder_with_endpoint(&url)
        .configure_http(|http| {
            http.no_proxy()
                .tls_certs_only([root])
                .default_headers(headers)
        })
        .build()?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let (chunk_tx, mut chunk_rx) = mpsc::unbounded_channel::<()>();
    let on_update = seen.clone();
    let on_permission = seen.clone();
    let cwd = std::env::current_dir()?;

    let summary = agent_client_protocol::Client
        .v1()
        .name("rust-remote")
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                let update = serde_json::to_value(&n.update)?;
                let kind = update["sessionUpdate"].as_str().unwrap_or_default();
                if kind == "agent_message_chunk" || kind == "user_message_chunk" {
                    on_update
                        .lock()
                        .unwrap()
                        .updates
                        .push(json!([kind, update["content"]["text"]]));
                    if kind == "agent_message_chunk" {
                        let _ = chunk_tx.send(());
                    }
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let options: Vec<Value> = request
                    .options
                    .iter()
                    .map(|o| json!([o.option_id, o.kind]))
                    .collect();
                on_permission
                    .lock()
                    .unwrap()
                    .permissions
                    .push(json!(options));
                let allow = request
                    .options
                    .iter()
                    .find(|o| o.kind == PermissionOptionKind::AllowOnce)
                    .map(|o| o.option_id.clone())
                    .expect("an allow_once option");
                responder.respond(RequestPermissionResponse::new(
                    RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(allow)),
                ))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx: ConnectionTo<Agent>| {
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let init = serde_json::to_value(&init)?;
            let mut out = json!({
                "protocolVersion": init["protocolVersion"],
                "acpd": init["agentCapabilities"]["_meta"]["acpd"]["version"],
                "loadSession": init["agentCapabilities"]["loadSession"].as_bool().unwrap_or(false),
            });
            match (phase.as_str(), &load_id) {
                ("first", _) => {
                    let session = cx
                        .send_request(NewSessionRequest::new(cwd.clone()))
                        .block_task()
                        .await?;
                    let sid = session.session_id;
                    out["sessionId"] = json!(sid);
                    let turn = cx
                        .send_request(PromptRequest::new(sid.clone(), text("hello\n:permission")))
                        .block_task()
                        .await?;
                    out["prompt"] =
                        merged(json!({"stopReason": turn.stop_reason}), Seen::take(&seen));
                    while chunk_rx.try_recv().is_ok() {}
                    // Cancel only once the turn is known to run: its first chunk has arrived.
                    let waiting =
                        cx.send_request(PromptRequest::new(sid.clone(), text("waiting\n:hang")));
                    chunk_rx.recv().await;
                    cx.send_notification(CancelNotification::new(sid))?;
                    let turn = waiting.block_task().await?;
                    out["cancel"] =
                        merged(json!({"stopReason": turn.stop_reason}), Seen::take(&seen));
                }
                ("load", Some(sid)) => {
                    cx.send_request(LoadSessionRequest::new(sid.clone(), cwd.clone()))
                        .block_task()
                        .await?;
                    out["load"] = merged(json!({"answered": true}), Seen::take(&seen));
                    let turn = cx
                        .send_request(PromptRequest::new(sid.clone(), text("again")))
                        .block_task()
                        .await?;
                    out["again"] =
                        merged(json!({"stopReason": turn.stop_reason}), Seen::take(&seen));
                }
                _ => {
                    return Err(agent_client_protocol::Error::invalid_params()
                        .data("phase: first, or load SESSION"));
                }
            }
            Ok(out)
        })
        .await?;
    println!("{summary}");
    Ok(())
}
