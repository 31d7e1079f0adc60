//! Logs, traces and metrics.
//!
//! - **Logs**: `tracing` to stdout, human-readable (`PHONE_LOG_FORMAT=text`,
//!   the default) or one JSON object per line (`json`). Every line logged
//!   while serving a request carries the request's trace id: the `trace_id`
//!   field of the `request` span in text, a top-level `"trace_id"` in JSON.
//! - **Traces**: a server span per HTTP request (W3C `traceparent` from the
//!   caller is honoured), a `tools/call …` span per tool call (tool, agent,
//!   outcome, error kind) and a client span per SQL statement beneath it.
//!   Never tokens, message bodies or statement parameters.
//! - **Metrics**: see `metrics`.
//!
//! Traces and metrics are exported over OTLP/HTTP (protobuf) only when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `…_METRICS_ENDPOINT`) is set. Otherwise nothing of OpenTelemetry is
//! installed: no exporter, no background thread, no layer, no instruments.

use std::{
    fmt,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use axum::{extract::Request, middleware::Next, response::Response};
use opentelemetry::{
    Context, Key, KeyValue,
    propagation::{Extractor, TextMapPropagator},
    trace::{TraceContextExt, TraceId, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    metrics::{PeriodicReader, SdkMeterProvider},
    propagation::TraceContextPropagator,
    trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider},
};
use tracing::{Event, Instrument, Level, Span, Subscriber, field::Visit};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer, Registry,
    filter::{FilterExt, filter_fn},
    fmt::{self as tfmt, FmtContext, FormatEvent, FormatFields, format::Writer},
    prelude::*,
    registry::LookupSpan,
};

pub mod metrics;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// What to log and where to export; see [`TelemetryConfig::from_env`].
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub log_filter: String,
    pub log_format: LogFormat,
    /// OTLP export; `None`: off.
    pub otlp: Option<OtlpConfig>,
}

#[derive(Debug, Clone, Default)]
pub struct OtlpConfig {
    /// Base URL of an OTLP/HTTP receiver (`http://collector:4318`);
    /// `/v1/traces` and `/v1/metrics` are appended. `None`: the exporter
    /// reads the standard `OTEL_EXPORTER_OTLP_*` variables itself.
    pub endpoint: Option<String>,
    pub traces: bool,
    pub metrics: bool,
    /// How often metrics are exported and spans are sent. `None`: the
    /// standard defaults (`OTEL_METRIC_EXPORT_INTERVAL`, 60 s;
    /// `OTEL_BSP_SCHEDULE_DELAY`, 5 s).
    pub export_interval: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{name}={value:?} is not supported: {reason}")]
    Unsupported {
        name: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(String),
    #[error("telemetry is already installed in this process")]
    AlreadyInstalled,
}

const PROTOCOL_VARS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
];

impl TelemetryConfig {
    /// Logs only, no export.
    pub fn logs_only(log_filter: &str, log_format: LogFormat) -> Self {
        Self {
            log_filter: log_filter.to_owned(),
            log_format,
            otlp: None,
        }
    }

    /// The log settings (from `Config`) plus OTLP export as the standard
    /// OpenTelemetry variables ask for it.
    pub fn from_env(log_filter: &str, log_format: LogFormat) -> Result<Self, TelemetryError> {
        Self::from_lookup(log_filter, log_format, |key| std::env::var(key).ok())
    }

