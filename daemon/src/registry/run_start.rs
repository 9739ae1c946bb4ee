//! A delegated run's start: the request's own checks (capabilities, a persona the agent
//! takes, the `outputSchema`), its child through the start gate ([`super::gate`]), then
//! publication — filed in the run table and its first turn begun, or torn down if the start
//! was cancelled meanwhile.

use opentelemetry::KeyValue;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::acp::ClientCapabilities;
use acpd_protocol::subagent::{StartRequest, Started};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::gate::{Admission, check_capabilities, resolve_cwd, wants_worktree};
use super::output_schema::OutputSchema;
use super::run_lifecycle::RunInit;
use super::{Launched, Nest, Owner, Parent, Registry, RegistryError, Run, RunEvent, lock};
use crate::child::{Child, SessionParams};
use crate::workspace::Base;

/// Everything a start needs besides the request itself.
#[derive(Default)]
pub struct StartOptions {
    pub request: StartRequest,
    /// The caller's working directory (`acpd run`, `acpd stdio`); `None` over a socket.
    pub caller_cwd: Option<PathBuf>,
    /// Overrides the provider's `run_timeout`.
    pub run_timeout: Option<Duration>,
    pub client_capabilities: ClientCapabilities,
    pub owner: Owner,
    /// Receives the `started`/`ended` pair of every turn without loss, and the traffic the
    /// flags below ask for, in order.
    pub events: Option<mpsc::Sender<RunEvent>>,
    /// Send the child's raw `session/update`s on `events`.
    pub forward_updates: bool,
    /// Send permission requests on `events` (policy `forward`); else nobody can answer them.
    pub forward_permissions: bool,
    /// Receives output text as it streams.
    pub sink: Option<mpsc::Sender<String>>,
    /// Abandons the start before publication.
    pub cancel: CancellationToken,
    /// A run id minted by the caller, so it can file the run before its first event.
    pub run_id: Option<String>,
    /// The run or bridge session whose child asked for this run (see [`super::lineage`]): the
    /// run is one level deeper than that child, and goes with it.
    pub nest: Option<Nest>,
    /// Who is asking (see [`Run::principal`]); a nested run takes its parent run's.
    pub principal: Option<crate::store::Principal>,
}

/// A run that passed the publication boundary.
#[derive(Debug, Clone)]
pub struct Published {
    pub run_id: String,
    pub session_id: String,
}

