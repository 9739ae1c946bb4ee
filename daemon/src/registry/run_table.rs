//! The run table: a published run found by its owner (only its owner may wait on, cancel,
//! send to or dispose it), and a disposed run's tombstone, so a late `wait` or `dispose` gets a
//! clear answer.

use std::sync::Arc;

use acpd_protocol::subagent::{SubagentResult, WorkspaceFailure};

use super::{Owner, Parent, Registry, RegistryError, Run, TOMBSTONES, Table, lock};

impl Registry {
    /// The run `run_id` if `owner` owns it; a disposed one of its own is `RunEnded`.
    fn find(&self, owner: Owner, run_id: &str) -> Result<Arc<Run>, RegistryError> {
        let table = lock(&self.inner.table);
        if let Some(run) = table.runs.get(run_id).filter(|r| r.owner == owner) {
            return Ok(run.clone());
        }
        if table.tombstones.get(run_id) == Some(&owner) {
            return Err(RegistryError::RunEnded {
                run_id: run_id.to_string(),
                reason: "disposed",
            });
        }
        Err(RegistryError::UnknownRun {
            run_id: run_id.to_string(),
        })
    }

    /// Waits until the run's current turn settles and returns its result.
    pub async fn wait(
        &self,
        owner: Owner,
        run_id: &str,
    ) -> Result<Arc<SubagentResult>, RegistryError> {
        self.find(owner, run_id)?.wait().await
    }

    /// Cancels the run's current turn (no-op when it is settled).
    pub fn cancel(&self, owner: Owner, run_id: &str) -> Result<(), RegistryError> {
        match self.find(owner, run_id) {
            Ok(run) => {
                run.cancel();
                self.cancel_nested(&Parent::Run(run.run_id.clone()));
            }
            Err(RegistryError::RunEnded { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Starts a follow-up turn on a settled run whose child is still alive.
    pub async fn send(
        &self,
        owner: Owner,
        run_id: &str,
        prompt: Vec<acpd_protocol::acp::ContentBlock>,
    ) -> Result<u32, RegistryError> {
        self.find(owner, run_id)?.send(prompt).await
    }

    /// Cancels what runs, tears the child's tree down, reaps it, and forgets the run (a
    /// tombstone without output stays). A repeat succeeds.
    pub async fn dispose(&self, owner: Owner, run_id: &str) -> Result<(), RegistryError> {
        self.dispose_with(owner, run_id, true, false)
            .await
            .map(drop)
    }

    /// [`Registry::dispose`], deleting the worktree's branch too unless `keep_branch`, and
    /// removing a worktree with work git refuses to commit only when `force`; returns the
    /// worktree it kept because its work could not be committed.
    pub async fn dispose_with(
        &self,
        owner: Owner,
        run_id: &str,
        keep_branch: bool,
        force: bool,
    ) -> Result<Option<WorkspaceFailure>, RegistryError> {
        let run = match self.find(owner, run_id) {
            Ok(run) => run,
            Err(RegistryError::RunEnded { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !keep_branch {
            run.discard_branch();
        }
        if force {
            run.force_removal();
        }
        self.dispose_nested(&Parent::Run(run.run_id.clone())).await;
        run.dispose().await;
        self.bury(&run);
        Ok(run.kept())
    }

    /// Forgets a disposed run, keeping a tombstone (at most [`TOMBSTONES`]).
    pub(super) fn bury(&self, run: &Run) {
        let mut table = lock(&self.inner.table);
        if table.runs.remove(&run.run_id).is_none() {
            return;
        }
        table.tombstones.insert(run.run_id.clone(), run.owner);
        table.tombstone_order.push_back(run.run_id.clone());
        while table.tombstone_order.len() > TOMBSTONES {
            if let Some(old) = table.tombstone_order.pop_front() {
                table.tombstones.remove(&old);
            }
        }
    }

    /// Disposes every run of `owner` in parallel (its connection ended) and forgets them.
    /// Disposes every run of `owner` (and what is nested under each); returns how each run's
    /// last turn settled, by run id, so the owner's editor can be told the truth about runs
    /// whose own `ended` event it will no longer pump.
    pub async fn dispose_owner(
        &self,
        owner: Owner,
    ) -> std::collections::HashMap<String, Arc<SubagentResult>> {
        let runs: Vec<Arc<Run>> = lock(&self.inner.table)
            .runs
            .values()
            .filter(|r| r.owner == owner)
            .cloned()
            .collect();
        let settled = futures::future::join_all(runs.iter().map(|r| async move {
            self.dispose_nested(&Parent::Run(r.run_id.clone())).await;
            r.dispose().await.map(|result| (r.run_id.clone(), result))
        }))
        .await;
        let mut table = lock(&self.inner.table);
        table.runs.retain(|_, r| r.owner != owner);
        table.tombstones.retain(|_, o| *o != owner);
        let Table {
            tombstones,
            tombstone_order,
            ..
        } = &mut *table;
        tombstone_order.retain(|id| tombstones.contains_key(id));
        settled.into_iter().flatten().collect()
    }

    /// Every run in the table.
    pub fn runs(&self) -> Vec<Arc<Run>> {
        lock(&self.inner.table).runs.values().cloned().collect()
    }
}
