//! A published run: it owns its child until dispose, runs one turn at a time, turns every
//! outcome into a [`SubagentResult`], emits the `started`/`ended` pair of each turn without
//! loss, and keeps a settled child alive for `keep_alive` so a follow-up can reuse it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acpd_protocol::acp::ContentBlock;
use acpd_protocol::diagnostic::{self, Facts};
use acpd_protocol::outcome::map_outcome;
use acpd_protocol::subagent::{
    Category, Ended, Failure, Stage, Started, StopReason, SubagentResult,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::output_schema::OutputSchema;
use super::{Owner, RegistryError, Slot};
use super::{RunEvent, lock};
use crate::child::{Child, ChildEvent, TurnControl, TurnReport};
use crate::config::ProviderConfig;
use acpd_protocol::tool_filter::ToolFilter;

/// Where a run is in its life.
#[derive(Clone, Debug)]
pub enum RunState {
    Running {
        turn: u32,
    },
    Settled {
        turn: u32,
        result: Arc<SubagentResult>,
    },
    /// Disposed: the child is gone and the output freed.
    Disposed,
}

impl RunState {
    pub fn name(&self) -> &'static str {
        match self {
            RunState::Running { .. } => "running",
            RunState::Settled { .. } => "settled",
            RunState::Disposed => "disposed",
        }
    }
}

pub(super) struct RunInit {
    pub run_id: String,
    pub owner: Owner,
    pub provider: Arc<ProviderConfig>,
    pub label: Option<String>,
    pub session_id: String,
    pub depth: u32,
    pub max_depth: u32,
    pub run_timeout: Option<Duration>,
    pub max_output: usize,
    pub events: Option<mpsc::Sender<RunEvent>>,
    pub forward_updates: bool,
    pub forward_permissions: bool,
    pub sink: Option<mpsc::Sender<String>>,
    pub schema: Option<Arc<OutputSchema>>,
    pub tool_filter: Option<Arc<ToolFilter>>,
    /// What the run's child may write (its sandbox), which binds the runs it starts.
    pub confinement: Option<Arc<crate::supervise::Confinement>>,
    pub parent: Option<super::Parent>,
    pub principal: Option<crate::store::Principal>,
    pub workspace: Option<crate::workspace::Worktree>,
    pub spend: Arc<super::budget::Spend>,
}

pub struct Run {
    pub run_id: String,
    pub owner: Owner,
    /// Who started it (the connection's SO_PEERCRED user or network token; a nested run, its
    /// parent run's); `None` in-process. `_acpd/runs` shows a run only to this principal and
    /// acpd's own user.
    pub principal: Option<crate::store::Principal>,
    pub provider: Arc<ProviderConfig>,
    pub label: Option<String>,
    /// The parent-facing session id acpd minted (never the child's own).
    pub session_id: String,
    pub depth: u32,
    /// The depth limit for this run and everything it starts.
    pub max_depth: u32,
    /// The run or bridge session whose child started this run (nested delegation).
    pub parent: Option<super::Parent>,
    pub started_at: std::time::Instant,
    run_timeout: Option<Duration>,
    max_output: usize,
    pub(super) events: Option<mpsc::Sender<RunEvent>>,
    forward_updates: bool,
    forward_permissions: bool,
    sink: Option<mpsc::Sender<String>>,
    /// Every turn's output must validate against it; its instruction rides on every prompt.
    schema: Option<Arc<OutputSchema>>,
    /// Every turn holds the child to it (the agent was given it at `session/new`).
    tool_filter: Option<Arc<ToolFilter>>,
    /// See [`RunInit::confinement`].
    pub(super) confinement: Option<Arc<crate::supervise::Confinement>>,
    state: watch::Sender<RunState>,
    slot: Mutex<Holding>,
    /// The run's worktree until dispose removes it.
    workspace: Mutex<Option<Arc<crate::workspace::Worktree>>>,
    /// Whether dispose keeps the worktree's branch (`keepBranch`, true unless asked not to).
    keep_branch: std::sync::atomic::AtomicBool,
    /// Whether dispose removes a worktree whose work cannot be committed (`force`).
    force: std::sync::atomic::AtomicBool,
    /// The worktree dispose kept because its work could not be committed.
    kept: Mutex<Option<acpd_protocol::subagent::WorkspaceFailure>>,
    /// What the run (with its nested runs) has spent, against its budget.
    pub spend: Arc<super::budget::Spend>,
}

