//! The MCP server: the tools of [`super::tools`] over a [`Backend`], with progress
//! notifications while a run works and MCP cancellation mapped to cancelling the run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acpd_protocol::acp::ContentBlock as AcpBlock;
use acpd_protocol::methods::StartReply;
use acpd_protocol::subagent::{StartRequest, SubagentResult};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;

use super::backend::Backend;
use super::mcp_error::Failure;
use super::tools::{self, DisposeArgs, NoArgs, RunArgs, SendArgs, StartArgs};

/// How often a waiting call reports progress when nothing else happened.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Streamed output is reported at most this often.
const PROGRESS_MIN_GAP: Duration = Duration::from_millis(100);

pub(super) struct AcpdMcp {
    backend: Arc<Backend>,
    /// acpd mcp's working directory: relative `cwd`s are taken from it.
    cwd: Option<PathBuf>,
}

impl AcpdMcp {
    pub(super) fn new(backend: Arc<Backend>) -> AcpdMcp {
        AcpdMcp {
            backend,
            cwd: std::env::current_dir().ok(),
        }
    }

    async fn provider_names(&self) -> Vec<String> {
        self.backend
            .providers()
            .await
            .map(|ps| ps.into_iter().map(|p| p.name).collect())
            .unwrap_or_default()
    }

