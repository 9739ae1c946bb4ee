//! Sessions that last: the daemon-wide table of live bridge sessions (attached to a
//! connection or detached, waiting for one) and the durable session map behind it. The
//! session methods that need no live child of the editor's own are in [`super::session_list`]
//! and [`super::session_delete`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acpd_protocol::envelope::RpcError;
use serde_json::json;
use serde_json::value::RawValue;
use tokio_util::task::TaskTracker;

use super::{Principal, lock, session_not_found};
use crate::child::Child;
use crate::registry::Slot;
use crate::store::{Holder, Store};

/// The session map in the state directory, else one in memory (acpd runs, remembering
/// nothing past its exit).
pub(crate) fn open_store() -> Store {
    Store::open_default().unwrap_or_else(Store::in_memory)
}

/// Every live bridge session of this acpd process.
pub(crate) struct Sessions {
    pub store: Store,
    /// This acpd process, as it holds leases on the sessions live in it.
    pub holder: Holder,
    live: Mutex<HashMap<String, Live>>,
    /// Ids being opened right now (a load spawning its child) and by which principal, so a
    /// second load of the same id waits its turn instead of opening it twice (and another
    /// principal's load learns nothing of it).
    opening: Mutex<HashMap<String, Option<Principal>>>,
    /// Ids a `session/delete` is deleting right now and by which principal: the lease the delete took
    /// is kept until the agent answered it (the session it ends on the way does not release
    /// it), and no load here opens it meanwhile.
    deleting: Mutex<HashMap<String, Option<Principal>>>,
    /// Woken when a connection releases its sessions or a live session ends (see
    /// [`RELEASE_WAIT`]).
    pub released: tokio::sync::Notify,
    /// How long a session outlives its connection (`acpd serve`'s `detach_timeout`); `None`
    /// ends it with the connection (stdio, or `detach_timeout = "0s"`).
    pub detach: Option<Duration>,
    tasks: TaskTracker,
}

struct Live {
    child: Child,
    workspace: Option<SessionWorkspace>,
    /// The principal of the connection that opened it: only it may attach it again.
    owner: Option<Principal>,
    attached: bool,
}

/// Where a live session's work lands when it has a worktree: what its editor is told
/// (`_meta.acpd.workspace`), and the cwd its agent is given instead of the editor's.
#[derive(Debug, Clone)]
pub(crate) struct SessionWorkspace {
    pub branch: String,
    pub path: std::path::PathBuf,
    pub base: String,
    pub cwd: std::path::PathBuf,
}

impl SessionWorkspace {
    pub(crate) fn of_worktree(w: &crate::workspace::Worktree) -> SessionWorkspace {
        SessionWorkspace {
            branch: w.branch.clone(),
            path: w.path.clone(),
            base: w.base.clone(),
            cwd: w.cwd.clone(),
        }
    }

    /// `{branch, path, base}`, as the `session/new` answer's `_meta.acpd.workspace`.
    pub(crate) fn meta(&self) -> serde_json::Value {
        json!({"branch": self.branch, "path": self.path, "base": self.base})
    }
}

/// What a load found (see [`Sessions::take_for_load`]).
pub(crate) enum Taken {
    Detached(Child),
    Reserved(Reservation),
    /// Open on another connection (which may be closing right now).
    Attached,
    /// Being opened by another user's load (of their own session, or of an id they guessed):
    /// waited for like [`Taken::Attached`], never answered "unknown" meanwhile, so another
    /// user's load cannot make the owner's fail.
    Foreign,
}

/// How long a load waits for the connection holding its session to finish closing: an editor
/// that reconnects at once can be faster than acpd reading its old connection's end.
pub(super) const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// An id being opened: no other load may open it until this drops.
pub(crate) struct Reservation {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.sessions.opening).remove(&self.id);
        // A load waiting behind this one (see [`Taken::Foreign`]) tries again.
        self.sessions.released.notify_waiters();
    }
}

/// An id being deleted (see [`Sessions::begin_delete`]): its lease stays taken until this
/// drops.
pub(crate) struct Deleting {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for Deleting {
    fn drop(&mut self) {
        lock(&self.sessions.deleting).remove(&self.id);
        self.sessions.released.notify_waiters();
    }
}

/// What `acpd status` shows of bridge sessions.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct SessionCounts {
    pub attached: usize,
    pub detached: usize,
}

impl Sessions {
    pub(crate) fn new(store: Store, detach: Option<Duration>) -> Arc<Sessions> {
        Arc::new(Sessions {
            store,
            holder: Holder::me(),
            live: Mutex::new(HashMap::new()),
            opening: Mutex::default(),
            deleting: Mutex::default(),
            released: tokio::sync::Notify::new(),
            detach,
            tasks: TaskTracker::new(),
        })
    }