/// What the run holds between and during turns.
#[derive(Default)]
struct Holding {
    /// The idle child, between turns.
    child: Option<Child>,
    /// Always set while a child is alive, even during a turn, so dispose can end it.
    handle: Option<Child>,
    pid: Option<i32>,
    capacity: Option<Slot>,
    turn: u32,
    turn_cancel: CancellationToken,
    keep_alive: Option<tokio::task::JoinHandle<()>>,
    disposed: bool,
    /// Why the child is gone, when it is.
    gone: Option<&'static str>,
}

/// Why a settled run's child is gone.
const KEEP_ALIVE_ENDED: &str = "keep_alive expired or the child exited";
const BUDGET_SPENT: &str = "its budget is spent";

impl Run {
    /// The tool filter every turn of this run holds its child to (and every run nested
    /// under it inherits, see [`super::lineage`]).
    pub(super) fn tool_filter(&self) -> Option<Arc<ToolFilter>> {
        self.tool_filter.clone()
    }

    pub(super) fn new(init: RunInit) -> Arc<Run> {
        let (state, _) = watch::channel(RunState::Running { turn: 1 });
        Arc::new(Run {
            run_id: init.run_id,
            owner: init.owner,
            principal: init.principal,
            provider: init.provider,
            label: init.label,
            session_id: init.session_id,
            depth: init.depth,
            max_depth: init.max_depth,
            parent: init.parent,
            started_at: std::time::Instant::now(),
            run_timeout: init.run_timeout,
            max_output: init.max_output,
            events: init.events,
            forward_updates: init.forward_updates,
            forward_permissions: init.forward_permissions,
            sink: init.sink,
            schema: init.schema,
            tool_filter: init.tool_filter,
            confinement: init.confinement,
            state,
            slot: Mutex::new(Holding::default()),
            workspace: Mutex::new(init.workspace.map(Arc::new)),
            keep_branch: std::sync::atomic::AtomicBool::new(true),
            force: std::sync::atomic::AtomicBool::new(false),
            kept: Mutex::new(None),
            spend: init.spend,
        })
    }

    pub fn state(&self) -> RunState {
        self.state.borrow().clone()
    }

    /// The child's pid while it is alive.
    pub fn pid(&self) -> Option<i32> {
        lock(&self.slot).pid
    }

    /// Starts turn 1 on a freshly published child.
    pub(super) fn begin_turn(
        self: &Arc<Self>,
        child: Child,
        capacity: Slot,
        prompt: Vec<ContentBlock>,
    ) {
        let cancel = {
            let mut h = lock(&self.slot);
            h.handle = Some(child.clone());
            h.pid = Some(child.pid());
            h.capacity = Some(capacity);
            h.turn = 1;
            // The run is already in the table: a cancel or dispose that came before this
            // point cancelled this very token and must not be lost.
            if h.disposed {
                h.turn_cancel.cancel();
            }
            h.turn_cancel.clone()
        };
        let prompt = self.with_instruction(prompt);
        tokio::spawn(self.clone().turn_task(child, 1, prompt, cancel));
    }

