//! Metrics, as OpenTelemetry instruments exported over OTLP (see
//! `telemetry`). The instruments exist only while metrics export is on;
//! otherwise every function here returns after one atomic load.
//!
//! | instrument | kind | attributes |
//! |---|---|---|
//! | `http.server.request.duration` (s) | histogram | `http.request.method`, `http.route`, `http.response.status_code` |
//! | `phone.tool.calls` | counter | `tool`, `outcome` (ok, error), `error.kind` |
//! | `phone.tool.duration` (s) | histogram | `tool`, `outcome` |
//! | `phone.messages.sent` | counter | — (replayed idempotent sends are not counted) |
//! | `phone.messages.read` | counter | `mode` (read: marked read by a poll; lease: handed out under a lease) |
//! | `phone.webhook.attempts` | counter | `outcome` (delivered, retry, failed, gone) |
//! | `phone.webhook.queue` | gauge (observed) | — (deliveries waiting; updated every 10 s by each replica's worker) |
//! | `phone.webhook.oldest_age` (s) | gauge (observed) | — (how long the oldest waiting delivery has waited) |
//! | `phone.auth.failures` | counter | `reason` (unknown_token, name_mismatch, wrong_token_for_name), `claimed_name` (a name was claimed) |
//! | `db.client.operation.duration` (s) | histogram | `db.system.name`, `db.operation.name`, `db.collection.name`, `outcome` |
//! | `db.client.connection.wait_time` (s) | histogram | `db.client.connection.pool.name` |
//! | `db.client.connection.count` | up-down counter (observed) | `db.client.connection.state` (idle, used), pool name |
//! | `db.client.connection.max` | up-down counter (observed) | pool name |
//! | `db.client.connection.pending_requests` | up-down counter (observed) | pool name |
//! | `phone.inbox.waiters` | gauge (observed) | — (long polls waiting on this replica) |

use std::{
    sync::{
        Arc, Mutex, OnceLock, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter, ObservableGauge, ObservableUpDownCounter},
};

/// What reports the long polls waiting on this replica.
pub trait Waiters: Send + Sync {
    fn waiters(&self) -> usize;
}

const POOL_NAME: &str = "phone";

/// Seconds. Sub-millisecond statements to 25-second long polls.
const DURATION_BOUNDARIES: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

struct Instruments {
    http_duration: Histogram<f64>,
    tool_calls: Counter<u64>,
    tool_duration: Histogram<f64>,
    messages_sent: Counter<u64>,
    messages_read: Counter<u64>,
    auth_failures: Counter<u64>,
    webhook_attempts: Counter<u64>,
    db_duration: Histogram<f64>,
    pool_wait: Histogram<f64>,
    /// Kept alive: their callbacks report while they exist.
    #[allow(clippy::type_complexity)]
    _observed: (
        ObservableUpDownCounter<i64>,
        ObservableUpDownCounter<i64>,
        ObservableUpDownCounter<i64>,
        ObservableGauge<u64>,
        ObservableGauge<f64>,
        ObservableGauge<u64>,
    ),
}

static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

/// What the observed instruments read: every live `Phone` of this process
/// (one in production; tests may start several).
struct Source {
    pool: deadpool_postgres::WeakPool,
    waiters: Weak<dyn Waiters>,
}

static SOURCES: Mutex<Vec<Source>> = Mutex::new(Vec::new());

/// Whether metrics are being exported (instruments exist).
pub fn enabled() -> bool {
    INSTRUMENTS.get().is_some()
}