    /// Files a live session (attached) and watches it: when its driver ends it is forgotten,
    /// its tree reaped (the runs its child started with it) and its claim on the limits
    /// released. Its worktree, if it has one, lives as long as its child — detached and
    /// attached again included — and then goes with whatever the child left in it
    /// committed on its branch, which stays.
    pub(crate) fn file(
        self: &Arc<Self>,
        id: &str,
        child: Child,
        slot: Slot,
        owner: Option<Principal>,
        registry: crate::registry::Registry,
        workspace: Option<crate::workspace::Worktree>,
    ) {
        lock(&self.live).insert(
            id.to_string(),
            Live {
                workspace: workspace.as_ref().map(SessionWorkspace::of_worktree),
                child: child.clone(),
                owner,
                attached: true,
            },
        );
        let me = self.clone();
        let id = id.to_string();
        self.tasks.spawn(async move {
            let end = child.ended().await;
            tracing::info!(provider = %child.provider().name, session = %id, ?end, "bridge session ended");
            let nested = crate::registry::Parent::Session(id.clone());
            // A worktree goes before the session is free to load again: an editor's load
            // right after its close makes the worktree again, at the same path.
            let had_workspace = workspace.is_some();
            if let Some(w) = workspace {
                tokio::join!(child.shut(), registry.dispose_nested(&nested));
                // Never removed with work git refuses to commit: it stays, unswept, and
                // the log names it.
                let _ = w.dispose(&format!("acpd: session {id}"), true, false).await;
            }
            // No longer live here: another acpd may load it now. Released before the entry
            // goes, so a load of it in this process (which waits for the entry) claims after
            // this release, never before it. Not while a delete of it runs: the delete took
            // the lease for its whole call to the agent and gives it up itself.
            let deleting = lock(&me.deleting).contains_key(&id);
            if deleting {
                tracing::debug!(session = %id, "session ended by its delete: the lease stays with the delete");
            } else if let Err(e) = me.store.release(&id, &me.holder).await {
                tracing::warn!(session = %id, "cannot release the session's lease: {e}");
            }
            lock(&me.live).remove(&id);
            // A load waiting for it (a close then a load, as an editor does) goes on now.
            me.released.notify_waiters();
            if !had_workspace {
                tokio::join!(child.shut(), registry.dispose_nested(&nested));
            }
            drop(slot);
        });
    }

    /// The connection holding the session closed: it waits for another (`detach`), or ends.
    pub(crate) async fn release(&self, id: &str, child: &Child, shutting_down: bool) {
        if self.detach.is_some() && !shutting_down {
            // Signalled before anyone can take it, so the detach never lands on the next
            // connection.
            let answered = child.detach_answered();
            if let Some(live) = lock(&self.live).get_mut(id) {
                live.attached = false;
            }
            self.released.notify_waiters();
            // The leaving connection's outbox closes after this: its prompts' answers first.
            answered.await;
        } else {
            child.shut().await;
        }
    }

    /// What a load of `id` by `who` finds: a detached session it may attach (taken), nothing
    /// live (the id is then reserved until the returned guard drops or the session is filed),
    /// or an error when the session is open on another connection or being opened.
    pub(crate) fn take_for_load(
        self: &Arc<Self>,
        id: &str,
        who: Option<&Principal>,
    ) -> Result<Taken, RpcError> {
        let mut live = lock(&self.live);
        if let Some(deleter) = lock(&self.deleting).get(id) {
            if deleter.as_ref() != who {
                return Ok(Taken::Foreign);
            }
            return Err(RpcError::invalid_request(format!(
                "session {id} is being deleted by another request"
            )));
        }
        if let Some(opener) = lock(&self.opening).get(id) {
            if opener.as_ref() != who {
                return Ok(Taken::Foreign);
            }
            return Err(RpcError::invalid_request(format!(
                "session {id} is being opened by another request; retry when it answers"
            )));
        }
        let Some(entry) = live.get_mut(id) else {
            lock(&self.opening).insert(id.to_string(), who.cloned());
            return Ok(Taken::Reserved(Reservation {
                sessions: self.clone(),
                id: id.to_string(),
            }));
        };
        if entry.owner.as_ref() != who {
            return Err(session_not_found(id));
        }
        if entry.attached {
            return Ok(Taken::Attached);
        }
        entry.attached = true;
        Ok(Taken::Detached(entry.child.clone()))
    }

    /// Marks `id` as being deleted by `who` until the guard drops (see [`Sessions::deleting`]);
    /// an error when another delete of it runs.
    pub(crate) fn begin_delete(
        self: &Arc<Self>,
        id: &str,
        who: Option<&Principal>,
    ) -> Result<Deleting, RpcError> {
        let mut deleting = lock(&self.deleting);
        if deleting.contains_key(id) {
            return Err(RpcError::invalid_request(format!(
                "session {id} is being deleted by another request; retry when it answers"
            )));
        }
        deleting.insert(id.to_string(), who.cloned());
        Ok(Deleting {
            sessions: self.clone(),
            id: id.to_string(),
        })
    }

