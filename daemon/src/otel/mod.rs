//! OpenTelemetry spans of acpd's own work (a run, a bridge session, a child's start, its
//! teardown, each hop of a traced message), exported over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set.
//!
//! Off, nothing here exists: [`exporting`] is `None`, and every caller's traced path sits
//! behind that one branch (no span object, no allocation, `_meta` passed as it came). In
//! particular acpd does not rewrite a parent's `traceparent` when it exports nothing: a span
//! id of acpd's own that no collector ever receives would leave the child's spans pointing at
//! a parent that does not exist, breaking the trace where passing it untouched keeps the
//! child a direct child of the editor's span.

mod context;
mod export;

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use export::Health;

/// How long acpd waits at exit for spans still queued to be sent.
const FLUSH: Duration = Duration::from_secs(3);

/// The exporter's default per-request timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`'s default).
const TIMEOUT: Duration = Duration::from_secs(10);

static OTEL: OnceLock<Option<Otel>> = OnceLock::new();

/// The exporter, when spans are exported.
pub(crate) struct Otel {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    health: Arc<Health>,
}

/// Why spans are not exported although the environment asks for it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OtelError {
    #[error(
        "{var}={value:?}: acpd exports spans over OTLP/HTTP as protobuf only; set it to http/protobuf (or unset it)"
    )]
    Protocol { var: &'static str, value: String },
    #[error("{var}={value:?}: {why}")]
    Timeout {
        var: &'static str,
        value: String,
        why: std::num::ParseIntError,
    },
    #[error("cannot export spans to {endpoint}: {why}")]
    Build { endpoint: String, why: String },
}

/// Reads the OTel environment once; from then on [`exporting`] answers. A command that serves
/// (`run`, `stdio`, `serve`, `mcp`) calls it first.
pub(crate) fn init() {
    OTEL.get_or_init(|| match configured() {
        None => None,
        Some(Ok(o)) => Some(o),
        Some(Err(e)) => {
            tracing::warn!("spans are not exported: {e}");
            None
        }
    });
}

/// The exporter, or `None`: spans are off, and so is everything a caller would do for them.
#[inline]
pub(crate) fn exporting() -> Option<&'static Otel> {
    OTEL.get().and_then(Option::as_ref)
}

/// Spans exported, spans dropped and texts cut ([`export::MAX_TEXT`]) so far: all 0 with
/// export off.
pub(crate) fn span_counts() -> (u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    exporting().map_or((0, 0, 0), |o| {
        (
            o.health.exported.load(Relaxed),
            o.health.dropped.load(Relaxed),
            o.health.cut.load(Relaxed),
        )
    })
}

/// Sends what is still queued (waiting at most [`FLUSH`]) and says how many spans were lost.
pub(crate) async fn shutdown() {
    let Some(o) = exporting() else {
        return;
    };
    let provider = o.provider.clone();
    let _ = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH)).await;
    let dropped = o.health.dropped.load(std::sync::atomic::Ordering::Relaxed);
    if dropped > 0 {
        tracing::warn!(endpoint = %o.health.endpoint,
            "{dropped} spans were not exported to {}", o.health.endpoint);
    }
}

fn env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// The exporter the environment asks for: `None` without an endpoint (or with
/// `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`).
fn configured() -> Option<Result<Otel, OtelError>> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return None;
    }
    // The signal's own endpoint is used as it is; the general one gets the traces path.
    let endpoint = match env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        Some(e) => e,
        None => {
            let base = env("OTEL_EXPORTER_OTLP_ENDPOINT")?;
            format!("{}/v1/traces", base.trim_end_matches('/'))
        }
    };
    Some(build(endpoint))
}

fn first_of(vars: [&'static str; 2]) -> Option<(&'static str, String)> {
    vars.into_iter()
        .find_map(|v| env(v).map(|value| (v, value)))
}

fn build(endpoint: String) -> Result<Otel, OtelError> {
    let protocol = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ];
    if let Some((var, value)) = first_of(protocol).filter(|(_, v)| v != "http/protobuf") {
        return Err(OtelError::Protocol { var, value });
    }
    let timeout = match first_of([
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]) {
        None => TIMEOUT,
        Some((var, value)) => match value.trim().parse::<u64>() {
            Ok(ms) => Duration::from_millis(ms),
            Err(why) => return Err(OtelError::Timeout { var, value, why }),
        },
    };
    let health = Health::new(endpoint.clone());
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(export::Ureq::new(timeout, health.clone()))
        .with_endpoint(endpoint.clone())
        .with_protocol(Protocol::HttpBinary)
        .with_timeout(timeout)
        .build()
        .map_err(|e| OtelError::Build {
            endpoint: endpoint.clone(),
            why: e.to_string(),
        })?;
    let exporter = export::Counted {
        inner: exporter,
        health: health.clone(),
    };
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(2 * export::MAX_QUEUED)
        .build();
    let processor = export::Bounded {
        inner: BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build(),
        health: health.clone(),
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("acpd");
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource.build())
        .build();
    use opentelemetry::trace::TracerProvider as _;
    let tracer = provider.tracer("acpd");
    Ok(Otel {
        provider,
        tracer,
        health,
    })
}