    /// A follow-up turn on a settled, still-live child.
    pub(super) async fn send(
        self: &Arc<Self>,
        prompt: Vec<ContentBlock>,
    ) -> Result<u32, RegistryError> {
        let (child, turn, cancel) = {
            let mut h = lock(&self.slot);
            if let RunState::Running { turn } = *self.state.borrow() {
                return Err(RegistryError::RunBusy {
                    run_id: self.run_id.clone(),
                    turn,
                });
            }
            let Some(child) = h.child.take() else {
                return Err(RegistryError::RunEnded {
                    run_id: self.run_id.clone(),
                    reason: h.gone.unwrap_or(if h.disposed {
                        "disposed"
                    } else {
                        "child exited"
                    }),
                });
            };
            if let Some(k) = h.keep_alive.take() {
                k.abort();
            }
            h.turn += 1;
            h.turn_cancel = CancellationToken::new();
            self.state.send_replace(RunState::Running { turn: h.turn });
            (child, h.turn, h.turn_cancel.clone())
        };
        if let Some(events) = &self.events {
            let started = Started {
                run_id: self.run_id.clone(),
                provider: self.provider.name.clone(),
                turn,
                session_id: self.session_id.clone(),
                label: self.label.clone(),
            };
            let _ = events.send(RunEvent::Started(started)).await;
        }
        let prompt = self.with_instruction(prompt);
        tokio::spawn(self.clone().turn_task(child, turn, prompt, cancel));
        Ok(turn)
    }

    async fn turn_task(
        self: Arc<Self>,
        child: Child,
        turn: u32,
        prompt: Vec<ContentBlock>,
        cancel: CancellationToken,
    ) {
        let (began, ()) = (
            std::time::Instant::now(),
            crate::metrics::get().turn_started(&self.provider.name),
        );
        let (tx, mut rx) = mpsc::channel::<ChildEvent>(crate::wire::QUEUE_DEPTH);
        let ctl = TurnControl {
            cancel,
            run_timeout: self.run_timeout.or(self.provider.run_timeout),
            max_output: self.max_output,
            sink: self.sink.clone(),
            events: self.events.is_some().then_some(tx),
            updates: self.forward_updates,
            asks: self.forward_permissions,
            budget: Some(self.spend.clone()),
            tool_filter: self.tool_filter.clone(),
        };
        // The child's events, mapped in order onto the run's channel; ends with the turn.
        let forward = async {
            while let Some(event) = rx.recv().await {
                if let Some(events) = &self.events {
                    let _ = events.send(RunEvent::from_child(&self.run_id, event)).await;
                }
            }
        };
        // The parent's side of a run, for its trace: the prompt it gave and the result it gets.
        if let Some(trace) = child.trace() {
            let started =
                serde_json::json!({ "runId": self.run_id, "turn": turn, "prompt": prompt });
            trace.value(crate::trace::Hop::ParentToAcpd, &started);
        }
        let (report, ()) = tokio::join!(child.prompt(prompt, ctl), forward);
        let mut result = self.result(turn, &report, &child);
        let workspace = lock(&self.workspace).clone();
        if let Some(w) = workspace {
            let report = w.settle(turn).await;
            if let Some(f) = &report.failure {
                tracing::warn!(run = %self.run_id, turn, "worktree {}: {}", f.path.display(), f.message);
            }
            result.workspace = Some(report);
        }
        let result = Arc::new(result);
        crate::metrics::get().turn_ended(&result, began.elapsed());
        child.note_span("acpd.stop_reason", result.stop_reason.as_str());
        let category = result.failure.as_ref().map(|f| f.category.as_str());
        child.note_span("acpd.category", category.unwrap_or("none"));
        if let Some(trace) = child.trace() {
            let ended =
                serde_json::json!({ "runId": self.run_id, "turn": turn, "result": *result });
            trace.value(crate::trace::Hop::AcpdToParent, &ended);
            trace.flush();
        }
        match result.stop_reason {
            StopReason::Completed => {}
            StopReason::Error => {
                tracing::warn!(
                    target: crate::child::FAILURE_LOG,
                    provider = %self.provider.name, run = %self.run_id, turn,
                    "turn failed: {}", result.diagnostic.as_deref().unwrap_or("-")
                );
                tracing::debug!(
                    provider = %self.provider.name, run = %self.run_id, turn,
                    stderr_tail = ?child.stderr_tail(), "the child's last stderr lines"
                );
            }
            other => tracing::info!(
                provider = %self.provider.name, run = %self.run_id, turn,
                stop_reason = %other, "turn ended"
            ),
        }
        // `ended` goes out before the run is seen as settled, so a follow-up's `started` can
        // never overtake it.
        if let Some(events) = &self.events {
            let ended = Ended {
                run_id: self.run_id.clone(),
                provider: self.provider.name.clone(),
                turn,
                result: (*result).clone(),
            };
            let _ = events.send(RunEvent::Ended(Box::new(ended))).await;
        }
        let keep = {
            let mut h = lock(&self.slot);
            let keep = !report.child_spent && !h.disposed;
            self.state.send_replace(RunState::Settled {
                turn,
                result: result.clone(),
            });
            if keep {
                h.keep_alive = Some(tokio::spawn(self.clone().keep_alive(child.clone())));
                h.child = Some(child);
                None
            } else {
                h.gone = Some(if report.child_spent {
                    "child spent by its last turn"
                } else {
                    "disposed"
                });
                Some(child)
            }
        };
        if let Some(child) = keep {
            child.teardown().await;
            self.release();
        }
    }