    /// Ends a detached session of `who`; false when there is none.
    pub(crate) async fn end_detached(&self, id: &str, who: Option<&Principal>) -> bool {
        let child = {
            let live = lock(&self.live);
            live.get(id)
                .filter(|l| !l.attached && l.owner.as_ref() == who)
                .map(|l| l.child.clone())
        };
        match child {
            Some(child) => {
                child.shut().await;
                true
            }
            None => false,
        }
    }

    /// The worktree of live session `id`, when it has one.
    pub(crate) fn workspace(&self, id: &str) -> Option<SessionWorkspace> {
        lock(&self.live).get(id).and_then(|l| l.workspace.clone())
    }

    /// The live session whose child is `pid`, and what that child may write.
    pub(crate) fn by_pid(
        &self,
        pid: i32,
    ) -> Option<(String, Option<Arc<crate::supervise::Confinement>>)> {
        lock(&self.live)
            .iter()
            .find(|(_, l)| l.child.pid() == pid)
            .map(|(id, l)| (id.clone(), l.child.confinement()))
    }

    /// Sends a `session/update` about a run nested under session `id` to its parent, if the
    /// session is live (a detached one drops it).
    pub(crate) fn announce(&self, id: &str, params: Box<RawValue>) {
        if let Some(live) = lock(&self.live).get(id) {
            live.child.announce(params);
        }
    }

    /// The connection of the editor holding live session `id`, when it can be asked about a
    /// run nested under it (attached, opted in to Subagent Sessions).
    pub(crate) async fn editor_of(&self, id: &str) -> Option<crate::wire::Peer> {
        let child = lock(&self.live).get(id).map(|l| l.child.clone())?;
        child.parent_peer().await
    }

    pub(crate) fn counts(&self) -> SessionCounts {
        let live = lock(&self.live);
        let attached = live.values().filter(|l| l.attached).count();
        SessionCounts {
            attached,
            detached: live.len() - attached,
        }
    }

    /// Every live session's provider and whether it is attached, for the metrics.
    pub(crate) fn provider_states(&self) -> Vec<(String, bool)> {
        let live = lock(&self.live);
        live.values()
            .map(|l| (l.child.provider().name.clone(), l.attached))
            .collect()
    }

    /// The live sessions of `who`, for `acpd runs`.
    pub(crate) fn entries(
        &self,
        who: Option<&Principal>,
    ) -> Vec<acpd_protocol::methods::SessionEntry> {
        let live = lock(&self.live);
        let mut entries: Vec<_> = live
            .iter()
            .filter(|(_, l)| l.owner.as_ref() == who)
            .map(|(id, l)| acpd_protocol::methods::SessionEntry {
                session_id: id.clone(),
                provider: l.child.provider().name.clone(),
                pid: l.child.pid(),
                state: if l.attached { "attached" } else { "detached" }.to_string(),
            })
            .collect();
        entries.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        entries
    }

    /// Ends every live session and waits until each tree is reaped (acpd is stopping).
    pub(crate) async fn shut_all(&self) {
        let children: Vec<Child> = lock(&self.live).values().map(|l| l.child.clone()).collect();
        futures::future::join_all(children.iter().map(|c| c.shut())).await;
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The answer to a load, resume, fork or delete of a session live in another acpd process.
pub(super) fn held_elsewhere(sid: &str, h: &Holder) -> RpcError {
    RpcError::invalid_request(format!(
        "session {sid} is live in another acpd process (pid {pid}) sharing this session map; \
         close it there (session/close through that acpd, or end acpd {pid}), then retry",
        pid = h.pid
    ))
    .with_data(json!({ "holderPid": h.pid }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 18 (beyond the list): another user's load of an id (guessed, or learnt from a
    /// trace file's name) holds the id for a moment; the owner's own load then waits for it
    /// instead of being told its session is unknown.
    #[tokio::test]
    async fn another_users_load_never_makes_the_owners_fail() {
        let sessions = Sessions::new(Store::in_memory(), None);
        let theirs = sessions.take_for_load("acpd-x", Some(&Principal::Uid(1001)));
        assert!(matches!(theirs, Ok(Taken::Reserved(_))));
        assert!(
            matches!(
                sessions.take_for_load("acpd-x", Some(&Principal::Uid(0))),
                Ok(Taken::Foreign)
            ),
            "the owner's load was refused while another user's held the id"
        );
        let woken = sessions.released.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(theirs);
        tokio::time::timeout(Duration::from_secs(10), woken)
            .await
            .expect("the waiting load is woken when the other one lets go");
        assert!(matches!(
            sessions.take_for_load("acpd-x", Some(&Principal::Uid(0))),
            Ok(Taken::Reserved(_))
        ));
    }
}
