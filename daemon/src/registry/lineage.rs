//! Nested delegation's lineage: a child that delegates in turn connects back to this acpd
//! (through the `acpd mcp` [`super::offer`] offered it), and every run started over such a
//! connection is nested under the run or bridge session whose child it came from. Who that is
//! is never taken from what the child says: the connecting process's ancestry (from the
//! kernel) must lead to a live child of this acpd, so a child cannot escape `max_depth` or
//! adopt a stranger's run. The runs nested under a parent are cancelled and disposed with it.

use std::sync::Arc;

use acpd_protocol::tool_filter::ToolFilter;

use super::{Registry, RegistryError, Run, lock};
use crate::config::ProviderConfig;
use crate::supervise::Confinement;

/// Whose child started a nested run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// A delegated run, by run id.
    Run(String),
    /// A bridge session, by its acpd id.
    Session(String),
}

/// Where a connection from inside a child's process tree belongs.
#[derive(Debug, Clone)]
pub struct Nest {
    pub parent: Parent,
    /// The depth of the child whose tree the connection came from.
    pub depth: u32,
    /// The depth limit that child is under (a run's `maxDepth` binds what it starts).
    pub max_depth: u32,
    /// What that child's sandbox lets it write (none: it is not sandboxed): a run started
    /// from its tree may write nowhere it could not, nor use a network it may not.
    pub confinement: Option<Arc<Confinement>>,
}

/// Where a connecting process stands relative to this acpd's children.
#[derive(Debug, Clone)]
pub enum Lineage {
    /// Not below this acpd at all (a user's CLI, an editor).
    Outside,
    /// In the tree of this child's run or session.
    Nested(Nest),
    /// Below this acpd, in the tree of a child not filed under a run or session yet.
    Unfiled,
}

/// What acpd learned of a connecting process when it connected (its ancestry may change
/// later: a parent that exits reparents it).
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub ancestry: crate::supervise::Ancestry,
    pub in_child_group: bool,
}

impl Origin {
    /// Read now, for the process `pid`.
    pub fn of(pid: i32) -> Origin {
        Origin {
            ancestry: crate::supervise::ancestry(pid, MAX_ANCESTRY),
            in_child_group: crate::supervise::in_child_group(pid),
        }
    }
}

/// Whose process tree a connection comes from, for `max_connections_per_child`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tree {
    /// Not below this acpd (an editor, a user's CLI): only `max_connections` applies.
    Outside,
    /// Below this acpd's child `pid`, started at `start` (whatever run or session it is in,
    /// filed yet or not).
    Child { pid: i32, start: u64 },
    /// Below this acpd but under no child it spawned (a double-forked escapee reparented to
    /// acpd, the subreaper), or from a walk that could not tell: all of these share one
    /// allowance, so forking more escapees buys no more connections.
    Unplaced,
}

impl Origin {
    /// The tree this process belongs to, from the ancestry read when it connected: the
    /// ancestor just below this acpd, when it is a child acpd spawned and still holds.
    pub fn tree(&self) -> Tree {
        let own = std::process::id() as i32;
        let chain = &self.ancestry.chain;
        match chain.iter().position(|&(pid, _)| pid == own) {
            Some(at) => match at.checked_sub(1).and_then(|below| chain.get(below)) {
                Some(&(pid, start)) if crate::supervise::is_own_child(pid, start) => {
                    Tree::Child { pid, start }
                }
                _ => Tree::Unplaced,
            },
            None if self.ancestry.complete && !self.in_child_group => Tree::Outside,
            None => Tree::Unplaced,
        }
    }
}

/// How far up a connecting process's ancestry acpd looks for one of its children.
const MAX_ANCESTRY: usize = 64;

impl Registry {
    /// The run whose live child is `pid`.
    pub fn run_by_pid(&self, pid: i32) -> Option<Arc<Run>> {
        lock(&self.inner.table)
            .runs
            .values()
            .find(|r| r.pid() == Some(pid))
            .cloned()
    }

    /// Where a connection from a process with `origin` belongs: the nearest of its ancestors
    /// (itself included, acpd excluded) that is a live child of this acpd — a run's, or a
    /// bridge session's as `session_of` tells (with that session child's confinement).
    ///
    /// Only a walk that reached init without meeting acpd, from a process in none of acpd's
    /// child groups, makes an outsider. A process that left its tree by a double fork is
    /// reparented to acpd (a subreaper), and one whose walk was cut short (an ancestor that
    /// exited, a chain deeper than the limit) proves nothing: both are refused as children
    /// acpd cannot place, never taken for a top-level client.
    pub fn lineage_of(
        &self,
        origin: &Origin,
        session_of: impl Fn(i32) -> Option<(String, Option<Arc<Confinement>>)>,
    ) -> Lineage {
        let own = std::process::id() as i32;
        for &(at, _) in &origin.ancestry.chain {
            if at == own {
                // Below acpd, in no run or session filed (yet): a child still starting, or
                // one that left its tree.
                return Lineage::Unfiled;
            }
            if let Some(nest) = self.nest_at(at, &session_of) {
                return Lineage::Nested(nest);
            }
        }
        if origin.ancestry.complete && !origin.in_child_group {
            Lineage::Outside
        } else {
            Lineage::Unfiled
        }
    }

