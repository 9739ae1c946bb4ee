//! The export path: the SDK's batch processor (its own thread), behind a bound of acpd's own
//! that drops and counts, and the OTLP exporter posting through ureq. Nothing here runs on a
//! task that serves a connection: a span ended on the hot path is one `try_send`, and a
//! collector that is down, slow or refusing costs the export thread only.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use std::borrow::Cow;

use opentelemetry::trace::Status;
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor};

/// Spans waiting for export at most; more are dropped (and counted) until the export thread
/// has sent some. The SDK's own queue is larger, so it never drops behind acpd's back.
pub(super) const MAX_QUEUED: usize = 2048;

/// Bytes of spans waiting for export at most (names, attributes, status, `tracestate`, and
/// the span's own record), whatever a parent put in what became them: a stalled collector
/// costs acpd this much, not [`MAX_QUEUED`] times the largest span an editor can cause.
pub(super) const MAX_QUEUED_BYTES: usize = 4 * 1024 * 1024;

/// The longest span name, attribute value or status message kept, in bytes; a longer one is
/// cut at the last UTF-8 character boundary within it (and counted). A method name is the
/// editor's to choose and may be as long as a line.
pub(crate) const MAX_TEXT: usize = 256;

/// The largest collector answer read (its body is only an error's detail).
const MAX_ANSWER: u64 = 64 * 1024;

/// What the export path shares with whoever reports on it: spans queued, exported and
/// dropped, and whether the collector's failure has been logged.
#[derive(Debug)]
pub(super) struct Health {
    pub endpoint: String,
    queued: AtomicUsize,
    /// What the queued spans weigh ([`weight`]).
    queued_bytes: AtomicUsize,
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    pub dropped: AtomicU64,
    /// Span names, attribute values and status messages cut to [`MAX_TEXT`].
    pub cut: AtomicU64,
    /// Set while the collector fails: the first failure is logged, the rest are not.
    failing: AtomicBool,
    dropping: AtomicBool,
}

impl Health {
    pub(super) fn new(endpoint: String) -> Arc<Health> {
        Arc::new(Health {
            endpoint,
            queued: AtomicUsize::new(0),
            queued_bytes: AtomicUsize::new(0),
            exported: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            cut: AtomicU64::new(0),
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

    fn on_end(&self, mut span: SpanData) {
        let h = &self.health;
        let cut = cut_span(&mut span);
        if cut > 0 {
            h.cut.fetch_add(cut, Ordering::Relaxed);
        }
        let bytes = weight(&span);
        let over_count = h.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED;
        let over_bytes =
            h.queued_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_QUEUED_BYTES;
        if over_count || over_bytes {
            h.queued.fetch_sub(1, Ordering::Relaxed);
            h.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            h.dropped.fetch_add(1, Ordering::Relaxed);
            if !h.dropping.swap(true, Ordering::Relaxed) {
                tracing::warn!(endpoint = %h.endpoint,
                    "{MAX_QUEUED} spans or {} MiB wait for {}: dropping new ones until it takes them",
                    MAX_QUEUED_BYTES >> 20, h.endpoint);
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
        let bytes: usize = batch.iter().map(weight).sum();
        let result = self.inner.export(batch).await;
        let h = &self.health;
        for (held, gone) in [(&h.queued, n), (&h.queued_bytes, bytes)] {
            let _ = held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(gone))
            });
        }
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

/// `text` at most [`MAX_TEXT`] bytes long, cut at a character boundary.
pub(crate) fn cut(text: &str) -> &str {
    acpd_protocol::utf8::head(text, MAX_TEXT)
}

/// Cuts `text` in place when it is longer than [`MAX_TEXT`]; whether it did.
fn cut_owned(text: &mut Cow<'static, str>) -> bool {
    if text.len() <= MAX_TEXT {
        return false;
    }
    *text = Cow::Owned(cut(text).to_owned());
    true
}

fn cut_value(value: &mut Value) -> u64 {
    let cut_string = |s: &mut StringValue| {
        if s.as_str().len() <= MAX_TEXT {
            return 0;
        }
        *s = StringValue::from(cut(s.as_str()).to_owned());
        1
    };
    match value {
        Value::String(s) => cut_string(s),
        Value::Array(Array::String(list)) => list.iter_mut().map(cut_string).sum(),
        _ => 0,
    }
}

/// Cuts a span's name, its attribute values (its events' too) and its status message to
/// [`MAX_TEXT`]; how many it cut. Attribute keys are acpd's own constants.
fn cut_span(span: &mut SpanData) -> u64 {
    let mut n = u64::from(cut_owned(&mut span.name));
    n += span
        .attributes
        .iter_mut()
        .map(|kv| cut_value(&mut kv.value))
        .sum::<u64>();
    for event in span.events.events.iter_mut() {
        n += u64::from(cut_owned(&mut event.name));
        n += event
            .attributes
            .iter_mut()
            .map(|kv| cut_value(&mut kv.value))
            .sum::<u64>();
    }
    if let Status::Error { description } = &mut span.status {
        n += u64::from(cut_owned(description));
    }
    n
}

fn value_bytes(value: &Value) -> usize {
    match value {
        Value::String(s) => s.as_str().len(),
        Value::Array(Array::String(list)) => list.iter().map(|s| s.as_str().len()).sum(),
        Value::Array(Array::Bool(list)) => list.len(),
        Value::Array(Array::I64(list)) => 8 * list.len(),
        Value::Array(Array::F64(list)) => 8 * list.len(),
        _ => 0,
    }
}

/// What a queued span holds, near enough to bound memory: its record, and every text and
/// list hanging off it (the `tracestate` it carries included, up to 32 members of 512 bytes).
fn weight(span: &SpanData) -> usize {
    let attributes = |kvs: &[KeyValue]| -> usize {
        kvs.iter()
            .map(|kv| size_of::<KeyValue>() + kv.key.as_str().len() + value_bytes(&kv.value))
            .sum()
    };
    let status = match &span.status {
        Status::Error { description } => description.len(),
        _ => 0,
    };
    let state: usize = span
        .span_context
        .trace_state()
        .into_iter()
        .map(|(k, v)| 2 * size_of::<String>() + k.len() + v.len())
        .sum();
    let events: usize = span
        .events
        .iter()
        .map(|e| size_of_val(e) + e.name.len() + attributes(&e.attributes))
        .sum();
    let links: usize = span
        .links
        .iter()
        .map(|l| size_of_val(l) + attributes(&l.attributes))
        .sum();
    size_of::<SpanData>()
        + span.name.len()
        + attributes(&span.attributes)
        + status
        + state
        + events
        + links
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
