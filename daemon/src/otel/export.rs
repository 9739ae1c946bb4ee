//! The export path: the SDK's batch processor (its own thread), behind a bound of acpd's own
//! that drops and counts, and the OTLP exporter posting through ureq. Nothing here runs on a
//! task that serves a connection: a span ended on the hot path is one `try_send`, and a
//! collector that is down, slow or refusing costs the export thread only.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};

/// Spans waiting for export at most; more are dropped (and counted) until the export thread
/// has sent some. The SDK's own queue is larger, so it never drops behind acpd's back.
pub(super) const MAX_QUEUED: usize = 2048;

/// The largest collector answer read (its body is only an error's detail).
const MAX_ANSWER: u64 = 64 * 1024;

/// What the export path shares with whoever reports on it: spans queued, exported and
/// dropped, and whether the collector's failure has been logged.
#[derive(Debug)]
pub(super) struct Health {
    pub endpoint: String,
    queued: AtomicUsize,
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    /// Set while the collector fails: the first failure is logged, the rest are not.
    failing: AtomicBool,
    dropping: AtomicBool,
}

impl Health {
    pub(super) fn new(endpoint: String) -> Arc<Health> {
        Arc::new(Health {
            endpoint,
            queued: AtomicUsize::new(0),
            exported: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            dropping: AtomicBool::new(false),
        })
    }

    /// An export failed (the collector unreachable, refusing, or answering an error): one
    /// warning until an export succeeds again.
    fn failed(&self, why: &str) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(endpoint = %self.endpoint,
                "cannot export spans to {}: {why}; spans are dropped until it answers (turns are not affected)",
                self.endpoint);
        }
    }

    fn succeeded(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(endpoint = %self.endpoint, "exporting spans to {} again", self.endpoint);
        }
    }
}

/// The SDK's batch processor behind acpd's bound.
#[derive(Debug)]
pub(super) struct Bounded {
    pub inner: BatchSpanProcessor,
    pub health: Arc<Health>,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let h = &self.health;
        if h.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            h.queued.fetch_sub(1, Ordering::Relaxed);
            h.dropped.fetch_add(1, Ordering::Relaxed);
            if !h.dropping.swap(true, Ordering::Relaxed) {
                tracing::warn!(endpoint = %h.endpoint,
                    "{MAX_QUEUED} spans wait for {}: dropping new ones until it takes them", h.endpoint);
            }
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, counting what left the queue (sent or lost).
#[derive(Debug)]
pub(super) struct Counted<E> {
    pub inner: E,
    pub health: Arc<Health>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        let h = &self.health;
        let _ = h
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(n))
            });
        if result.is_err() {
            h.dropped.fetch_add(n as u64, Ordering::Relaxed);
        } else {
            h.exported.fetch_add(n as u64, Ordering::Relaxed);
            h.dropping.store(false, Ordering::Relaxed);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter's HTTP client: ureq (already acpd's for the ACP Registry, with its TLS), called
/// on the batch processor's own thread, where blocking is what the SDK expects.
pub(super) struct Ureq {
    agent: ureq::Agent,
    health: Arc<Health>,
}

impl fmt::Debug for Ureq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Ureq")
    }
}

impl Ureq {
    pub(super) fn new(timeout: Duration, health: Arc<Health>) -> Ureq {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("acpd/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ureq { agent, health }
    }

    fn post(&self, request: Request<Bytes>) -> Result<Response<Bytes>, String> {
        let request = request.map(|b| b.to_vec());
        let response = self.agent.run(request).map_err(|e| why(&e))?;
        let status = response.status();
        let (parts, mut body) = response.into_parts();
        let bytes = body
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()
            .unwrap_or_default();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            let text: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
            return Err(format!("it answered HTTP {status} {text}"));
        }
        Ok(Response::from_parts(parts, Bytes::from(bytes)))
    }
}

/// A transport failure in words, with the OS error where there is one.
fn why(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

#[async_trait::async_trait]
impl HttpClient for Ureq {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        match self.post(request) {
            Ok(r) => {
                self.health.succeeded();
                Ok(r)
            }
            Err(why) => {
                self.health.failed(&why);
                Err(why.into())
            }
        }
    }
}
