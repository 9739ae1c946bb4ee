//! What acpd counts for its operator, exposed in Prometheus text format (`metrics_listen`,
//! `_acpd/metrics`, `acpd status --metrics`).
//!
//! One process-wide handle ([`get`]): the counters and histograms are recorded where the
//! events already happen, each by a one-line call; the hot path's (messages forwarded) is one
//! relaxed atomic add per counter, on counters resolved once at start. What is a level rather
//! than an event (live children, sessions, spares) is not tracked here at all: whoever renders
//! reads it from the registry at scrape time ([`Gauges`]), so it can never drift.
//!
//! A family whose labels name a provider has no series until its first event; the others
//! (by kind, direction, limit, step) are all there, at 0, from the start.
//!
//! Every label value is bounded: fixed words of this module, or provider names from the
//! config (a child's own words, such as a reported failure category, never become a label).

pub(crate) mod http;

use std::sync::LazyLock;
use std::time::Duration;

use acpd_protocol::outcome::Mapped;
use acpd_protocol::subagent::{Category, StopReason, SubagentResult};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of what [`render`] writes.
pub(crate) const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Labels whose values are fixed words.
type Fixed<const N: usize> = [(&'static str, &'static str); N];
/// One provider (a config name) and fixed words.
type Named = Vec<(&'static str, String)>;

/// Which way a bridge session's message went.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Direction {
    ParentToChild,
    ChildToParent,
}

/// Where a connection to acpd comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ConnKind {
    /// `acpd stdio`'s one parent.
    Stdio,
    /// An editor, a parent agent or the CLI on the socket, from outside every child's tree.
    Parent,
    /// From inside one of acpd's children (its `acpd mcp`, delegating in turn).
    Child,
}

/// A rung of the teardown ladder (`supervise/tree.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    /// stdin closed: every teardown starts here.
    Eof,
    Term,
    Kill,
    /// The child's cgroup killed and removed (cgroup containment).
    CgroupKill,
}

/// A configured limit that refused or cut something.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Limit {
    MaxChildren,
    MaxConcurrent,
    QueueTimeout,
    MaxDepth,
    MaxConnections,
    MaxConnectionsPerChild,
    MaxSessionsPerConnection,
    MaxPendingRequests,
    MaxOutput,
    MaxLine,
    MemoryMax,
    PidsMax,
    Budget,
    SessionQueue,
    UnfinishedMessageBudget,
}

impl Limit {
    const ALL: [Limit; 15] = [
        Limit::MaxChildren,
        Limit::MaxConcurrent,
        Limit::QueueTimeout,
        Limit::MaxDepth,
        Limit::MaxConnections,
        Limit::MaxConnectionsPerChild,
        Limit::MaxSessionsPerConnection,
        Limit::MaxPendingRequests,
        Limit::MaxOutput,
        Limit::MaxLine,
        Limit::MemoryMax,
        Limit::PidsMax,
        Limit::Budget,
        Limit::SessionQueue,
        Limit::UnfinishedMessageBudget,
    ];

    /// The config key's name (or the fixed limit's, as the docs name it).
    const fn name(self) -> &'static str {
        match self {
            Limit::MaxChildren => "max_children",
            Limit::MaxConcurrent => "max_concurrent",
            Limit::QueueTimeout => "queue_timeout",
            Limit::MaxDepth => "max_depth",
            Limit::MaxConnections => "max_connections",
            Limit::MaxConnectionsPerChild => "max_connections_per_child",
            Limit::MaxSessionsPerConnection => "max_sessions_per_connection",
            Limit::MaxPendingRequests => "max_pending_requests",
            Limit::MaxOutput => "max_output",
            Limit::MaxLine => "max_line",
            Limit::MemoryMax => "memory_max",
            Limit::PidsMax => "pids_max",
            Limit::Budget => "budget",
            // Not a key: a bridge session's fixed queue toward its agent (`child::QUEUE_BYTES`).
            Limit::SessionQueue => "session_queue",
            // Not a key: the process-wide `wire::half::BUDGET`.
            Limit::UnfinishedMessageBudget => crate::wire::half::LIMIT_NAME,
        }
    }

    /// A `max_connections` or `max_connections_per_child` refusal, by its key.
    pub(crate) fn of_connection(key: &str) -> Limit {
        if key == "max_connections_per_child" {
            Limit::MaxConnectionsPerChild
        } else {
            Limit::MaxConnections
        }
    }
}