/// Creates the instruments on `meter`. Called once by `telemetry` when
/// metrics export is on.
pub(crate) fn install(meter: &Meter) {
    let histogram = |name: &'static str, description: &'static str| {
        meter
            .f64_histogram(name)
            .with_unit("s")
            .with_description(description)
            .with_boundaries(DURATION_BOUNDARIES.to_vec())
            .build()
    };
    let pool_attr = || KeyValue::new("db.client.connection.pool.name", POOL_NAME);
    let instruments = Instruments {
        http_duration: histogram(
            "http.server.request.duration",
            "Duration of HTTP server requests",
        ),
        tool_calls: meter
            .u64_counter("phone.tool.calls")
            .with_unit("{call}")
            .with_description("MCP tool calls, by tool and outcome")
            .build(),
        tool_duration: histogram("phone.tool.duration", "Duration of MCP tool calls"),
        messages_sent: meter
            .u64_counter("phone.messages.sent")
            .with_unit("{message}")
            .with_description("Messages sent (idempotent replays not counted)")
            .build(),
        messages_read: meter
            .u64_counter("phone.messages.read")
            .with_unit("{message}")
            .with_description(
                "Messages handed to their recipient by phone_inbox (mode read or lease)",
            )
            .build(),
        auth_failures: meter
            .u64_counter("phone.auth.failures")
            .with_unit("{attempt}")
            .with_description(
                "Failed authentications, by reason; a rise means someone guesses tokens",
            )
            .build(),
        webhook_attempts: meter
            .u64_counter("phone.webhook.attempts")
            .with_unit("{attempt}")
            .with_description("Webhook delivery attempts, by outcome")
            .build(),
        db_duration: histogram(
            "db.client.operation.duration",
            "Duration of database statements",
        ),
        pool_wait: histogram(
            "db.client.connection.wait_time",
            "Time a request waited for a pooled database connection",
        ),
        _observed: (
            meter
                .i64_observable_up_down_counter("db.client.connection.count")
                .with_unit("{connection}")
                .with_description("Open database connections, by state (idle, used)")
                .with_callback(move |observer| {
                    let (idle, used) = pool_totals(|s| {
                        let used = s.size.saturating_sub(s.available);
                        (s.available as i64, used as i64)
                    });
                    observer.observe(
                        idle,
                        &[
                            pool_attr(),
                            KeyValue::new("db.client.connection.state", "idle"),
                        ],
                    );
                    observer.observe(
                        used,
                        &[
                            pool_attr(),
                            KeyValue::new("db.client.connection.state", "used"),
                        ],
                    );
                })
                .build(),
            meter
                .i64_observable_up_down_counter("db.client.connection.max")
                .with_unit("{connection}")
                .with_description("The most connections the pool may open")
                .with_callback(move |observer| {
                    let (max, _) = pool_totals(|s| (s.max_size as i64, 0));
                    observer.observe(max, &[pool_attr()]);
                })
                .build(),
            meter
                .i64_observable_up_down_counter("db.client.connection.pending_requests")
                .with_unit("{request}")
                .with_description("Requests waiting for a pooled connection")
                .with_callback(move |observer| {
                    let (waiting, _) = pool_totals(|s| (s.waiting as i64, 0));
                    observer.observe(waiting, &[pool_attr()]);
                })
                .build(),
            meter
                .u64_observable_gauge("phone.webhook.queue")
                .with_unit("{delivery}")
                .with_description("Webhook deliveries waiting")
                .with_callback(|observer| {
                    observer.observe(WEBHOOK_QUEUE.load(Ordering::Relaxed), &[]);
                })
                .build(),
            meter
                .f64_observable_gauge("phone.webhook.oldest_age")
                .with_unit("s")
                .with_description("How long the oldest waiting webhook delivery has waited")
                .with_callback(|observer| {
                    observer.observe(f64::from_bits(WEBHOOK_OLDEST.load(Ordering::Relaxed)), &[]);
                })
                .build(),
            meter
                .u64_observable_gauge("phone.inbox.waiters")
                .with_unit("{waiter}")
                .with_description("phone_inbox long polls waiting for mail on this replica")
                .with_callback(|observer| {
                    let waiters = live_sources()
                        .iter()
                        .filter_map(|(_, waiters)| waiters.as_ref().map(|w| w.waiters() as u64))
                        .sum();
                    observer.observe(waiters, &[]);
                })
                .build(),
        ),
    };
    let _ = INSTRUMENTS.set(instruments);
}

type LiveSource = (Option<deadpool_postgres::Pool>, Option<Arc<dyn Waiters>>);

fn live_sources() -> Vec<LiveSource> {
    let mut sources = SOURCES.lock().expect("metrics sources lock");
    sources.retain(|s| s.pool.upgrade().is_some() || s.waiters.strong_count() > 0);
    sources
        .iter()
        .map(|s| (s.pool.upgrade(), s.waiters.upgrade()))
        .collect()
}

fn pool_totals(f: impl Fn(deadpool_postgres::Status) -> (i64, i64)) -> (i64, i64) {
    live_sources()
        .iter()
        .filter_map(|(pool, _)| pool.as_ref().map(|p| f(p.status())))
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// Observes a connection pool and its replica's long-poll waiters (weakly:
/// dropped ones stop being reported).
pub fn watch(pool: deadpool_postgres::WeakPool, waiters: Weak<dyn Waiters>) {
    SOURCES
        .lock()
        .expect("metrics sources lock")
        .push(Source { pool, waiters });
}

/// The route template of a path, so attacker-chosen paths cannot create
/// new time series.
pub fn route(path: &str) -> &'static str {
    match path {
        "/mcp" | "/mcp/" => "/mcp",
        "/health" => "/health",
        "/health/live" => "/health/live",
        p if p.starts_with("/.well-known/") => "/.well-known/{*rest}",
        "/console" => "/console",
        p if p.starts_with("/console/assets/") => "/console/assets/{file}",
        p if p.starts_with("/console/messages/") => "/console/messages/{id}",
        "/console/sign-in" => "/console/sign-in",
        "/console/sign-out" => "/console/sign-out",
        "/console/inbox" => "/console/inbox",
        "/console/outbox" => "/console/outbox",
        "/console/threads" => "/console/threads",
        "/console/compose" => "/console/compose",
        "/console/directory" => "/console/directory",
        "/console/operator" => "/console/operator",
        "/console/operator/sign-in" => "/console/operator/sign-in",
        p if p.starts_with("/console/") => "/console/{unknown}",
        _ => "unmatched",
    }
}