    /// The nest of the run or bridge session whose child is `pid`, if any.
    fn nest_at(
        &self,
        pid: i32,
        session_of: &impl Fn(i32) -> Option<(String, Option<Arc<Confinement>>)>,
    ) -> Option<Nest> {
        if let Some(run) = self.run_by_pid(pid) {
            return Some(Nest {
                parent: Parent::Run(run.run_id.clone()),
                depth: run.depth,
                max_depth: run.max_depth,
                confinement: run.confinement.clone(),
            });
        }
        session_of(pid).map(|(session, confinement)| Nest {
            parent: Parent::Session(session),
            depth: self.inner.depth.depth.saturating_add(1),
            max_depth: self.max_depth(None),
            confinement,
        })
    }

    /// The tool filter of a run nested under `nest` that asked for `asked`: its ancestor's,
    /// only ever narrowed (denies joined, allows met, see [`ToolFilter::narrowed_by`]), so a
    /// child cannot shed its filter by delegating. Refused when the result permits nothing
    /// the request allowed, when the provider cannot take a filter it inherits, and when the
    /// run it would be nested under is gone (it could not be held to its filter).
    pub(super) fn nested_filter(
        &self,
        provider: &ProviderConfig,
        nest: Option<&Nest>,
        asked: Option<&ToolFilter>,
    ) -> Result<Option<ToolFilter>, RegistryError> {
        let Some(Parent::Run(parent)) = nest.map(|n| &n.parent) else {
            return Ok(asked.cloned());
        };
        let Some(run) = lock(&self.inner.table).runs.get(parent).cloned() else {
            return Err(RegistryError::InvalidRequest {
                reason: format!("the run {parent} this one would be nested under has ended"),
            });
        };
        let Some(above) = run.tool_filter() else {
            return Ok(asked.cloned());
        };
        let Some(asked) = asked else {
            if !super::gate::capabilities(provider, false).tool_filter {
                return Err(RegistryError::UnsupportedCapability {
                    provider: provider.name.clone(),
                    capability: "toolFilter (inherited from the run this one is nested under)",
                });
            }
            return Ok(Some((*above).clone()));
        };
        let narrowed = above.narrowed_by(asked);
        if narrowed.permits_nothing() {
            let list = |names: &Option<Vec<String>>| {
                names.as_ref().map_or("-".to_string(), |n| n.join(", "))
            };
            return Err(RegistryError::InvalidRequest {
                reason: format!(
                    "toolFilter allows only tools the run it is nested under forbids (that run \
                     allows: {}; denies: {}); a nested run can only narrow its ancestor's filter",
                    list(&above.allow),
                    list(&above.deny)
                ),
            });
        }
        Ok(Some(narrowed))
    }

    /// Cancels a run's turn whoever owns it, and the runs nested under it (a parent's cancel).
    pub fn cancel_run(&self, run: &Run) {
        run.cancel();
        self.cancel_nested(&Parent::Run(run.run_id.clone()));
    }

    /// Passes `session/update` params about a nested run to the owner of run `run_id` (its
    /// parent); dropped when that owner is behind or gone, like any update it did not read.
    pub fn announce_to_run(&self, run_id: &str, params: Box<serde_json::value::RawValue>) {
        let run = lock(&self.inner.table).runs.get(run_id).cloned();
        if let Some(events) = run.as_ref().and_then(|r| r.events.as_ref()) {
            let event = super::RunEvent::Nested {
                run_id: run_id.to_string(),
                params,
            };
            if events.try_send(event).is_err() {
                tracing::debug!(run = %run_id, "dropping a nested run's update");
            }
        }
    }

    /// The session id a run's owner knows it by.
    pub fn session_of_run(&self, run_id: &str) -> Option<String> {
        lock(&self.inner.table)
            .runs
            .get(run_id)
            .map(|r| r.session_id.clone())
    }

    /// The bridge session at the top of `parent`'s chain of nested runs, if it is one.
    pub fn top_session(&self, parent: &Parent) -> Option<String> {
        let mut at = parent.clone();
        // Each level is a run whose parent existed before it: the chain ends, and is short.
        for _ in 0..=self.max_depth(None) {
            match at {
                Parent::Session(s) => return Some(s),
                Parent::Run(run_id) => {
                    at = lock(&self.inner.table).runs.get(&run_id)?.parent.clone()?;
                }
            }
        }
        None
    }

    /// The runs started from `parent`'s child.
    pub fn nested_runs(&self, parent: &Parent) -> Vec<Arc<Run>> {
        lock(&self.inner.table)
            .runs
            .values()
            .filter(|r| r.parent.as_ref() == Some(parent))
            .cloned()
            .collect()
    }

    /// Cancels the turns of every run nested under `parent`, and theirs in turn: a parent's
    /// cancel reaches the whole tree even when a child would not pass it on.
    pub fn cancel_nested(&self, parent: &Parent) {
        for run in self.nested_runs(parent) {
            run.cancel();
            self.cancel_nested(&Parent::Run(run.run_id.clone()));
        }
    }

    /// Disposes every run nested under `parent` (their nested runs with them) and waits until
    /// their trees are reaped.
    pub async fn dispose_nested(&self, parent: &Parent) {
        let runs = self.nested_runs(parent);
        futures::future::join_all(runs.iter().map(|run| async move {
            Box::pin(self.dispose_nested(&Parent::Run(run.run_id.clone()))).await;
            run.dispose().await;
            self.bury(run);
        }))
        .await;
    }
}