/// One of acpd's spans, live until [`Span::end`] (or dropped, which ends it too).
#[derive(Clone)]
pub(crate) struct Span {
    cx: Context,
}

impl Otel {
    /// A span continuing the trace context in `meta` (a parent's `_meta`), or starting a new
    /// trace when there is none or it is invalid.
    pub(crate) fn span(
        &self,
        name: &'static str,
        meta: Option<&Map<String, Value>>,
        attributes: Vec<KeyValue>,
    ) -> Span {
        self.start(
            Cow::Borrowed(name),
            SpanKind::Internal,
            &context::parent(meta),
            attributes,
        )
    }

    fn start(
        &self,
        name: Cow<'static, str>,
        kind: SpanKind,
        parent: &Context,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        Span {
            cx: Context::new().with_span(span),
        }
    }

    /// acpd's hop of a parent's message to a child: when its params carry
    /// `_meta.traceparent`, a span for the hop (a child of the parent's span, or a new trace's
    /// root when that `traceparent` is invalid) and the params with the hop in its place.
    /// Params without one are not touched; in those with one only the two keys change (every
    /// other value is kept as raw text, numbers beyond `f64` included).
    pub(crate) fn hop(
        &self,
        method: &str,
        params: &RawValue,
        attributes: Vec<KeyValue>,
    ) -> Option<(Box<RawValue>, Span)> {
        type RawMap = std::collections::BTreeMap<String, Box<RawValue>>;
        memchr::memmem::find(params.get().as_bytes(), b"\"traceparent\"")?;
        let mut top: RawMap = serde_json::from_str(params.get()).ok()?;
        let mut meta: RawMap = serde_json::from_str(top.get("_meta")?.get()).ok()?;
        if !meta.contains_key(context::TRACEPARENT) {
            return None;
        }
        let trace: Map<String, Value> = [context::TRACEPARENT, context::TRACESTATE]
            .into_iter()
            .filter_map(|k| {
                Some((
                    k.to_string(),
                    serde_json::from_str(meta.get(k)?.get()).ok()?,
                ))
            })
            .collect();
        // Cut here already, not only when the span ends: a call's span lives until the agent
        // answers, and the method is the editor's to make as long as a line.
        let cut = export::cut(method);
        if cut.len() < method.len() {
            // The span's name and its `rpc.method`.
            self.health
                .cut
                .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        }
        let method = cut;
        let mut attributes = attributes;
        attributes.push(KeyValue::new("rpc.system", "jsonrpc"));
        attributes.push(KeyValue::new("rpc.method", method.to_string()));
        let span = self.start(
            Cow::Owned(method.to_string()),
            SpanKind::Client,
            &context::parent(Some(&trace)),
            attributes,
        );
        meta.remove(context::TRACESTATE);
        for (k, v) in span.meta() {
            meta.insert(k, serde_json::value::to_raw_value(&v).ok()?);
        }
        top.insert("_meta".into(), serde_json::value::to_raw_value(&meta).ok()?);
        let raw = serde_json::value::to_raw_value(&top).ok()?;
        Some((raw, span))
    }
}

impl Span {
    /// A span under this one.
    pub(crate) fn child(&self, name: &'static str, attributes: Vec<KeyValue>) -> Option<Span> {
        let o = exporting()?;
        Some(o.start(
            Cow::Borrowed(name),
            SpanKind::Internal,
            &self.cx,
            attributes,
        ))
    }

    /// Puts this span in `meta` as the `traceparent` the child gets.
    pub(crate) fn inject(&self, meta: &mut Map<String, Value>) {
        context::inject(&self.cx, meta);
    }

    /// `_meta` naming this span: what a child's `session/prompt` carries in a run.
    pub(crate) fn meta(&self) -> Map<String, Value> {
        let mut meta = Map::new();
        self.inject(&mut meta);
        meta
    }

    pub(crate) fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.cx.span().set_attribute(KeyValue::new(key, value));
    }

    /// Marks the span failed, saying why.
    pub(crate) fn fail(&self, why: impl Into<Cow<'static, str>>) {
        self.cx.span().set_status(Status::error(why));
    }

    pub(crate) fn end(self) {
        self.cx.span().end();
    }

    #[cfg(test)]
    fn ids(&self) -> (String, String) {
        let sc = self.cx.span().span_context().clone();
        (sc.trace_id().to_string(), sc.span_id().to_string())
    }
}

#[cfg(test)]
mod tests;