    /// Export is on when an OTLP endpoint is set, for the signals whose
    /// `OTEL_{TRACES,METRICS}_EXPORTER` is unset or `otlp` (`none`: off).
    /// `OTEL_SDK_DISABLED=true` turns everything off. Headers, timeouts,
    /// compression, sampler, batch sizes and the resource (`OTEL_SERVICE_NAME`,
    /// `OTEL_RESOURCE_ATTRIBUTES`) are read by the OpenTelemetry SDK itself.
    pub fn from_lookup(
        log_filter: &str,
        log_format: LogFormat,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let mut config = Self::logs_only(log_filter, log_format);
        let set = |key: &str| {
            get(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(config);
        }
        for name in PROTOCOL_VARS {
            if let Some(value) = set(name)
                && value != "http/protobuf"
            {
                return Err(TelemetryError::Unsupported {
                    name,
                    value,
                    reason: "phone exports OTLP over HTTP with protobuf: use http/protobuf and the \
                             collector's HTTP port (4318)",
                });
            }
        }
        let exporter = |name: &'static str| match set(name).as_deref() {
            None | Some("otlp") => Ok(true),
            Some("none") => Ok(false),
            Some(other) => Err(TelemetryError::Unsupported {
                name,
                value: other.to_owned(),
                reason: "expected otlp or none",
            }),
        };
        let any_endpoint = set("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        let traces = exporter("OTEL_TRACES_EXPORTER")?
            && (any_endpoint || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some());
        let metrics = exporter("OTEL_METRICS_EXPORTER")?
            && (any_endpoint || set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some());
        if traces || metrics {
            config.otlp = Some(OtlpConfig {
                endpoint: None,
                traces,
                metrics,
                export_interval: None,
            });
        }
        Ok(config)
    }
}

static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Whether spans go to OpenTelemetry (then trace ids are OpenTelemetry's).
static TRACES_EXPORTED: AtomicBool = AtomicBool::new(false);

/// The installed exporters. Dropping it without [`Telemetry::shutdown`]
/// may lose the last few seconds of spans and metrics.
#[must_use = "keep it, and call shutdown() at exit to export what is buffered"]
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Whether anything is exported.
    pub fn exporting(&self) -> bool {
        self.tracer_provider.is_some() || self.meter_provider.is_some()
    }

    /// Exports everything buffered now. Blocks (use `spawn_blocking`).
    pub fn flush(&self) {
        if let Some(p) = &self.tracer_provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!(error = %e, "flushing spans failed");
        }
        if let Some(p) = &self.meter_provider
            && let Err(e) = p.force_flush()
        {
            tracing::warn!(error = %e, "flushing metrics failed");
        }
    }

    /// Exports what is buffered and stops the exporters. Blocks.
    pub fn shutdown(self) {
        if let Some(p) = self.tracer_provider {
            let _ = p.shutdown();
        }
        if let Some(p) = self.meter_provider {
            let _ = p.shutdown();
        }
    }
}

/// Installs logging only. Safe to call more than once (tests): later calls,
/// and calls after [`init_with`], are ignored.
/// An error with its causes, `outer: inner: innermost`, for logs and for
/// the reasons stored with a failed attempt.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

pub fn init(filter: &str, format: LogFormat) {
    let _ = init_with(TelemetryConfig::logs_only(filter, format));
}

/// Installs the global subscriber and, when configured, the OTLP exporters
/// and metric instruments. Once per process.
pub fn init_with(config: TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return Err(TelemetryError::AlreadyInstalled);
    }
    match install(config) {
        Ok(telemetry) => Ok(telemetry),
        Err(e) => {
            INSTALLED.store(false, Ordering::SeqCst);
            Err(e)
        }
    }
}

