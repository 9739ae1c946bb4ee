//! `metrics_listen`: `GET /metrics` over HTTP/1.1 (hyper), and 404 for anything else.
//!
//! A scraper is a stranger on a TCP port, so every resource it can hold is bounded: at most
//! [`MAX_CONNECTIONS`] at once and [`MAX_PER_PEER`] from one address, a request head of at most
//! [`MAX_REQUEST`] bytes that must arrive within [`HEAD_TIMEOUT`], and a connection that lives
//! at most [`MAX_AGE`] (then it finishes what it is answering, for at most [`CLOSE_GRACE`], and
//! is closed: a scraper that stops reading its answer is dropped). A connection past a bound
//! is let in and the oldest one it competes with is closed: the oldest of its own address when
//! that address has [`MAX_PER_PEER`], else the oldest of all. So connections held open and
//! silent cost their holder (renewing them closes its own first), never the scraper that comes
//! next: a scraper sends its request as it connects and is answered long before [`MAX_PER_PEER`]
//! newer connections from one address, or [`MAX_CONNECTIONS`] from all, push it out. The
//! accept loop never waits on a connection, so none of this can stall it, and nothing here
//! touches the daemon's ACP socket or its children. However fast scrapers ask, the text is
//! rendered (the registry's tables read) at most once per [`FRESH`]: a flood of requests costs
//! copies of the same bytes, not the daemon's locks.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Scrapers served at once; Prometheus keeps one connection per target.
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// Connections from one IP address at once: a Prometheus pair, a curl and a spare.
pub(crate) const MAX_PER_PEER: usize = 4;
/// The request line and headers, at most (hyper's smallest allowed buffer).
pub(crate) const MAX_REQUEST: usize = 8 * 1024;
/// How long a request head may take to arrive, the first and every next one.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one connection is kept, however well it behaves.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(120);
/// How long a connection past its age may take to finish the answer it is writing.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(10);
/// How long one rendering answers every scrape.
pub(crate) const FRESH: Duration = Duration::from_millis(250);
/// A pause after a failed accept (EMFILE keeps the backlog readable: no spinning).
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What a scrape answers: the exposition text, rendered anew each time.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `listener` until `stop`.
pub(crate) async fn serve(listener: TcpListener, render: Render, stop: CancellationToken) {
    let slots = Arc::new(Slots::default());
    let cache = Arc::new(Cache {
        render,
        last: std::sync::Mutex::new(None),
    });
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("metrics_listen: accept failed: {e}");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let slot = slots.take(holder(peer.ip()));
        let cache = cache.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let evicted = slot.evict.clone();
            let service = service_fn(move |req| {
                let answer = respond(&req, &cache);
                async move { Ok::<_, Infallible>(answer) }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_REQUEST);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                // A newer connection took its place: closed at once.
                () = evicted.cancelled() => return,
                () = tokio::time::sleep(MAX_AGE) => {}
                () = stop.cancelled() => {}
            }
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                _ = tokio::time::timeout(CLOSE_GRACE, conn) => {}
                () = evicted.cancelled() => {}
            }
            drop(slot);
        });
    }
}

/// Whose a connection is, for [`MAX_PER_PEER`]: its IPv4 address (an IPv4-mapped IPv6 one
/// read as such), or its IPv6 address's /64, the block one host is commonly given.
fn holder(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// The connections being served, oldest first.
#[derive(Default)]
struct Slots {
    table: std::sync::Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    held: std::collections::VecDeque<Held>,
}

struct Held {
    id: u64,
    peer: IpAddr,
    evict: CancellationToken,
}

/// One connection's place in [`Slots`], given up when dropped.
struct Slot {
    id: u64,
    slots: Arc<Slots>,
    evict: CancellationToken,
}

impl Slots {
    /// A place for a connection from `peer`, made by closing the oldest connection of `peer`
    /// when it holds [`MAX_PER_PEER`], else the oldest of all when [`MAX_CONNECTIONS`] are held.
    fn take(self: &Arc<Self>, peer: IpAddr) -> Slot {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let own = t.held.iter().filter(|h| h.peer == peer).count();
        let oldest = if own >= MAX_PER_PEER {
            t.held.iter().position(|h| h.peer == peer)
        } else if t.held.len() >= MAX_CONNECTIONS {
            Some(0)
        } else {
            None
        };
        if let Some(old) = oldest.and_then(|at| t.held.remove(at)) {
            tracing::debug!(%peer, "metrics_listen: connections full; closing the oldest ({})", old.peer);
            old.evict.cancel();
        }
        let (id, evict) = (t.next, CancellationToken::new());
        t.next += 1;
        t.held.push_back(Held {
            id,
            peer,
            evict: evict.clone(),
        });
        Slot {
            id,
            slots: self.clone(),
            evict,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut t = self.slots.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = t.held.iter().position(|h| h.id == self.id) {
            t.held.remove(at);
        }
    }
}

/// The last rendering, and when it was made.
struct Cache {
    render: Render,
    last: std::sync::Mutex<Option<(Instant, Bytes)>>,
}

impl Cache {
    fn text(&self) -> Bytes {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, text)) = last.as_ref()
            && at.elapsed() < FRESH
        {
            return text.clone();
        }
        let text = Bytes::from((self.render)());
        *last = Some((Instant::now(), text.clone()));
        text
    }
}

/// `GET /metrics` (any query string) is the exposition; everything else is 404.
fn respond(req: &Request<Incoming>, cache: &Cache) -> Response<Full<Bytes>> {
    if req.method() == Method::GET && req.uri().path() == "/metrics" {
        let mut answer = Response::new(Full::new(cache.text()));
        answer
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(super::CONTENT_TYPE));
        return answer;
    }
    let mut answer = Response::new(Full::new(Bytes::from_static(
        b"not found: acpd serves only GET /metrics here\n",
    )));
    *answer.status_mut() = StatusCode::NOT_FOUND;
    answer
}