    /// Ends an idle child after `keep_alive`, as soon as it exits by itself, or when the
    /// run's budget (or one above it) is spent.
    async fn keep_alive(self: Arc<Self>, child: Child) {
        let gone = tokio::select! {
            _ = tokio::time::sleep(self.provider.keep_alive) => KEEP_ALIVE_ENDED,
            _ = child.exited() => KEEP_ALIVE_ENDED,
            _ = child.ended() => KEEP_ALIVE_ENDED,
            _ = self.spend.spent().cancelled() => BUDGET_SPENT,
        };
        let child = {
            let mut h = lock(&self.slot);
            h.keep_alive = None;
            h.gone = Some(gone);
            h.child.take()
        };
        if let Some(child) = child {
            child.teardown().await;
            self.release();
        }
    }

    fn release(&self) {
        let mut h = lock(&self.slot);
        h.handle = None;
        h.pid = None;
        h.capacity = None;
    }

    pub(super) async fn wait(&self) -> Result<Arc<SubagentResult>, RegistryError> {
        let mut rx = self.state.subscribe();
        loop {
            match &*rx.borrow_and_update() {
                RunState::Running { .. } => {}
                RunState::Settled { result, .. } => return Ok(result.clone()),
                RunState::Disposed => {
                    return Err(RegistryError::RunEnded {
                        run_id: self.run_id.clone(),
                        reason: "disposed",
                    });
                }
            }
            if rx.changed().await.is_err() {
                return Err(RegistryError::RunEnded {
                    run_id: self.run_id.clone(),
                    reason: "disposed",
                });
            }
        }
    }

    pub(super) fn cancel(&self) {
        lock(&self.slot).turn_cancel.cancel();
    }

    /// Cancels the current turn, waits for it to settle, tears the tree down. Idempotent:
    /// concurrent and repeated calls all return once the tree is gone.
    /// Ends the run; returns how its last turn settled (a running turn is cancelled and
    /// waited for), `None` when it never settled.
    pub(super) async fn dispose(&self) -> Option<Arc<SubagentResult>> {
        let (handle, idle_child) = {
            let mut h = lock(&self.slot);
            h.disposed = true;
            h.turn_cancel.cancel();
            if let Some(k) = h.keep_alive.take() {
                k.abort();
            }
            (h.handle.clone(), h.child.take())
        };
        let settled = self.wait().await.ok();
        if let Some(handle) = handle {
            handle.shut().await;
        }
        drop(idle_child);
        self.release();
        // A disposed run keeps no output: whoever still waits learns it ended.
        self.state.send_replace(RunState::Disposed);
        let keep = self.keep_branch.load(std::sync::atomic::Ordering::Acquire);
        let force = self.force.load(std::sync::atomic::Ordering::Acquire);
        self.drop_workspace(keep, force).await;
        settled
    }

