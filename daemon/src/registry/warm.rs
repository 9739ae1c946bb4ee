//! Warm spares (`warm = N` on a provider): children spawned and initialized ahead, so a
//! bridge session's start pays nothing of the agent's own start. A spare is initialized with
//! the client capabilities of the last session that took one of that provider (an agent may
//! behave differently without `fs` or `terminal`), so a session whose editor advertises
//! something else starts cold, and the pool follows it.
//!
//! Once an editor has opened a session, spares go further: each is started in that
//! session's cwd and holds a `session/new` made with the same params (what the editor sent,
//! as the agent got it), because for some agents `session/new` is most of the start
//! (claude-agent-acp's takes about 0.9 s) and some set up per directory at start (opencode
//! readies a project instance for its process's cwd, so a spare started elsewhere did that
//! work for nothing and then again for the session's cwd: slower than cold). The next
//! `session/new` for that cwd and params is handed the spare's session; one for anything
//! else recycles the spares (their sessions deleted where the agent deletes) and the pool
//! follows it. Trace context in `_meta` (`traceparent`, `tracestate`, `baggage`) does not
//! count as a difference. Spares hold their claim on the limits, are replaced in the
//! background when taken, and recycled when they die or pass `warm_max_age`.
//!
//! A spare is only ever handed to a child that would have been started in the same
//! directory: some agents find a session by their process's working directory, not by the
//! `cwd` the request names (gemini-cli's `session/load` answers "No previous sessions found
//! for this project" from anywhere else; opencode readies its project for it). So a session
//! opened, loaded, resumed or forked in a cwd takes only a spare started there, and the pool
//! follows that cwd (spares making no session ahead start there next; those elsewhere are
//! recycled). A request that names no cwd (`authenticate`, `session/list`,
//! `session/delete`) takes a spare only where a new child would start: the provider's `cwd`,
//! else the home directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::Ready;
use super::{Registry, advertises, lock};
use crate::child::ClientCaps;
use crate::config::ProviderConfig;

/// How often the pool looks for dead and old spares at most (and at least).
const CHECK_MIN: Duration = Duration::from_secs(1);
const CHECK_MAX: Duration = Duration::from_secs(60);

/// How long a recycled spare's agent may take to delete the session it made ahead.
const DISCARD_DELETE: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(super) struct Pool {
    providers: HashMap<String, Spares>,
}

#[derive(Default)]
struct Spares {
    ready: Vec<Spare>,
    /// Spares being started now.
    starting: usize,
    /// The capabilities spares are initialized with: the last taker's.
    caps: Option<ClientCaps>,
    /// The session spares make ahead: the last bridge `session/new`'s.
    target: Option<Target>,
    /// Where spares making no session ahead start: the cwd of the last session that asked
    /// for one (without it, the provider's cwd or the home directory).
    cwd: Option<PathBuf>,
}

impl Spares {
    /// The directory the next spares start in, when not the provider's default.
    fn start_cwd(&self) -> Option<&Path> {
        self.target
            .as_ref()
            .map(|t| t.cwd.as_path())
            .or(self.cwd.as_deref())
    }
}

/// Where and how the last bridge `session/new` of a provider opened its session.
#[derive(Clone)]
struct Target {
    cwd: PathBuf,
    /// The params as the agent got them, trace context left out (see [`session_key`]).
    key: serde_json::Value,
    params: serde_json::Value,
}

/// An initialized child, and the session it made ahead, if any.
pub(super) struct Spare {
    ready: Ready,
    made: Option<Made>,
}

struct Made {
    key: serde_json::Value,
    session_id: String,
    reply: Box<RawValue>,
}

/// A spare's session handed to a bridge `session/new`.
pub(super) struct Handover {
    pub ready: Ready,
    pub session_id: String,
    pub reply: Box<RawValue>,
}

/// What two `session/new` params must share for a session made with one to serve the other:
/// everything but W3C trace context, which names a request, not the session.
fn session_key(params: &serde_json::Value) -> serde_json::Value {
    let mut key = params.clone();
    if let Some(meta) = key.get_mut("_meta").and_then(|m| m.as_object_mut()) {
        for k in ["traceparent", "tracestate", "baggage"] {
            meta.remove(k);
        }
        if meta.is_empty() {
            key.as_object_mut().map(|o| o.remove("_meta"));
        }
    }
    key
}

impl Spare {
    fn fresh(&self, max_age: Duration) -> bool {
        self.ready.child.alive() && self.ready.child.ready_at.elapsed() < max_age
    }