impl ConnKind {
    const ALL: [ConnKind; 3] = [ConnKind::Stdio, ConnKind::Parent, ConnKind::Child];
    const fn name(self) -> &'static str {
        match self {
            ConnKind::Stdio => "stdio",
            ConnKind::Parent => "parent",
            ConnKind::Child => "child",
        }
    }
}

/// The process-wide counters and histograms.
pub(crate) struct Metrics {
    registry: Registry,
    connections_total: [Counter; 3],
    connections_open: [Gauge; 3],
    turns_started: Family<Named, Counter>,
    turns_ended: Family<Named, Counter>,
    start_failures: Family<Named, Counter>,
    start_seconds: Family<Named, Histogram>,
    turn_seconds: Family<Named, Histogram>,
    messages: [Counter; 2],
    bytes: [Counter; 2],
    limits: [Counter; 15],
    steps: [Counter; 4],
    network_refused: Family<Fixed<1>, Counter>,
}

/// Why the network face refused or ended a request or connection (`network_refused`'s
/// `reason`): the rule or limit's name, every one listed here so each series exists from the
/// start.
pub(crate) const NETWORK_REFUSALS: &[&str] = &[
    "unauthenticated",
    "token_unknown",
    "token_revoked",
    "token_expired",
    "credentials_in_url",
    "credentials_in_cookie",
    "credentials_in_subprotocol",
    "origin",
    "max_network_connections",
    "max_connections_per_token",
    "requests_per_second",
    "max_line",
    "line_timeout",
    "unfinished_message_budget",
    "http_header_timeout",
    "http_idle_timeout",
    "tls_handshake",
    "binary_frame",
    "client_not_reading",
    "unread_streams",
    "bad_request",
];

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The handle every recording point uses.
pub(crate) fn get() -> &'static Metrics {
    &METRICS
}

/// A child's start, from the spawn to its session (or its `initialize`, for a spare): 10 ms
/// to about 20 min.
fn start_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 17))
}

/// A turn: 100 ms to about 1.8 h.
fn turn_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 17))
}