    /// Asks dispose to delete the worktree's branch too (`keepBranch: false`).
    pub(super) fn discard_branch(&self) {
        self.keep_branch
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Asks dispose to remove the worktree even with work git refuses to commit (`force`).
    pub(super) fn force_removal(&self) {
        self.force.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The worktree dispose kept, with why.
    pub(super) fn kept(&self) -> Option<acpd_protocol::subagent::WorkspaceFailure> {
        lock(&self.kept).clone()
    }

    /// Commits what the run's worktree holds and removes it, once (its child must be gone);
    /// one whose work cannot be committed stays unless `force`, and [`Run::kept`] says so.
    pub(super) async fn drop_workspace(&self, keep_branch: bool, force: bool) {
        let workspace = lock(&self.workspace).take();
        if let Some(w) = workspace
            && let Err(crate::workspace::WorkspaceError::Uncommitted { kind, path, source }) = w
                .dispose(
                    &format!("acpd: run {} at dispose", w.id),
                    keep_branch,
                    force,
                )
                .await
        {
            *lock(&self.kept) = Some(acpd_protocol::subagent::WorkspaceFailure {
                kind,
                path,
                message: source.to_string(),
            });
        }
    }

    fn with_instruction(&self, mut prompt: Vec<ContentBlock>) -> Vec<ContentBlock> {
        if let Some(schema) = &self.schema {
            prompt.push(schema.instruction());
        }
        prompt
    }

    fn result(&self, turn: u32, report: &TurnReport, child: &Child) -> SubagentResult {
        let mut mapped = map_outcome(&report.end, report.cancel_requested);
        let mut notes = report.notes.clone();
        let mut structured = None;
        if let Some(schema) = &self.schema
            && mapped.stop_reason == StopReason::Completed
        {
            let text: String = report
                .output
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text(t) => Some(t.text.as_str()),
                    _ => None,
                })
                .collect();
            match schema.check(&text) {
                Ok(value) => structured = Some(value),
                Err(reason) => {
                    tracing::info!(provider = %self.provider.name, run = %self.run_id, turn, "{reason}");
                    mapped.stop_reason = StopReason::Error;
                    mapped.failure = Some(Failure {
                        stage: Stage::Prompt,
                        category: Category::OutputSchema,
                        code: None,
                        exit_code: None,
                        signal: None,
                    });
                    notes.push("output: not JSON that validates against the outputSchema");
                }
            }
        }
        // An auth failure names what would fix it: the advertised method ids and the
        // environment variable names that satisfy them (names only, never values).
        if matches!(
            mapped.failure.as_ref().map(|f| &f.category),
            Some(Category::Budget)
        ) {
            notes.push(self.spend.why());
        }
        let is_auth = matches!(
            mapped.failure.as_ref().map(|f| &f.category),
            Some(Category::Auth)
        );
        let auth_methods: &[String] = if is_auth {
            &child.agent().auth_method_ids
        } else {
            &[]
        };
        let auth_env: Vec<String> = if is_auth {
            notes.extend(crate::child::auth_notes(&self.provider, auth_methods));
            super::gate::auth_facts(&self.provider, auth_methods)
        } else {
            Vec::new()
        };
        // A completed turn still says what acpd decided for it (a permission it rejected).
        let diagnostic =
            (mapped.stop_reason != StopReason::Completed || !notes.is_empty()).then(|| {
                diagnostic::build(&Facts {
                    provider: &self.provider.name,
                    failure: mapped.failure.as_ref(),
                    stop_reason: report.child_stop_reason.as_deref(),
                    auth_methods,
                    auth_method: None,
                    env_names: &auth_env,
                    notes: &notes,
                    ..Default::default()
                })
            });
        SubagentResult {
            run_id: self.run_id.clone(),
            provider: self.provider.name.clone(),
            turn,
            stop_reason: mapped.stop_reason,
            output: report.output.clone(),
            output_truncated: report.output_truncated,
            structured,
            diagnostic,
            failure: mapped.failure,
            workspace: None,
        }
    }
}