    /// The directory its process runs in.
    fn cwd(&self) -> &Path {
        self.ready.child.cwd()
    }

    /// Reaps the spare; the session it made ahead is deleted first where the agent deletes
    /// sessions, so an agent that keeps every session it made (opencode) is not left one no
    /// editor asked for.
    async fn discard(self) {
        let Spare { mut ready, made } = self;
        if let Some(made) = made
            && ready.child.alive()
            && advertises(ready.child.agent(), "/sessionCapabilities/delete")
        {
            let params = acpd_protocol::envelope::to_raw(
                &serde_json::json!({ "sessionId": made.session_id }),
            );
            let cancel = CancellationToken::new();
            let deleted = ready.call("session/delete", &params, &cancel);
            match tokio::time::timeout(DISCARD_DELETE, deleted).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(provider = %ready.child.provider().name, "a warm spare's session was not deleted: {e}");
                }
                Err(_) => {
                    tracing::debug!(provider = %ready.child.provider().name, "a warm spare's session was not deleted in time");
                }
            }
        }
        ready.close().await;
    }
}

impl Registry {
    /// Starts keeping every provider's `warm` spares, until `stop`; spares are reaped then.
    pub fn keep_warm(&self, stop: CancellationToken) {
        let config = self.config();
        let warm: Vec<Arc<ProviderConfig>> = config
            .providers
            .values()
            .filter(|p| p.warm > 0)
            .cloned()
            .collect();
        if warm.is_empty() {
            return;
        }
        *lock(&self.inner.warm_stop) = Some(stop.clone());
        let registry = self.clone();
        tokio::spawn(async move {
            let period = warm
                .iter()
                .map(|p| p.warm_max_age / 4)
                .min()
                .unwrap_or(CHECK_MAX)
                .clamp(CHECK_MIN, CHECK_MAX);
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => registry.tend(&stop).await,
                }
            }
            registry.drain_spares().await;
        });
    }

    /// The pool of `provider` for takers with `caps`: when they differ from the pool's, it
    /// follows them and its spares go (returned, to be discarded).
    fn follow_caps(spares: &mut Spares, caps: &ClientCaps) -> Vec<Spare> {
        if spares.caps.as_ref().map(ClientCaps::key) == Some(caps.key()) {
            return Vec::new();
        }
        spares.caps = Some(caps.clone());
        std::mem::take(&mut spares.ready)
    }

    /// Takes a ready spare of `provider` initialized with `caps`, holding no session and
    /// started where a new child for `cwd` would be (`cwd`, else the provider's, else the
    /// home directory), if there is one, and starts its replacement (for a child asked one
    /// question, or a session the spares' sessions do not fit). A `cwd` (a session's) moves
    /// the pool there: spares holding no session elsewhere are recycled.
    pub(super) async fn take_spare(
        &self,
        provider: &Arc<ProviderConfig>,
        caps: &ClientCaps,
        cwd: Option<&Path>,
    ) -> Option<Ready> {
        if provider.warm == 0 {
            return None;
        }
        let want = cwd
            .or(provider.cwd.as_deref())
            .map_or_else(super::gate::home, Path::to_path_buf);
        let (taken, stale) = {
            let mut pool = lock(&self.inner.pool);
            let spares = pool.providers.entry(provider.name.clone()).or_default();
            let mut stale = Self::follow_caps(spares, caps);
            if let Some(cwd) = cwd {
                spares.cwd = Some(cwd.to_path_buf());
            }
            let start = spares.start_cwd().map(Path::to_path_buf);
            let placed =
                |s: &Spare| s.made.is_some() || start.as_deref().is_none_or(|c| s.cwd() == c);
            let (keep, old): (Vec<Spare>, Vec<Spare>) = std::mem::take(&mut spares.ready)
                .into_iter()
                .partition(|s| s.fresh(provider.warm_max_age) && (cwd.is_none() || placed(s)));
            spares.ready = keep;
            stale.extend(old);
            let plain = spares
                .ready
                .iter()
                .rposition(|s| s.made.is_none() && s.cwd() == want);
            (plain.map(|i| spares.ready.remove(i).ready), stale)
        };
        for s in stale {
            s.discard().await;
        }
        self.fill(provider.clone());
        taken
    }

    /// For a bridge `session/new` in `cwd` with `params` (as the agent will get them): a
    /// spare's session made for exactly that, if one is ready. Either way the pool follows
    /// this session: spares holding another's are recycled, and the next ones make this one.
    pub(super) async fn take_made(
        &self,
        provider: &Arc<ProviderConfig>,
        caps: &ClientCaps,
        cwd: &Path,
        params: &serde_json::Value,
    ) -> Option<Handover> {
        if provider.warm == 0 {
            return None;
        }
        let key = session_key(params);
        let (taken, stale) = {
            let mut pool = lock(&self.inner.pool);
            let spares = pool.providers.entry(provider.name.clone()).or_default();
            let mut stale = Self::follow_caps(spares, caps);
            let max_age = provider.warm_max_age;
            let (keep, old): (Vec<Spare>, Vec<Spare>) = std::mem::take(&mut spares.ready)
                .into_iter()
                .partition(|s| s.fresh(max_age) && s.made.as_ref().is_none_or(|m| m.key == key));
            spares.ready = keep;
            stale.extend(old);
            spares.target = Some(Target {
                cwd: cwd.to_path_buf(),
                key: key.clone(),
                params: params.clone(),
            });
            spares.cwd = Some(cwd.to_path_buf());
            let made = spares
                .ready
                .iter()
                .rposition(|s| s.made.is_some() && s.cwd() == cwd);
            (made.map(|i| spares.ready.remove(i)), stale)
        };
        for s in stale {
            s.discard().await;
        }
        self.fill(provider.clone());
        let Spare { ready, made } = taken?;
        let made = made?;
        tracing::debug!(provider = %provider.name, "session/new: a warm spare's session handed over");
        Some(Handover {
            ready,
            session_id: made.session_id,
            reply: made.reply,
        })
    }

    /// Before any session (`acpd stdio`, whose editor started it in its project): spares make
    /// one ahead for the likeliest first `session/new` — in `cwd`, with no MCP servers of the
    /// editor's own. A guess that misses costs a cold start, and the pool follows the miss.
    pub fn expect_session(&self, cwd: &Path) {
        let config = self.config();
        let depth = self.bridge_depth();
        let mut pool = lock(&self.inner.pool);
        for provider in config.providers.values().filter(|p| p.warm > 0) {
            let mut params = serde_json::json!({ "cwd": cwd, "mcpServers": [] });
            self.offer_in(&mut params, provider, depth);
            let spares = pool.providers.entry(provider.name.clone()).or_default();
            spares.target.get_or_insert_with(|| Target {
                cwd: cwd.to_path_buf(),
                key: session_key(&params),
                params,
            });
        }
    }

    /// The pool of `provider` stops making sessions ahead (an editor that authenticated:
    /// a session made before its `authenticate` is not one it may have).
    pub(super) fn plain_spares(&self, provider: &str) {
        let mut pool = lock(&self.inner.pool);
        if let Some(spares) = pool.providers.get_mut(provider) {
            spares.target = None;
        }
    }

    /// Spares per provider, for `acpd status`.
    pub fn spare_counts(&self) -> std::collections::BTreeMap<String, u64> {
        lock(&self.inner.pool)
            .providers
            .iter()
            .map(|(name, s)| (name.clone(), s.ready.len() as u64))
            .collect()
    }

    /// Recycles dead and old spares and tops every pool up.
    async fn tend(&self, stop: &CancellationToken) {
        let config = self.config();
        let mut stale = Vec::new();
        for provider in config.providers.values().filter(|p| p.warm > 0) {
            {
                let mut pool = lock(&self.inner.pool);
                let spares = pool.providers.entry(provider.name.clone()).or_default();
                let max_age = provider.warm_max_age;
                let (keep, old): (Vec<Spare>, Vec<Spare>) = std::mem::take(&mut spares.ready)
                    .into_iter()
                    .partition(|s| s.fresh(max_age));
                spares.ready = keep;
                stale.extend(old);
            }
            if !stop.is_cancelled() {
                self.fill(provider.clone());
            }
        }
        for s in stale {
            s.discard().await;
        }
    }

    /// Starts spares until `provider` has its `warm` (ready or starting).
    fn fill(&self, provider: Arc<ProviderConfig>) {
        let stop = match lock(&self.inner.warm_stop).clone() {
            Some(stop) if !stop.is_cancelled() => stop,
            _ => return,
        };
        let (missing, caps, target, cwd) = {
            let mut pool = lock(&self.inner.pool);
            let spares = pool.providers.entry(provider.name.clone()).or_default();
            let have = spares.ready.len() + spares.starting;
            let missing = provider.warm.saturating_sub(have);
            spares.starting += missing;
            let cwd = spares.start_cwd().map(Path::to_path_buf);
            (missing, spares.caps.clone(), spares.target.clone(), cwd)
        };
        let caps = caps.unwrap_or_default();
        for _ in 0..missing {
            let registry = self.clone();
            let provider = provider.clone();
            let caps = caps.clone();
            let stop = stop.clone();
            let target = target.clone();
            let cwd = cwd.clone();
            tokio::spawn(async move {
                let started = registry
                    .start_spare(&provider, &caps, target.as_ref(), cwd.as_deref(), &stop)
                    .await;
                let spare = {
                    let mut pool = lock(&registry.inner.pool);
                    let spares = pool.providers.entry(provider.name.clone()).or_default();
                    spares.starting = spares.starting.saturating_sub(1);
                    let same_target = |made: &Option<Made>| match (made, &spares.target) {
                        (None, _) => true,
                        (Some(m), Some(t)) => m.key == t.key,
                        (Some(_), None) => false,
                    };
                    match started {
                        Ok(spare)
                            if spares.caps.as_ref().is_none_or(|c| c.key() == caps.key())
                                && same_target(&spare.made)
                                && !stop.is_cancelled() =>
                        {
                            spares.caps.get_or_insert(caps);
                            spares.ready.push(spare);
                            None
                        }
                        Ok(spare) => Some(spare),
                        Err(e @ super::RegistryError::Capacity { .. }) => {
                            tracing::debug!(provider = %provider.name, "no room for a warm spare: {e}");
                            None
                        }
                        Err(e) if stop.is_cancelled() => {
                            tracing::debug!(provider = %provider.name, "a warm spare's start was stopped: {e}");
                            None
                        }
                        Err(e) => {
                            tracing::warn!(provider = %provider.name, "a warm spare failed to start: {e}");
                            // Not in that directory again (it may be gone): plain spares in
                            // the provider's default.
                            if let (Some(t), Some(now)) = (&target, &spares.target)
                                && t.key == now.key
                                && t.cwd == now.cwd
                            {
                                spares.target = None;
                            }
                            if cwd.is_some() && spares.cwd == cwd {
                                spares.cwd = None;
                            }
                            None
                        }
                    }
                };
                if let Some(unwanted) = spare {
                    unwanted.discard().await;
                }
            });
        }
    }

    /// One spare, started in `cwd` (else the provider's cwd or home) and holding `target`'s
    /// session when there is a target (a spare whose agent refuses that session stays,
    /// plain).
    async fn start_spare(
        &self,
        provider: &Arc<ProviderConfig>,
        caps: &ClientCaps,
        target: Option<&Target>,
        cwd: Option<&Path>,
        stop: &CancellationToken,
    ) -> Result<Spare, super::RegistryError> {
        // By name in the config of now: a provider a reload removed gets no more spares.
        let config = self.config();
        let current = self.provider(&config, Some(&provider.name))?;
        let mut ready = self
            .ready_cold(&config, current, cwd, caps.clone(), None, stop)
            .await?;
        let Some(target) = target else {
            return Ok(Spare { ready, made: None });
        };
        match ready
            .child
            .create("session/new", &target.params, stop)
            .await
        {
            Ok((session_id, reply)) => Ok(Spare {
                ready,
                made: Some(Made {
                    key: target.key.clone(),
                    session_id,
                    reply,
                }),
            }),
            Err(e)
                if ready.child.alive()
                    && matches!(e, crate::child::StartFailure::Refused { .. }) =>
            {
                tracing::debug!(provider = %provider.name, "a warm spare's session/new was refused; the spare stays plain: {e}");
                Ok(Spare { ready, made: None })
            }
            Err(e) => Err(super::gate::start_failed(provider, e)),
        }
    }

    /// Reaps every spare (acpd is stopping; call after cancelling `keep_warm`'s token).
    pub async fn drain_spares(&self) {
        let all: Vec<Spare> = lock(&self.inner.pool)
            .providers
            .values_mut()
            .flat_map(|s| std::mem::take(&mut s.ready))
            .collect();
        futures::future::join_all(all.into_iter().map(|s| s.discard())).await;
    }
}