/// Resolves one member of a fixed-label family now, so recording it later takes no lock.
fn member<const N: usize, M>(family: &Family<Fixed<N>, M>, labels: Fixed<N>) -> M
where
    M: prometheus_client::metrics::TypedMetric + Clone + Default + Send + Sync + 'static,
{
    family.get_or_create(&labels).clone()
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("acpd");
        let conn_total = Family::<Fixed<1>, Counter>::default();
        let conn_open = Family::<Fixed<1>, Gauge>::default();
        let kinds = ConnKind::ALL.map(|k| [("kind", k.name())]);
        let connections_total = kinds.map(|l| member(&conn_total, l));
        let connections_open = kinds.map(|l| member(&conn_open, l));
        registry.register(
            "connections",
            "Connections accepted (or opened, acpd stdio's one), by kind: parent, child, stdio",
            conn_total,
        );
        registry.register(
            "connections_open",
            "Connections being served now, by kind",
            conn_open,
        );

        let turns_started = Family::<Named, Counter>::default();
        let turns_ended = Family::<Named, Counter>::default();
        let start_failures = Family::<Named, Counter>::default();
        registry.register(
            "runs_started",
            "Turns of delegated runs started (a run's first turn and each follow-up), by provider",
            turns_started.clone(),
        );
        registry.register(
            "runs_ended",
            "Turns of delegated runs ended, by provider, stop_reason and failure category \
             (none when it completed)",
            turns_ended.clone(),
        );
        registry.register(
            "child_start_failures",
            "Children that failed to start (runs, bridge sessions, spares), by provider and \
             category",
            start_failures.clone(),
        );
        let start_seconds = Family::<Named, Histogram>::new_with_constructor(start_histogram as _);
        let turn_seconds = Family::<Named, Histogram>::new_with_constructor(turn_histogram as _);
        registry.register_with_unit(
            "child_start",
            "How long a child took from its spawn to its session (a spare: to initialize), by \
             provider",
            Unit::Seconds,
            start_seconds.clone(),
        );
        registry.register_with_unit(
            "turn",
            "How long a turn took, by provider, kind (run: a delegated run's turn, to its \
             result; bridge: an editor's session/prompt, from its forwarding to the agent to its \
             answer to the editor), stop_reason and category as acpd_runs_ended_total has them",
            Unit::Seconds,
            turn_seconds.clone(),
        );

        let messages = Family::<Fixed<1>, Counter>::default();
        let bytes = Family::<Fixed<1>, Counter>::default();
        let dirs = [
            [("direction", "parent_to_child")],
            [("direction", "child_to_parent")],
        ];
        let (m, b) = (
            dirs.map(|l| member(&messages, l)),
            dirs.map(|l| member(&bytes, l)),
        );
        registry.register(
            "forwarded_messages",
            "Messages a bridge session passed between its editor and its agent, by direction",
            messages,
        );
        registry.register_with_unit(
            "forwarded",
            "Bytes a bridge session passed between its editor and its agent, by direction: a \
             notification to the editor counted whole, other messages by their params or result",
            Unit::Bytes,
            bytes,
        );

        let limits = Family::<Fixed<1>, Counter>::default();
        let limit_counters = Limit::ALL.map(|l| member(&limits, [("limit", l.name())]));
        registry.register(
            "limit_hits",
            "Times a configured limit refused or cut something, by limit (its config key)",
            limits,
        );
        let steps = Family::<Fixed<1>, Counter>::default();
        let step_counters =
            ["eof", "term", "kill", "cgroup_kill"].map(|s| member(&steps, [("step", s)]));
        registry.register(
            "teardown_steps",
            "Rungs of the teardown ladder reached: eof (every teardown), term, kill, cgroup_kill",
            steps,
        );
        let network_refused = Family::<Fixed<1>, Counter>::default();
        for reason in NETWORK_REFUSALS {
            member(&network_refused, [("reason", reason)]);
        }
        registry.register(
            "network_refused",
            "Requests and connections the network face refused or ended, by reason: the rule \
             or limit's name (unauthenticated, token_revoked, max_connections_per_token, …)",
            network_refused.clone(),
        );
        Metrics {
            network_refused,
            registry,
            connections_total,
            connections_open,
            turns_started,
            turns_ended,
            start_failures,
            start_seconds,
            turn_seconds,
            messages: m,
            bytes: b,
            limits: limit_counters,
            steps: step_counters,
        }
    }

    /// One message forwarded by a bridge session: two relaxed atomic adds.
    #[inline]
    pub(crate) fn forwarded(&self, direction: Direction, bytes: usize) {
        let i = direction as usize;
        self.messages[i].inc();
        self.bytes[i].inc_by(bytes as u64);
    }

    /// Several messages forwarded at once: the same two adds for the lot.
    #[inline]
    pub(crate) fn forwarded_many(&self, direction: Direction, messages: usize, bytes: usize) {
        let i = direction as usize;
        self.messages[i].inc_by(messages as u64);
        self.bytes[i].inc_by(bytes as u64);
    }

    pub(crate) fn limit_hit(&self, limit: Limit) {
        self.limits[limit as usize].inc();
    }

    /// A refusal of the network face, by the name of its rule (one of [`NETWORK_REFUSALS`]).
    pub(crate) fn network_refused(&self, reason: &'static str) {
        debug_assert!(NETWORK_REFUSALS.contains(&reason), "{reason}");
        self.network_refused
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    pub(crate) fn teardown_step(&self, step: Step) {
        self.steps[step as usize].inc();
    }

    /// Counts a connection, open until the guard drops.
    pub(crate) fn connection(&'static self, kind: ConnKind) -> OpenConnection {
        let i = kind as usize;
        self.connections_total[i].inc();
        self.connections_open[i].inc();
        OpenConnection(&self.connections_open[i])
    }

    pub(crate) fn turn_started(&self, provider: &str) {
        self.turns_started
            .get_or_create(&vec![("provider", provider.to_owned())])
            .inc();
    }

    /// A run's turn ended with `result`, after `took`.
    pub(crate) fn turn_ended(&self, result: &SubagentResult, took: Duration) {
        let category = result
            .failure
            .as_ref()
            .map_or("none", |f| category_label(&f.category));
        let labels = vec![
            ("provider", result.provider.clone()),
            ("stop_reason", result.stop_reason.as_str().to_owned()),
            ("category", category.to_owned()),
        ];
        self.turns_ended.get_or_create(&labels).inc();
        self.observe_turn(&result.provider, "run", result.stop_reason, category, took);
    }

    /// An editor's `session/prompt` through a bridge session ended as `end`, `took` after
    /// acpd forwarded it. Called once per prompt, never per update.
    pub(crate) fn bridge_turn_ended(&self, provider: &str, end: &Mapped, took: Duration) {
        let category = end
            .failure
            .as_ref()
            .map_or("none", |f| category_label(&f.category));
        self.observe_turn(provider, "bridge", end.stop_reason, category, took);
    }

    fn observe_turn(
        &self,
        provider: &str,
        kind: &'static str,
        stop: StopReason,
        category: &str,
        took: Duration,
    ) {
        let labels = vec![
            ("provider", provider.to_owned()),
            ("kind", kind.to_owned()),
            ("stop_reason", stop.as_str().to_owned()),
            ("category", category.to_owned()),
        ];
        self.turn_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn child_started(&self, provider: &str, took: Duration) {
        self.start_seconds
            .get_or_create(&vec![("provider", provider.to_owned())])
            .observe(took.as_secs_f64());
    }

    pub(crate) fn start_failed(&self, provider: &str, category: &Category) {
        let labels = vec![
            ("provider", provider.to_owned()),
            ("category", category_label(category).to_owned()),
        ];
        self.start_failures.get_or_create(&labels).inc();
    }
}

/// A bridge session passed one message to its editor, of `bytes`.
#[inline]
pub(crate) fn to_parent(bytes: usize) {
    get().forwarded(Direction::ChildToParent, bytes);
}

/// A bridge session passed `messages` messages to its editor at once, of `bytes` in all.
#[inline]
pub(crate) fn to_parent_many(messages: usize, bytes: usize) {
    get().forwarded_many(Direction::ChildToParent, messages, bytes);
}

/// A bridge session passed one message to its agent, of `bytes`.
#[inline]
pub(crate) fn to_child(bytes: usize) {
    get().forwarded(Direction::ParentToChild, bytes);
}

/// The bytes of a message's params or result as the relay holds them; 0 when it has none.
pub(crate) fn size(payload: &impl Payload) -> usize {
    payload.payload_len()
}

/// What the relay passes on: params or a result (raw JSON), maybe absent, maybe an error.
pub(crate) trait Payload {
    fn payload_len(&self) -> usize;
}

impl Payload for Box<serde_json::value::RawValue> {
    fn payload_len(&self) -> usize {
        self.get().len()
    }
}

impl<T: Payload> Payload for Option<T> {
    fn payload_len(&self) -> usize {
        self.as_ref().map_or(0, Payload::payload_len)
    }
}

impl<T: Payload, E> Payload for Result<T, E> {
    fn payload_len(&self) -> usize {
        self.as_ref().map_or(0, Payload::payload_len)
    }
}

/// A failure category as a label: acpd's own words; a category the child named itself is
/// `reported`, whatever it said.
fn category_label(category: &Category) -> &str {
    match category {
        Category::Reported(_) => "reported",
        known => known.as_str(),
    }
}

/// A connection counted in `acpd_connections_open` while it lives.
pub(crate) struct OpenConnection(&'static Gauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What is read from the registry and the live sessions at scrape time.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    /// Live children: (provider, state, count); states: `running`, `idle`, `attached`,
    /// `detached`, `spare`, `starting`.
    pub children: Vec<(String, &'static str, u64)>,
    /// Bridge sessions by state: attached, detached.
    pub sessions_attached: u64,
    pub sessions_detached: u64,
    /// Ready spares by provider.
    pub spares: Vec<(String, u64)>,
    /// Starts waiting for a slot (`queue_timeout`).
    pub queued: u64,
    /// Spans the OTLP collector took, and spans lost (the export queue full, or an export
    /// that failed): counted by the exporter itself, read at scrape time; 0 with export off.
    pub spans_exported: u64,
    pub spans_dropped: u64,
    /// Span names, attribute values and status messages cut to `otel::MAX_TEXT` bytes.
    pub spans_cut: u64,
}

/// The whole exposition: the counters of this process, then `gauges`.
pub(crate) fn render(gauges: &Gauges) -> String {
    let mut now = Registry::with_prefix("acpd");
    let children = Family::<Named, Gauge>::default();
    for (provider, state, n) in &gauges.children {
        let labels = vec![
            ("provider", provider.clone()),
            ("state", (*state).to_owned()),
        ];
        children.get_or_create(&labels).set(gauge_value(*n));
    }
    now.register(
        "children",
        "Live children by provider and state: running (a run's turn), idle (a run between \
         turns), attached, detached (bridge sessions), spare, starting (handshakes, probes)",
        children,
    );
    let sessions = Family::<Fixed<1>, Gauge>::default();
    for (state, n) in [
        ("attached", gauges.sessions_attached),
        ("detached", gauges.sessions_detached),
    ] {
        sessions
            .get_or_create(&[("state", state)])
            .set(gauge_value(n));
    }
    now.register(
        "sessions",
        "Live bridge sessions: attached to an editor's connection, or detached and waiting to be \
         loaded again (detach_timeout)",
        sessions,
    );
    let spares = Family::<Named, Gauge>::default();
    for (provider, n) in &gauges.spares {
        spares
            .get_or_create(&vec![("provider", provider.clone())])
            .set(gauge_value(*n));
    }
    now.register("spares", "Warm spares ready, by provider", spares);
    let queued = Gauge::<i64>::default();
    queued.set(gauge_value(gauges.queued));
    now.register("queued_starts", "Starts waiting for a free slot", queued);
    // Always there, 0 with export off: an alert on drops needs no absent() guard, and a
    // series that appears only with OTEL_* set would break dashboards across restarts.
    for (name, help, n) in [
        (
            "otel_spans_exported",
            "Spans the OTLP collector accepted (0 while OTEL_EXPORTER_OTLP_ENDPOINT is unset)",
            gauges.spans_exported,
        ),
        (
            "otel_spans_dropped",
            "Spans never exported: the export queue was full, or the collector failed or \
             refused them",
            gauges.spans_dropped,
        ),
        (
            "otel_values_cut",
            "Span names, attribute values and status messages cut to their first 256 bytes \
             (an editor's method name, say)",
            gauges.spans_cut,
        ),
    ] {
        let counter = Counter::<u64>::default();
        counter.inc_by(n);
        now.register(name, help, counter);
    }

    let mut text = String::new();
    // Writing to a String cannot fail; an encoder error would be a bug of the crate, and the
    // scrape then gets what was written so far.
    let _ = prometheus_text::encode(&mut text, &get().registry);
    let _ = prometheus_text::encode(&mut text, &now);
    text
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