impl Registry {
    /// Validates, spawns, handshakes and publishes a run; its first turn starts at once.
    pub async fn start(&self, opts: StartOptions) -> Result<Published, RegistryError> {
        let config = self.config();
        let req = &opts.request;
        let provider = self.provider(&config, req.provider.as_deref())?;
        check_capabilities(&provider, req)?;
        let tool_filter =
            self.nested_filter(&provider, opts.nest.as_ref(), req.tool_filter.as_ref())?;
        let worktree = wants_worktree(&provider, req.workspace, req.base_ref.as_deref(), true)?;
        let budget = super::budget::resolve(&provider, req.budget.as_ref())?;
        // The run above this one, whose budget this run spends from too.
        let above = match opts.nest.as_ref().map(|n| &n.parent) {
            Some(Parent::Run(parent)) => lock(&self.inner.table)
                .runs
                .get(parent)
                .map(|p| p.spend.clone()),
            _ => None,
        };
        if above.as_ref().is_some_and(|s| s.is_spent()) {
            return Err(RegistryError::InvalidRequest {
                reason: "the run this one would be nested under has spent its budget".into(),
            });
        }
        // Refused before anything runs, the persona's probe included (the gate checks again,
        // on the resolved cwd it starts the child in).
        if let Some(limit) = opts.nest.as_ref().and_then(|n| n.confinement.as_ref()) {
            let cwd = resolve_cwd(&provider, req.cwd.as_deref(), opts.caller_cwd.as_deref())?;
            super::sandbox_plan::confine(&provider, &cwd, limit)?;
        }
        if req.persona.is_some() {
            let cwd = resolve_cwd(&provider, req.cwd.as_deref(), opts.caller_cwd.as_deref())?;
            if !self
                .probe_persona(&config, &provider, &cwd, &opts.cancel)
                .await
            {
                return Err(RegistryError::UnsupportedCapability {
                    provider: provider.name.clone(),
                    capability: "persona",
                });
            }
        }
        let schema = match &req.output_schema {
            Some(s) => Some(Arc::new(OutputSchema::compile(s)?)),
            None => None,
        };
        let run_id = opts
            .run_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        // When spans are exported: the run's (continuing the caller's trace context, if it
        // sent one) and its start's, which the child's `session/new` names.
        let run_span = crate::otel::exporting().map(|o| {
            let attributes = vec![
                KeyValue::new("acpd.run.id", run_id.clone()),
                KeyValue::new("acpd.provider", provider.name.clone()),
            ];
            o.span("acpd.run", req.meta.as_ref(), attributes)
        });
        let start_span = run_span.as_ref().and_then(|r| {
            r.child(
                "acpd.start",
                vec![KeyValue::new("acpd.provider", provider.name.clone())],
            )
        });
        let mut session_meta = tool_filter
            .as_ref()
            .and_then(|f| super::gate::tool_filter_meta(&provider, f));
        if let Some(s) = &start_span
            && let Some(meta) = session_meta
                .get_or_insert_with(|| serde_json::json!({}))
                .as_object_mut()
        {
            s.inject(meta);
        }
        let admission = Admission {
            max_depth: req.max_depth,
            nested_in: opts.nest.as_ref().map(|n| (n.depth, n.max_depth)),
            confined: opts.nest.as_ref().and_then(|n| n.confinement.clone()),
            cwd: req.cwd.as_deref(),
            fallback_cwd: opts.caller_cwd.as_deref(),
            session: Some(SessionParams {
                mcp_servers: None,
                system_prompt: req.persona.clone(),
                meta: session_meta,
            }),
            worktree: worktree.then_some(Base::Commit(req.base_ref.as_deref())),
            ..Admission::new(run_id.clone(), &opts.cancel)
        };
        let launched = self
            .gate(&config, provider, admission, |spec| {
                Child::start(spec, opts.client_capabilities.clone(), &opts.cancel)
            })
            .await;
        if let Err(e) = &launched {
            for span in [&start_span, &run_span].into_iter().flatten() {
                span.fail(e.to_string());
            }
            if let Some(run) = run_span.clone() {
                run.end();
            }
        }
        if let Some(start) = start_span {
            start.end();
        }
        let Launched {
            child,
            slot,
            provider,
            depth,
            max_depth,
            workspace,
        } = launched?;
        if let Some(span) = run_span {
            // Ended with the child's teardown.
            child.hold_span(span);
        }

        let session_id = format!("sub-{}", uuid::Uuid::new_v4());
        let run = Run::new(RunInit {
            run_id: run_id.clone(),
            owner: opts.owner,
            provider,
            label: req.label.clone(),
            session_id: session_id.clone(),
            depth,
            max_depth,
            run_timeout: opts.run_timeout,
            max_output: config.max_output,
            events: opts.events,
            forward_updates: opts.forward_updates,
            forward_permissions: opts.forward_permissions,
            sink: opts.sink,
            schema,
            tool_filter: tool_filter.map(Arc::new),
            confinement: child.confinement(),
            principal: match opts.nest.as_ref().map(|n| &n.parent) {
                Some(Parent::Run(parent)) => lock(&self.inner.table)
                    .runs
                    .get(parent)
                    .map_or(opts.principal, |p| p.principal.clone()),
                _ => opts.principal,
            },
            parent: opts.nest.map(|n| n.parent),
            workspace,
            spend: super::budget::Spend::new(budget, above),
        });
        {
            // Checked under the table lock: an owner that is going away cancels first and
            // then collects its runs under this lock, so a run is either seen or never filed.
            let mut table = lock(&self.inner.table);
            if opts.cancel.is_cancelled() {
                drop(table);
                child.teardown().await;
                run.drop_workspace(false, true).await;
                return Err(RegistryError::StartCancelled {
                    provider: run.provider.name.clone(),
                });
            }
            table.runs.insert(run_id.clone(), run.clone());
        }
        if let Some(events) = &run.events {
            let started = Started {
                run_id: run_id.clone(),
                provider: run.provider.name.clone(),
                turn: 1,
                session_id: session_id.clone(),
                label: run.label.clone(),
            };
            let _ = events.send(RunEvent::Started(started)).await;
        }
        run.begin_turn(child, slot, opts.request.prompt);
        Ok(Published { run_id, session_id })
    }
}