/// `warm_max_age` on paused time: a spare whose agent is the driver tests' `Fake`, filed in
/// the pool the way `fill` files one.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use crate::child::ClientCaps;
    use crate::child::tests::{provider, spare};
    use crate::config::{Config, ProviderConfig};
    use crate::registry::{DepthContext, Ready, Registry, lock};

    /// A registry with `p` (warm = 1, warm_max_age = 60 s) and one ready spare of it; the
    /// handle resolves when the spare's wire is closed.
    async fn pooled() -> (
        Registry,
        Arc<ProviderConfig>,
        tokio::task::JoinHandle<impl Sized>,
    ) {
        let p = provider(|p| {
            p.warm = 1;
            p.warm_max_age = Duration::from_secs(60);
        });
        let (child, agent) = spare(p.clone()).await;
        let p = Arc::new(p);
        let mut config = Config::builtin(vec!["true".into()]);
        config.providers.insert(p.name.clone(), p.clone());
        let registry = Registry::new(config, DepthContext::default());
        let slot = registry
            .claim(&registry.config(), &p, &CancellationToken::new())
            .await
            .unwrap();
        {
            let mut pool = lock(&registry.inner.pool);
            let spares = pool.providers.entry(p.name.clone()).or_default();
            spares.caps = Some(ClientCaps::default());
            spares.ready.push(super::Spare {
                ready: Ready { child, slot },
                made: None,
            });
        }
        (registry, p, agent)
    }

    #[tokio::test]
    async fn the_pool_recycles_a_spare_once_it_reaches_warm_max_age() {
        let (registry, _, agent) = pooled().await;
        // No `keep_warm` token: tending recycles but starts no replacement.
        let stop = CancellationToken::new();
        tokio::time::sleep(Duration::from_secs(59)).await;
        registry.tend(&stop).await;
        assert_eq!(registry.spare_counts().get("fake"), Some(&1), "young: kept");
        assert_eq!(registry.live_children(), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        registry.tend(&stop).await;
        assert_eq!(
            registry.spare_counts().get("fake"),
            Some(&0),
            "old: recycled"
        );
        assert_eq!(registry.live_children(), 0, "its slot is released");
        tokio::time::timeout(Duration::from_secs(3600), agent)
            .await
            .expect("the spare's agent sees its input close")
            .unwrap();
    }

    #[tokio::test]
    async fn a_session_is_never_handed_a_spare_past_warm_max_age() {
        let (registry, p, agent) = pooled().await;
        let caps = ClientCaps::default();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let root = Some(std::path::Path::new("/"));
        assert!(
            registry.take_spare(&p, &caps, root).await.is_none(),
            "too old"
        );
        assert_eq!(registry.live_children(), 0, "recycled, its slot released");
        tokio::time::timeout(Duration::from_secs(3600), agent)
            .await
            .expect("the spare's agent sees its input close")
            .unwrap();
    }

    #[tokio::test]
    async fn a_spare_younger_than_warm_max_age_is_handed_out() {
        let (registry, p, _agent) = pooled().await;
        let caps = ClientCaps::default();
        tokio::time::sleep(Duration::from_secs(59)).await;
        let root = Some(std::path::Path::new("/"));
        let taken = registry
            .take_spare(&p, &caps, root)
            .await
            .expect("young enough");
        assert!(taken.child.alive());
        taken.close().await;
    }

    /// Issue 30: a child for a session in one directory is never a spare started in another
    /// (gemini-cli finds a session by its process's cwd), and the pool moves to the session's
    /// directory, recycling the spare that is elsewhere.
    #[tokio::test]
    async fn a_session_elsewhere_is_never_handed_a_spare_started_in_another_directory() {
        let (registry, p, agent) = pooled().await;
        let caps = ClientCaps::default();
        let elsewhere = tempfile::tempdir().unwrap();
        assert!(
            registry
                .take_spare(&p, &caps, Some(elsewhere.path()))
                .await
                .is_none(),
            "the spare runs in /, the session in {:?}",
            elsewhere.path()
        );
        assert_eq!(registry.spare_counts().get("fake"), Some(&0), "recycled");
        assert_eq!(registry.live_children(), 0, "its slot is released");
        tokio::time::timeout(Duration::from_secs(3600), agent)
            .await
            .expect("the spare's agent sees its input close")
            .unwrap();
    }

    /// A question that names no directory takes a spare only where a new child would start:
    /// the provider's cwd here.
    #[tokio::test]
    async fn a_question_without_a_cwd_takes_a_spare_in_the_providers_cwd() {
        let (registry, p, _agent) = pooled().await;
        let caps = ClientCaps::default();
        let mut elsewhere = (*p).clone();
        elsewhere.cwd = Some(std::env::temp_dir());
        let elsewhere = Arc::new(elsewhere);
        assert!(registry.take_spare(&elsewhere, &caps, None).await.is_none());
        assert_eq!(registry.spare_counts().get("fake"), Some(&1), "kept");
        let mut rooted = (*p).clone();
        rooted.cwd = Some("/".into());
        let taken = registry
            .take_spare(&Arc::new(rooted), &caps, None)
            .await
            .expect("the spare runs in the provider's cwd");
        taken.close().await;
    }
}
