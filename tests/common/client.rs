//! An ACP client built on the ACP Rust SDK (an implementation acpd does not share code with)
//! driving a real `acpd stdio` over pipes. Notifications and agent→client requests are handed
//! to the test untyped, so nothing is lost to the SDK's typed parsing.

use std::process::Stdio;
use std::time::Duration;

use agent_client_protocol as acp;
use agent_client_protocol::{Agent, Client, UntypedMessage};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

use super::{BIN, Env};

pub type Reply = Result<Value, acp::Error>;

enum Op {
    Request(String, Value, oneshot::Sender<Reply>),
    Notify(String, Value),
}

/// A request from acpd to the client, for the test to answer.
pub struct Incoming {
    pub method: String,
    pub params: Value,
    responder: acp::v1::Responder<Value>,
}

impl Incoming {
    pub fn reply(self, result: Value) {
        let _ = self.responder.respond(result);
    }
    pub fn fail(self, error: acp::Error) {
        let _ = self.responder.respond_with_error(error);
    }
}

pub struct AcpClient {
    ops: Option<mpsc::UnboundedSender<Op>>,
    pub notes: mpsc::UnboundedReceiver<(String, Value)>,
    pub requests: mpsc::UnboundedReceiver<Incoming>,
    pub process: tokio::process::Child,
    task: Option<tokio::task::JoinHandle<()>>,
}

pub const TIMEOUT: Duration = Duration::from_secs(20);

impl AcpClient {
    /// Starts `acpd stdio` with `env`'s config and connects the SDK client to it.
    pub fn spawn(env: &Env) -> AcpClient {
        Self::spawn_with(env, &["stdio"])
    }

    /// Starts `acpd <args>` (`stdio`, or `connect --socket …`) and connects the SDK client.
    pub fn spawn_with(env: &Env, args: &[&str]) -> AcpClient {
        let mut process = tokio::process::Command::new(BIN)
            .arg("--config")
            .arg(&env.config)
            .args(args)
            .current_dir(env.path())
            .env_remove("ACPD_CONFIG")
            .env_remove("ACPD_DEPTH")
            .env_remove("ACPD_MAX_DEPTH")
            .env("ACPD_LOG", "warn")
            .env("STATE_DIRECTORY", env.path().join("state"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn acpd stdio");
        let stdin = process.stdin.take().unwrap();
        let stdout = process.stdout.take().unwrap();
        let (ops_tx, mut ops_rx) = mpsc::unbounded_channel::<Op>();
        let (notes_tx, notes) = mpsc::unbounded_channel();
        let (req_tx, requests) = mpsc::unbounded_channel();
        let transport = acp::ByteStreams::new(stdin.compat_write(), stdout.compat());
        let task = tokio::spawn(async move {
            let _ = Client
                .v1()
                .on_receive_notification(
                    async move |n: UntypedMessage, _cx| {
                        let _ = notes_tx.send((n.method, n.params));
                        Ok(())
                    },
                    acp::on_receive_notification!(),
                )
                .on_receive_request(
                    async move |r: UntypedMessage, responder: acp::v1::Responder<Value>, _cx| {
                        let _ = req_tx.send(Incoming {
                            method: r.method,
                            params: r.params,
                            responder,
                        });
                        Ok(())
                    },
                    acp::on_receive_request!(),
                )
                .connect_with(transport, async move |cx: acp::v1::ConnectionTo<Agent>| {
                    while let Some(op) = ops_rx.recv().await {
                        match op {
                            Op::Request(method, params, reply) => {
                                let sent = cx.send_request(UntypedMessage::new(&method, params)?);
                                cx.spawn(async move {
                                    let _ = reply.send(sent.block_task().await);
                                    Ok(())
                                })?;
                            }
                            Op::Notify(method, params) => {
                                cx.send_notification(UntypedMessage::new(&method, params)?)?;
                            }
                        }
                    }
                    Ok(())
                })
                .await;
        });
        AcpClient {
            ops: Some(ops_tx),
            notes,
            requests,
            process,
            task: Some(task),
        }
    }

    /// Sends a request and returns the pending reply (await it when needed).
    pub fn send(&self, method: &str, params: Value) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        let op = Op::Request(method.into(), params, tx);
        self.ops
            .as_ref()
            .expect("connected")
            .send(op)
            .expect("client task alive");
        rx
    }

    pub async fn request(&self, method: &str, params: Value) -> Reply {
        let rx = self.send(method, params);
        tokio::time::timeout(TIMEOUT, rx)
            .await
            .unwrap_or_else(|_| panic!("no answer to {method}"))
            .expect("client task alive")
    }

    pub fn notify(&self, method: &str, params: Value) {
        let op = Op::Notify(method.into(), params);
        self.ops
            .as_ref()
            .expect("connected")
            .send(op)
            .expect("client task alive");
    }

    pub async fn initialize(&self, capabilities: Value) -> Value {
        let params =
            serde_json::json!({ "protocolVersion": 1, "clientCapabilities": capabilities });
        self.request("initialize", params)
            .await
            .expect("initialize")
    }

    pub async fn new_session(&self, cwd: &std::path::Path, meta: Option<Value>) -> String {
        let mut params = serde_json::json!({ "cwd": cwd, "mcpServers": [] });
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        let r = self
            .request("session/new", params)
            .await
            .expect("session/new");
        r["sessionId"].as_str().unwrap().to_string()
    }

    pub async fn prompt(&self, session: &str, text: &str) -> Reply {
        let params = serde_json::json!({
            "sessionId": session,
            "prompt": [{ "type": "text", "text": text }],
        });
        self.request("session/prompt", params).await
    }

    /// The next notification, or a panic after the timeout.
    pub async fn next_note(&mut self) -> (String, Value) {
        tokio::time::timeout(TIMEOUT, self.notes.recv())
            .await
            .expect("a notification in time")
            .expect("connection open")
    }

    /// The next request from acpd, or a panic after the timeout.
    pub async fn next_request(&mut self) -> Incoming {
        tokio::time::timeout(TIMEOUT, self.requests.recv())
            .await
            .expect("a request in time")
            .expect("connection open")
    }

    /// All `agent_message_chunk` text of a session received so far.
    pub fn drain_text(&mut self, session: &str) -> String {
        let mut text = String::new();
        while let Ok((method, params)) = self.notes.try_recv() {
            if method == "session/update"
                && params["sessionId"] == session
                && params["update"]["sessionUpdate"] == "agent_message_chunk"
            {
                text.push_str(params["update"]["content"]["text"].as_str().unwrap_or(""));
            }
        }
        text
    }

    /// Closes acpd's stdin (EOF) and waits for it to exit.
    pub async fn close(mut self) -> std::process::ExitStatus {
        self.ops.take();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(TIMEOUT, task).await;
        }
        tokio::time::timeout(TIMEOUT, self.process.wait())
            .await
            .expect("acpd exits after EOF")
            .expect("wait")
    }
}