fn install(config: TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    let otlp = config.otlp.clone().unwrap_or_default();
    let resource = config.otlp.is_some().then(resource);
    let endpoint = |path: &str| {
        otlp.endpoint
            .as_ref()
            .map(|base| format!("{}{path}", base.trim_end_matches('/')))
    };
    let exporter_error =
        |e: opentelemetry_otlp::ExporterBuildError| TelemetryError::Exporter(e.to_string());

    let tracer_provider = match (&resource, otlp.traces) {
        (Some(resource), true) => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
            if let Some(url) = endpoint("/v1/traces") {
                exporter = exporter.with_endpoint(url);
            }
            let mut processor =
                BatchSpanProcessor::builder(exporter.build().map_err(exporter_error)?);
            if let Some(delay) = otlp.export_interval {
                processor = processor.with_batch_config(
                    BatchConfigBuilder::default()
                        .with_scheduled_delay(delay)
                        .build(),
                );
            }
            Some(
                SdkTracerProvider::builder()
                    .with_span_processor(processor.build())
                    .with_resource(resource.clone())
                    .build(),
            )
        }
        _ => None,
    };
    let meter_provider = match (&resource, otlp.metrics) {
        (Some(resource), true) => {
            let mut exporter = opentelemetry_otlp::MetricExporter::builder().with_http();
            if let Some(url) = endpoint("/v1/metrics") {
                exporter = exporter.with_endpoint(url);
            }
            let mut reader = PeriodicReader::builder(exporter.build().map_err(exporter_error)?);
            if let Some(interval) = otlp.export_interval {
                reader = reader.with_interval(interval);
            }
            Some(
                SdkMeterProvider::builder()
                    .with_reader(reader.build())
                    .with_resource(resource.clone())
                    .build(),
            )
        }
        _ => None,
    };

    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();
    // Below INFO, only this crate's own events and spans are logged,
    // whatever RUST_LOG asks: its libraries log what passes through them
    // there (rmcp each request and response with its arguments, tokens and
    // bodies; tokio-postgres each statement's parameters), and this crate
    // never logs a token or a body at any level.
    let log_filter = EnvFilter::try_new(&config.log_filter)
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .and(filter_fn(|m| {
            *m.level() <= Level::INFO
                || m.target() == OWN_TARGET
                || m.target().starts_with(concat!("phone", "::"))
        }));
    // Request spans are always logged, whatever the level, so that every
    // line inside a request carries its trace id.
    let log_filter = log_filter.or(filter_fn(|m| m.is_span() && m.target() == REQUEST_TARGET));
    layers.push(match config.log_format {
        LogFormat::Text => tfmt::layer()
            .with_target(false)
            .fmt_fields(PlainFields)
            .with_filter(log_filter)
            .boxed(),
        LogFormat::Json => tfmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .map_event_format(WithTraceId)
            .with_filter(log_filter)
            .boxed(),
    });
    if let Some(provider) = &tracer_provider {
        let tracer = provider.tracer("phone");
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_tracked_inactivity(false)
                .with_threads(false)
                .with_location(false)
                .with_level(false)
                .with_target(false)
                .with_filter(filter_fn(|m| {
                    if m.is_span() {
                        // Ours only (request, tool, db); db spans are DEBUG so
                        // that the log does not pay for them.
                        m.target().starts_with("phone") && *m.level() <= Level::DEBUG
                    } else {
                        *m.level() <= Level::INFO
                    }
                }))
                .boxed(),
        );
    }
    if tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_err()
    {
        // Someone else installed a subscriber: export nothing rather than
        // spans that no layer produces.
        for p in tracer_provider.into_iter() {
            let _ = p.shutdown();
        }
        for p in meter_provider.into_iter() {
            let _ = p.shutdown();
        }
        return Err(TelemetryError::AlreadyInstalled);
    }
    TRACES_EXPORTED.store(tracer_provider.is_some(), Ordering::SeqCst);
    if let Some(provider) = &meter_provider {
        metrics::install(&opentelemetry::metrics::MeterProvider::meter(
            provider, "phone",
        ));
    }
    if config.otlp.is_some() {
        tracing::info!(
            traces = tracer_provider.is_some(),
            metrics = meter_provider.is_some(),
            "exporting telemetry over OTLP/HTTP"
        );
    }
    Ok(Telemetry {
        tracer_provider,
        meter_provider,
    })
}