    async fn call(
        &self,
        tool: &str,
        args: Option<JsonObject>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, Failure> {
        let backend = &self.backend;
        match tool {
            tools::DELEGATE => {
                let args: StartArgs = tools::parse(tool, args)?;
                let request = args.into_request(self.cwd.as_deref())?;
                let run_id = self.start(request, ctx).await?.run_id;
                let result = self.follow(&run_id, ctx).await;
                // One task, one run: nothing is kept for a follow-up.
                if let Err(e) = backend.dispose(&run_id).await {
                    tracing::warn!(run = %run_id, "dispose after delegate failed: {e}");
                }
                Ok(tools::turn_result(&result?))
            }
            tools::START => {
                let args: StartArgs = tools::parse(tool, args)?;
                let request = args.into_request(self.cwd.as_deref())?;
                let started = self.start(request, ctx).await?;
                Ok(tools::ok_json(
                    json!({ "runId": started.run_id, "sessionId": started.session_id }),
                ))
            }
            tools::WAIT => {
                let args: RunArgs = tools::parse(tool, args)?;
                let result = self.follow(&args.run_id, ctx).await?;
                Ok(tools::turn_result(&result))
            }
            tools::SEND => {
                let args: SendArgs = tools::parse(tool, args)?;
                if args.prompt.trim().is_empty() {
                    return Err(Failure::InvalidArguments(
                        "`prompt` is empty: say what the subagent should do next".into(),
                    ));
                }
                let sent = backend
                    .send(&args.run_id, vec![AcpBlock::from(args.prompt)])
                    .await?;
                Ok(tools::ok_json(
                    json!({ "runId": sent.run_id, "turn": sent.turn }),
                ))
            }
            tools::CANCEL => {
                let args: RunArgs = tools::parse(tool, args)?;
                backend.cancel(&args.run_id).await?;
                Ok(tools::ok_json(
                    json!({ "runId": args.run_id, "cancelled": true }),
                ))
            }
            tools::DISPOSE => {
                let args: DisposeArgs = tools::parse(tool, args)?;
                let kept = backend
                    .dispose_with(
                        &args.run_id,
                        args.keep_branch.unwrap_or(true),
                        args.force.unwrap_or(false),
                    )
                    .await?;
                let mut answer = json!({ "runId": args.run_id, "disposed": true });
                if let Some(kept) = kept {
                    answer["kept"] = json!(kept);
                }
                Ok(tools::ok_json(answer))
            }
            tools::LIST => {
                let NoArgs {} = tools::parse(tool, args)?;
                let runs = backend.list().await?;
                Ok(tools::ok_json(json!({ "runs": runs })))
            }
            tools::PROVIDERS => {
                let NoArgs {} = tools::parse(tool, args)?;
                let providers = backend.providers().await?;
                Ok(tools::ok_json(json!({ "providers": providers })))
            }
            _ => Err(Failure::Internal {
                detail: format!("no tool named {tool}"),
            }),
        }
    }

    /// Starts a run, and disposes it again when the call was cancelled meanwhile.
    async fn start(
        &self,
        mut request: StartRequest,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<StartReply, Failure> {
        // The tool call's W3C trace context (MCP's `_meta` has the same keys) is the run's.
        for key in ["traceparent", "tracestate"] {
            if let Some(v) = ctx.meta.get(key) {
                let meta = request.meta.get_or_insert_with(Default::default);
                meta.insert(key.to_string(), v.clone());
            }
        }
        let started = self.backend.start(request, &ctx.ct).await?;
        if ctx.ct.is_cancelled() {
            let _ = self.backend.dispose(&started.run_id).await;
            return Err(Failure::Internal {
                detail: "the call was cancelled".into(),
            });
        }
        Ok(started)
    }

    /// Waits for the run's current turn, reporting progress when the client asked for it
    /// (a progress token) and cancelling the turn when the client cancels the call.
    async fn follow(
        &self,
        run_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<SubagentResult, Failure> {
        let wait = self.backend.wait(run_id);
        tokio::pin!(wait);
        let token = ctx.meta.get_progress_token();
        let mut activity = self.backend.activity(run_id);
        let began = Instant::now();
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        let mut sent: u64 = 0;
        let mut last: Option<Instant> = None;
        let short = run_id.get(..8).unwrap_or(run_id).to_string();
        let report = |sent: &mut u64, last: &mut Option<Instant>, output: Option<String>| {
            let token = token.clone();
            *sent += 1;
            *last = Some(Instant::now());
            let progress = *sent as f64;
            let mut message = format!(
                "subagent {short} running for {}s",
                began.elapsed().as_secs()
            );
            if let Some(output) = output {
                message.push_str(&format!("; {output}"));
            }
            let peer = ctx.peer.clone();
            async move {
                if let Some(token) = token {
                    let param =
                        ProgressNotificationParam::new(token, progress).with_message(message);
                    let _ = peer.notify_progress(param).await;
                }
            }
        };
        let describe = |a: &super::backend::Activity| {
            let mut text = format!("{} chunks, {} bytes of output", a.chunks, a.bytes);
            if !a.tail.is_empty() {
                text.push_str(&format!(", last: {}", a.tail));
            }
            text
        };
        if token.is_some() {
            report(&mut sent, &mut last, None).await;
        }
        loop {
            let changed = async {
                match activity.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = &mut wait => return result,
                () = ctx.ct.cancelled() => break,
                _ = tick.tick(), if token.is_some() => {
                    let output = activity.as_ref().map(|rx| describe(&rx.borrow()));
                    report(&mut sent, &mut last, output).await;
                }
                alive = changed, if token.is_some() => {
                    if !alive {
                        activity = None;
                        continue;
                    }
                    if last.is_some_and(|t| t.elapsed() < PROGRESS_MIN_GAP) {
                        continue;
                    }
                    let output = activity.as_ref().map(|rx| describe(&rx.borrow()));
                    report(&mut sent, &mut last, output).await;
                    tick.reset();
                }
            }
        }
        // The client cancelled the call (notifications/cancelled, or it went away): the turn
        // is cancelled and its result, aborted, awaited (nobody reads it).
        tracing::info!(run = %run_id, "MCP call cancelled: cancelling the run's turn");
        if let Err(e) = self.backend.cancel(run_id).await {
            tracing::warn!(run = %run_id, "cancel failed: {e}");
        }
        wait.await
    }
}

impl ServerHandler for AcpdMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("acpd", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "acpd runs subagents: separate coding agents (the providers) that each take \
                 one self-contained task and report back. `delegate` runs one to the end; \
                 subagent_start / subagent_wait / subagent_send / subagent_dispose run several \
                 in parallel or continue one. Runs live in {}.",
                self.backend.describe()
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let providers = match self.backend.providers().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("cannot list the providers for the tool descriptions: {e}");
                Vec::new()
            }
        };
        Ok(ListToolsResult::with_all_items(tools::list(&providers)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        if !tools::ALL.contains(&name) {
            return Err(McpError::invalid_params(
                format!(
                    "acpd mcp has no tool named {name:?}; its tools are {}",
                    tools::ALL.join(", ")
                ),
                None,
            ));
        }
        let result = match self.call(name, request.arguments, &ctx).await {
            Ok(result) => result,
            Err(failure) => {
                tracing::debug!(tool = name, "tool failed: {failure}");
                tools::failed(&failure, &self.provider_names().await)
            }
        };
        Ok(result.into())
    }
}
