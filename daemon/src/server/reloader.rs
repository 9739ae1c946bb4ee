//! Config reloads, coalesced: what SIGHUP and `_acpd/reload` (answered in
//! [`super::operator`]) both ask for. At most one read of the file runs and one waits, however
//! many ask.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::config::{Config, ConfigError};

/// What one read of the config came to, shared by every caller that waited for it.
pub(super) type Outcome = Result<Arc<Config>, Arc<ConfigError>>;

/// The blocking read-check-apply of the config (`acpd serve` builds it).
pub(super) type Load = Box<dyn Fn() -> Result<Arc<Config>, ConfigError> + Send + Sync>;

/// Reloads, coalesced: at most one read of the file running and one pending, whatever the
/// number of SIGHUPs and `_acpd/reload` calls.
///
/// A read can block (a hung mount): each one holds a blocking thread until it ends, so one
/// per request would fill tokio's blocking pool and stall everything else that needs it (the
/// session store). A request made while a read runs joins the pending one, which starts
/// when the running one ends, so it still sees the file as it is after the request (the
/// running read may have opened it before). Every caller of one read gets its outcome.
pub(crate) struct Reloader {
    load: Load,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    running: bool,
    /// The next read's outcome, for the callers that came while one was running.
    pending: Option<watch::Sender<Option<Outcome>>>,
}

impl Reloader {
    pub(crate) fn new(load: Load) -> Arc<Reloader> {
        Arc::new(Reloader {
            load,
            queue: Mutex::default(),
        })
    }

    /// Asks for a read that starts after this call and waits for its outcome.
    pub(crate) async fn reload(self: &Arc<Self>) -> Outcome {
        let mut outcome = self.request();
        match outcome.wait_for(Option::is_some).await {
            Ok(done) => done.clone().unwrap_or_else(|| Err(Arc::new(vanished()))),
            Err(_) => Err(Arc::new(vanished())),
        }
    }

    /// Asks for a read that starts after this call, without waiting (SIGHUP: nobody to tell).
    pub(crate) fn request(self: &Arc<Self>) -> watch::Receiver<Option<Outcome>> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(next) = &queue.pending {
            return next.subscribe();
        }
        let (tx, rx) = watch::channel(None);
        if queue.running {
            queue.pending = Some(tx);
            return rx;
        }
        queue.running = true;
        drop(queue);
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.work(tx));
        rx
    }

    /// Runs reads one after the other while requests keep coming.
    fn work(&self, mut batch: watch::Sender<Option<Outcome>>) {
        let _unwinding = Unwinding(self);
        loop {
            let outcome = (self.load)().map_err(Arc::new);
            batch.send_replace(Some(outcome));
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            match queue.pending.take() {
                Some(next) => batch = next,
                None => {
                    queue.running = false;
                    return;
                }
            }
        }
    }
}

/// Should a read panic, the next request starts a fresh one instead of waiting forever
/// behind a worker that is gone (the pending callers see their channel close).
struct Unwinding<'a>(&'a Reloader);

impl Drop for Unwinding<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut queue = self.0.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.running = false;
            queue.pending = None;
        }
    }
}

/// The read ended without an outcome (its task was lost, e.g. at shutdown).
fn vanished() -> ConfigError {
    ConfigError::Read {
        path: "(config)".into(),
        source: std::io::Error::other("the reload ended without an outcome; try again"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A read that blocks until the gate opens, counting reads and the most at once.
    struct Blocking {
        open: Mutex<bool>,
        opened: Condvar,
        calls: AtomicUsize,
        now: AtomicUsize,
        most: AtomicUsize,
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_reloads_behind_a_blocked_read_is_one_running_and_one_pending() {
        let gate = Arc::new(Blocking {
            open: Mutex::new(false),
            opened: Condvar::new(),
            calls: AtomicUsize::new(0),
            now: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let g = gate.clone();
        let reloader = Reloader::new(Box::new(move || {
            g.calls.fetch_add(1, Ordering::SeqCst);
            let n = g.now.fetch_add(1, Ordering::SeqCst) + 1;
            g.most.fetch_max(n, Ordering::SeqCst);
            let mut open = g.open.lock().unwrap();
            while !*open {
                open = g.opened.wait(open).unwrap();
            }
            g.now.fetch_sub(1, Ordering::SeqCst);
            Ok(Arc::new(Config::builtin(Vec::new())))
        }));
        let first = tokio::spawn({
            let r = reloader.clone();
            async move { r.reload().await }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while gate.calls.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the first read never started"
            );
            tokio::task::yield_now().await;
        }
        // Asked now (not in tasks that may run after the gate opens).
        let waiters: Vec<_> = (0..50).map(|_| reloader.request()).collect();
        for _ in 0..600 {
            drop(reloader.request());
        }
        assert_eq!(
            gate.calls.load(Ordering::SeqCst),
            1,
            "reads while one blocks"
        );
        *gate.open.lock().unwrap() = true;
        gate.opened.notify_all();
        assert!(first.await.unwrap().is_ok());
        for mut w in waiters {
            let outcome = w.wait_for(Option::is_some).await.unwrap().clone();
            assert!(outcome.unwrap().is_ok());
        }
        assert_eq!(
            gate.calls.load(Ordering::SeqCst),
            2,
            "the flood is one more read"
        );
        assert_eq!(gate.most.load(Ordering::SeqCst), 1);
        // Idle again: the next request is a fresh read.
        assert!(reloader.reload().await.is_ok());
        assert_eq!(gate.calls.load(Ordering::SeqCst), 3);
    }
}
