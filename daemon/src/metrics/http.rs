//! `metrics_listen`: `GET /metrics` over HTTP/1.1 (hyper), and 404 for anything else.
//!
//! A scraper is a stranger on a TCP port, so every resource it can hold is bounded: at most
//! [`MAX_CONNECTIONS`] at once (past them a connection is closed unanswered), a request head
//! of at most [`MAX_REQUEST`] bytes that must arrive within [`HEAD_TIMEOUT`], and a connection
//! that lives at most [`MAX_AGE`] (then it finishes what it is answering, for at most
//! [`CLOSE_GRACE`], and is closed: a scraper that stops reading its answer is dropped). The
//! accept loop never waits on a connection, so none of this can stall it, and nothing here
//! touches the daemon's ACP socket or its children. However fast scrapers ask, the text is
//! rendered (the registry's tables read) at most once per [`FRESH`]: a flood of requests costs
//! copies of the same bytes, not the daemon's locks.

use std::convert::Infallible;
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
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Scrapers served at once; Prometheus keeps one connection per target.
pub(crate) const MAX_CONNECTIONS: usize = 16;
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
    let room = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let cache = Arc::new(Cache {
        render,
        last: std::sync::Mutex::new(None),
    });
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("metrics_listen: accept failed: {e}");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(permit) = room.clone().try_acquire_owned() else {
            tracing::debug!(
                "metrics_listen: {MAX_CONNECTIONS} scrapers connected; closing one more"
            );
            continue;
        };
        let cache = cache.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _permit = permit;
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
                () = tokio::time::sleep(MAX_AGE) => {}
                () = stop.cancelled() => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
        });
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