pub fn http_request(method: &http::Method, route: &'static str, status: u16, elapsed: Duration) {
    let Some(m) = INSTRUMENTS.get() else { return };
    let method = match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        _ => "_OTHER",
    };
    m.http_duration.record(
        elapsed.as_secs_f64(),
        &[
            KeyValue::new("http.request.method", method),
            KeyValue::new("http.route", route),
            KeyValue::new("http.response.status_code", i64::from(status)),
        ],
    );
}

/// One finished tool call, in plain values.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall {
    /// One of the server's own tool names (unknown names never get here),
    /// so the attribute values are a small, fixed set.
    pub tool: &'static str,
    /// `None` for a successful call.
    pub error_kind: Option<&'static str>,
    /// Messages it stored (a replayed idempotent send stores none).
    pub messages_sent: u64,
    /// Messages it handed to their recipient, and how: `read` (marked read)
    /// or `lease`.
    pub messages_read: Option<(&'static str, u64)>,
}

/// Records one tool call, and the messages it sent or handed out.
pub fn tool_call(call: ToolCall, elapsed: Duration) {
    let Some(m) = INSTRUMENTS.get() else { return };
    let outcome = if call.error_kind.is_some() {
        "error"
    } else {
        "ok"
    };
    let mut attrs = vec![
        KeyValue::new("tool", call.tool),
        KeyValue::new("outcome", outcome),
    ];
    m.tool_duration.record(elapsed.as_secs_f64(), &attrs);
    if let Some(kind) = call.error_kind {
        attrs.push(KeyValue::new("error.kind", kind));
    }
    m.tool_calls.add(1, &attrs);
    if call.messages_sent > 0 {
        m.messages_sent.add(call.messages_sent, &[]);
    }
    if let Some((mode, n)) = call.messages_read.filter(|(_, n)| *n > 0) {
        m.messages_read.add(n, &[KeyValue::new("mode", mode)]);
    }
}

static WEBHOOK_QUEUE: AtomicU64 = AtomicU64::new(0);
static WEBHOOK_OLDEST: AtomicU64 = AtomicU64::new(0);

/// The webhook queue as a worker last saw it.
pub fn webhook_queue(depth: i64, oldest_secs: f64) {
    WEBHOOK_QUEUE.store(depth.max(0) as u64, Ordering::Relaxed);
    WEBHOOK_OLDEST.store(oldest_secs.max(0.0).to_bits(), Ordering::Relaxed);
}

/// One webhook delivery attempt.
pub fn webhook_attempt(outcome: &'static str) {
    let Some(m) = INSTRUMENTS.get() else { return };
    m.webhook_attempts
        .add(1, &[KeyValue::new("outcome", outcome)]);
}

/// One failed authentication (never with the name or token itself: the
/// attribute values are a small fixed set).
pub fn auth_failure(reason: &'static str, claimed_name: bool) {
    let Some(m) = INSTRUMENTS.get() else { return };
    m.auth_failures.add(
        1,
        &[
            KeyValue::new("reason", reason),
            KeyValue::new("claimed_name", claimed_name),
        ],
    );
}

pub fn db_operation(
    operation: &'static str,
    collection: Option<&str>,
    ok: bool,
    elapsed: Duration,
) {
    let Some(m) = INSTRUMENTS.get() else { return };
    let mut attrs = vec![
        KeyValue::new("db.system.name", "postgresql"),
        KeyValue::new("db.operation.name", operation),
        KeyValue::new("outcome", if ok { "ok" } else { "error" }),
    ];
    if let Some(table) = collection {
        attrs.push(KeyValue::new("db.collection.name", table.to_owned()));
    }
    m.db_duration.record(elapsed.as_secs_f64(), &attrs);
}

pub fn pool_wait(elapsed: Duration) {
    let Some(m) = INSTRUMENTS.get() else { return };
    m.pool_wait.record(
        elapsed.as_secs_f64(),
        &[KeyValue::new("db.client.connection.pool.name", POOL_NAME)],
    );
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn console_paths_have_templates_and_strangers_share_one() {
        assert_eq!(route("/console/messages/msg_12"), "/console/messages/{id}");
        assert_eq!(route("/console/inbox"), "/console/inbox");
        assert_eq!(route("/console/x/../../etc"), "/console/{unknown}");
        assert_eq!(route("/anything"), "unmatched");
    }
}