/// `service.name` defaults to `phone` (unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` name it); each process gets its own
/// `service.instance.id`, so replicas' metrics stay apart.
fn resource() -> Resource {
    let detected = Resource::builder().build();
    let mut builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    let named = detected
        .get(&Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if !named {
        builder = builder.with_service_name("phone");
    }
    if detected
        .get(&Key::from_static_str("service.instance.id"))
        .is_none()
    {
        builder = builder.with_attribute(KeyValue::new(
            "service.instance.id",
            format!("{:032x}", rand::random::<u128>()),
        ));
    }
    builder.build()
}

const REQUEST_TARGET: &str = "phone::http";
/// This crate's targets (`phone::…`).
const OWN_TARGET: &str = "phone";

/// The trace id of a request span, for log lines.
#[derive(Clone, Copy)]
struct RequestTraceId(TraceId);

/// Axum middleware (outermost layer): the request's server span, its trace
/// context, and the request metrics.
pub async fn trace_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = metrics::route(req.uri().path());
    let span = tracing::info_span!(
        target: REQUEST_TARGET,
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    adopt_trace_context(&span, req.headers());
    let response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    if response.status().is_server_error() {
        span.record("otel.status_code", "error");
    }
    let elapsed = started.elapsed();
    metrics::http_request(&method, route, status, elapsed);
    tracing::debug!(parent: &span, status, latency_ms = elapsed.as_secs_f64() * 1000.0, "finished request");
    response
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Joins the caller's trace (W3C `traceparent`) or starts a new one, and
/// records the trace id on the span for the log.
fn adopt_trace_context(span: &Span, headers: &http::HeaderMap) {
    if span.is_disabled() {
        return;
    }
    let parent: Context = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let remote = parent.span().span_context().clone();
    let trace_id = if TRACES_EXPORTED.load(Ordering::Relaxed) {
        if remote.is_valid() {
            let _ = span.set_parent(parent);
        }
        span.context().span().span_context().trace_id()
    } else if remote.is_valid() {
        remote.trace_id()
    } else {
        TraceId::from(rand::random::<u128>().max(1))
    };
    span.record("trace_id", tracing::field::display(trace_id));
    span.with_subscriber(|(id, dispatch)| {
        if let Some(registry) = dispatch.downcast_ref::<Registry>()
            && let Some(data) = registry.span(id)
        {
            data.extensions_mut().replace(RequestTraceId(trace_id));
        }
    });
}

/// JSON lines: puts `"trace_id"` first in every line logged inside a request.
struct WithTraceId<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithTraceId<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let trace_id = ctx.event_scope().and_then(|mut scope| {
            scope.find_map(|span| span.extensions().get::<RequestTraceId>().map(|t| t.0))
        });
        let Some(trace_id) = trace_id else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::with_capacity(256);
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) if !rest.trim_start().starts_with('}') => {
                write!(writer, "{{\"trace_id\":\"{trace_id}\",{rest}")
            }
            _ => writer.write_str(&line),
        }
    }
}

/// Text fields as tracing prints them, minus the `otel.*` fields that only
/// steer the OpenTelemetry export.
struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: Writer<'w>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = PlainVisitor {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct PlainVisitor<'a, 'w> {
    writer: &'a mut Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for PlainVisitor<'_, '_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("otel.") {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        self.result = if name == "message" {
            write!(self.writer, "{separator}{value:?}")
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}={value:?}")
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<TelemetryConfig, TelemetryError> {
        TelemetryConfig::from_lookup("info", LogFormat::Text, |key| {
            pairs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn export_is_off_without_an_endpoint() {
        assert!(config(&[]).unwrap().otlp.is_none());
        assert!(
            config(&[
                ("OTEL_SERVICE_NAME", "x"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", " ")
            ])
            .unwrap()
            .otlp
            .is_none()
        );
        let disabled = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]);
        assert!(disabled.unwrap().otlp.is_none());
    }

    #[test]
    fn endpoints_and_exporters_choose_signals() {
        let all = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])
            .unwrap()
            .otlp
            .unwrap();
        assert!(all.traces && all.metrics && all.endpoint.is_none());
        let traces = config(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c:4318/v1/traces",
        )])
        .unwrap();
        let traces = traces.otlp.unwrap();
        assert!(traces.traces && !traces.metrics);
        let no_metrics = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ]);
        let no_metrics = no_metrics.unwrap().otlp.unwrap();
        assert!(no_metrics.traces && !no_metrics.metrics);
    }

    #[test]
    fn unsupported_protocols_name_the_variable() {
        let err = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=\"grpc\""),
            "{err}"
        );
        assert!(config(&[("OTEL_TRACES_EXPORTER", "zipkin")]).is_err());
    }
}
