//! OpenTelemetry export end to end: a real OTLP/HTTP receiver (protobuf on
//! `/v1/traces` and `/v1/metrics`) runs inside the test; the server exports
//! to it; the test decodes what arrives and checks spans, their nesting and
//! attributes, and metrics. Without OTEL variables nothing is exported and
//! no exporter thread exists; logs carry the trace id.
//!
//! Telemetry is global to a process, so each scenario that installs it runs
//! in a process of its own: the tests re-run this test binary as a child.

mod common;

use std::{
    collections::BTreeMap,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::post};
use common::*;
use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::{AnyValue, KeyValue, any_value},
    metrics::v1::{metric::Data, number_data_point},
};
use phone::{
    config::LogFormat,
    telemetry::{self, OtlpConfig, TelemetryConfig},
};
use prost::Message as _;
use serde_json::{Value, json};

const CHILD: &str = "PHONE_TELEMETRY_TEST_CHILD";
const ACCEPT: &str = "application/json, text/event-stream";

// ---------------------------------------------------------------- receiver

#[derive(Debug, Clone)]
struct SpanRecord {
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: BTreeMap<String, String>,
    service_name: String,
}

#[derive(Debug, Clone)]
struct Point {
    metric: String,
    attributes: BTreeMap<String, String>,
    /// The value of a sum or gauge; a histogram's count.
    value: f64,
}

#[derive(Default)]
struct Received {
    spans: Vec<SpanRecord>,
    points: Vec<Point>,
}

type Shared = Arc<Mutex<Received>>;

fn text_of(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text_of(&kv.value)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn traces(
    State(got): State<Shared>,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1]) {
    let request = ExportTraceServiceRequest::decode(body).expect("OTLP traces decode as protobuf");
    let mut got = got.lock().unwrap();
    for rs in request.resource_spans {
        let resource = rs
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                got.spans.push(SpanRecord {
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    service_name: resource.get("service.name").cloned().unwrap_or_default(),
                });
            }
        }
    }
    // An empty protobuf message is an empty body.
    (StatusCode::OK, [("content-type", "application/x-protobuf")])
}

async fn metrics(
    State(got): State<Shared>,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1]) {
    let request =
        ExportMetricsServiceRequest::decode(body).expect("OTLP metrics decode as protobuf");
    let mut got = got.lock().unwrap();
    for rm in request.resource_metrics {
        for sm in rm.scope_metrics {
            for metric in sm.metrics {
                let name = metric.name.clone();
                let mut push = |attrs: &[KeyValue], value: f64| {
                    got.points.push(Point {
                        metric: name.clone(),
                        attributes: attributes(attrs),
                        value,
                    })
                };
                let number = |v: &Option<number_data_point::Value>| match v {
                    Some(number_data_point::Value::AsDouble(d)) => *d,
                    Some(number_data_point::Value::AsInt(i)) => *i as f64,
                    None => f64::NAN,
                };
                match &metric.data {
                    Some(Data::Sum(s)) => s
                        .data_points
                        .iter()
                        .for_each(|p| push(&p.attributes, number(&p.value))),
                    Some(Data::Gauge(g)) => g
                        .data_points
                        .iter()
                        .for_each(|p| push(&p.attributes, number(&p.value))),
                    Some(Data::Histogram(h)) => h
                        .data_points
                        .iter()
                        .for_each(|p| push(&p.attributes, p.count as f64)),
                    _ => {}
                }
            }
        }
    }
    (StatusCode::OK, [("content-type", "application/x-protobuf")])
}

async fn start_receiver() -> (String, Shared) {
    let got: Shared = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, got)
}

/// Waits until `check` passes on what arrived (or fails with its message).
async fn eventually<T>(got: &Shared, what: &str, check: impl Fn(&Received) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(found) = check(&got.lock().unwrap()) {
            return found;
        }
        if Instant::now() > deadline {
            let got = got.lock().unwrap();
            let spans: Vec<_> = got.spans.iter().map(|s| (&s.name, &s.attributes)).collect();
            let metrics: std::collections::BTreeSet<_> =
                got.points.iter().map(|p| &p.metric).collect();
            panic!("never received {what}\nspans: {spans:#?}\nmetrics: {metrics:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn has_point(got: &Received, metric: &str, attrs: &[(&str, &str)], at_least: f64) -> bool {
    got.points.iter().any(|p| {
        p.metric == metric
            && attrs
                .iter()
                .all(|(k, v)| p.attributes.get(*k).map(String::as_str) == Some(*v))
            && p.value >= at_least
    })
}

// ------------------------------------------------------------ raw requests

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

async fn raw_call(app: &TestApp, traceparent: Option<&str>, tool: &str, args: Value) -> Value {
    let mut request = reqwest::Client::new()
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(tp) = traceparent {
        request = request.header("traceparent", tp);
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let response = request
        .body(body.to_string())
        .send()
        .await
        .expect("request reaches the server");
    assert_eq!(response.status(), 200);
    response.json().await.expect("a JSON-RPC response")
}

// ------------------------------------------------------------ the children

/// Runs `scenario` of this test binary in a child process (a fresh global
/// subscriber), and returns its stdout.
fn run_child(scenario: &str, env: &[(&str, &str)]) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    for (key, _) in std::env::vars() {
        if key.starts_with("OTEL_") {
            command.env_remove(key);
        }
    }
    command.env(CHILD, scenario).env("NO_COLOR", "1");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().expect("the test binary runs as a child");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child {scenario} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// The entry point of the child processes; does nothing as a plain test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    match std::env::var(CHILD).as_deref() {
        Ok("export") => export_scenario().await,
        Ok("off-json") => off_scenario(LogFormat::Json).await,
        Ok("off-text") => off_scenario(LogFormat::Text).await,
        _ => {}
    }
}

fn telemetry_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_owned())
                .filter(|name| name.starts_with("OpenTelemetry") || name.starts_with("reqwest"))
                .collect()
        })
        .unwrap_or_default()
}

// ------------------------------------------------------------------ tests

#[test]
fn spans_and_metrics_arrive_over_otlp() {
    run_child("export", &[]);
}

#[test]
fn without_otel_variables_nothing_is_exported_and_logs_carry_trace_ids() {
    let trace_id = random_hex(16);
    let traceparent = format!("00-{trace_id}-{}-01", random_hex(8));

    let stdout = run_child("off-json", &[("TEST_TRACEPARENT", &traceparent)]);
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("JSON log line"))
        .collect();
    let finished: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "finished request")
        .collect();
    assert!(finished.len() >= 2, "{stdout}");
    // The caller's trace id is adopted; a request without one gets a new one.
    assert!(
        finished.iter().any(|l| l["trace_id"] == trace_id.as_str()),
        "{stdout}"
    );
    assert!(
        finished.iter().any(|l| l["trace_id"]
            .as_str()
            .is_some_and(|t| t.len() == 32 && t != trace_id)),
        "{stdout}"
    );
    // Every line logged inside a span of a request carries a trace id.
    for line in lines.iter().filter(|l| l.get("span").is_some()) {
        assert!(
            line["trace_id"].as_str().is_some_and(|t| t.len() == 32),
            "no trace id: {line}"
        );
    }

    let stdout = run_child("off-text", &[("TEST_TRACEPARENT", &traceparent)]);
    let line = stdout
        .lines()
        .find(|l| l.contains("finished request") && l.contains(&trace_id))
        .unwrap_or_else(|| panic!("no text line with the trace id:\n{stdout}"));
    assert!(line.contains(&format!("trace_id={trace_id}")), "{line}");
    assert!(
        !line.contains("otel."),
        "OpenTelemetry steering fields stay out of the log: {line}"
    );
}

// -------------------------------------------------------------- scenarios

async fn off_scenario(format: LogFormat) {
    let config =
        TelemetryConfig::from_env("warn,phone=debug", format).expect("valid telemetry config");
    assert!(config.otlp.is_none(), "no OTEL variables: no export");
    let telemetry = telemetry::init_with(config).expect("telemetry installs");
    assert!(!telemetry.exporting());
    assert!(!phone::telemetry::metrics::enabled());

    let app = spawn_app().await;
    let traceparent = std::env::var("TEST_TRACEPARENT").unwrap();
    raw_call(&app, Some(&traceparent), "phone_search", json!({})).await;
    raw_call(&app, None, "phone_search", json!({"query": "nobody"})).await;
    let client = app.client().await;
    let a = register(&client, "off-alice", "test agent", "otel").await;
    ok(
        &client,
        "phone_send",
        a.with(json!({"to": "off-alice", "body": "hello"})),
    )
    .await;
    client.cancel().await.unwrap();

    assert_eq!(
        telemetry_threads(),
        Vec::<String>::new(),
        "no exporter threads without OTEL variables"
    );
    app.stop().await;
}

async fn export_scenario() {
    let (receiver, got) = start_receiver().await;
    let telemetry = telemetry::init_with(TelemetryConfig {
        log_filter: "warn".into(),
        log_format: LogFormat::Text,
        otlp: Some(OtlpConfig {
            endpoint: Some(receiver),
            traces: true,
            metrics: true,
            export_interval: Some(Duration::from_millis(200)),
        }),
    })
    .expect("telemetry installs");
    assert!(telemetry.exporting() && phone::telemetry::metrics::enabled());

    let app = spawn_app().await;
    let client = app.client().await;
    let alice = register(&client, "alice", "sends things", "otel").await;
    let bob = register(&client, "bob", "receives things", "otel").await;

    // A send with the caller's W3C trace context.
    let trace_id = random_hex(16);
    let parent_id = random_hex(8);
    let secret_body = format!("secret body {}", random_hex(8));
    let sent = raw_call(
        &app,
        Some(&format!("00-{trace_id}-{parent_id}-01")),
        "phone_send",
        json!({"name": "alice", "token": alice.token, "to": "bob", "body": secret_body}),
    )
    .await;
    assert_ne!(sent["result"]["isError"], true, "{sent}");

    // Read it; fail once with a wrong token.
    let inbox = ok(&client, "phone_inbox", bob.with(json!({}))).await;
    assert_eq!(inbox["messages"].as_array().unwrap().len(), 1);
    let wrong = format!("phn_{}", "A".repeat(43));
    tool_err(
        &client,
        "phone_send",
        json!({"name": "alice", "token": wrong, "to": "bob", "body": "x"}),
    )
    .await;

    // A long poll shows up as a waiter until mail wakes it.
    let poll = {
        let client = app.client().await;
        let args = bob.with(json!({"wait_seconds": 20}));
        tokio::spawn(async move { ok(&client, "phone_inbox", args).await })
    };
    eventually(&got, "a waiter", |g| {
        has_point(g, "phone.inbox.waiters", &[], 1.0).then_some(())
    })
    .await;
    ok(
        &client,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "wake up"})),
    )
    .await;
    let woken = poll.await.unwrap();
    assert_eq!(woken["messages"][0]["body"], "wake up");

    // ---- spans
    let server = eventually(&got, "the server span of the traced request", |g| {
        g.spans
            .iter()
            .find(|s| s.trace_id == trace_id && s.kind == 2)
            .cloned()
    })
    .await;
    assert_eq!(server.name, "POST /mcp");
    assert_eq!(
        server.parent_span_id, parent_id,
        "the caller's span is the parent"
    );
    assert_eq!(server.attributes["http.route"], "/mcp");
    assert_eq!(server.attributes["http.request.method"], "POST");
    assert_eq!(server.attributes["http.response.status_code"], "200");
    assert_eq!(server.service_name, "phone");

    let tool = eventually(&got, "the tool span under it", |g| {
        g.spans
            .iter()
            .find(|s| s.trace_id == trace_id && s.name == "tools/call phone_send")
            .cloned()
    })
    .await;
    assert_eq!(
        tool.parent_span_id, server.span_id,
        "tool span nests in the request span"
    );
    assert_eq!(tool.attributes["tool"], "phone_send");
    assert_eq!(tool.attributes["agent"], "alice");
    assert_eq!(tool.attributes["outcome"], "ok");

    let db = eventually(&got, "database spans under the tool span", |g| {
        let db: Vec<_> = g
            .spans
            .iter()
            .filter(|s| s.parent_span_id == tool.span_id)
            .cloned()
            .collect();
        db.iter().any(|s| s.name == "INSERT messages").then_some(db)
    })
    .await;
    for span in &db {
        assert_eq!(span.kind, 3, "client span: {span:?}");
        assert_eq!(span.attributes["db.system.name"], "postgresql");
        assert!(span.attributes.contains_key("db.query.text"), "{span:?}");
    }
    let insert = db.iter().find(|s| s.name == "INSERT messages").unwrap();
    assert_eq!(insert.attributes["db.operation.name"], "INSERT");
    assert_eq!(insert.attributes["db.collection.name"], "messages");
    assert!(insert.attributes["db.query.text"].contains("INSERT INTO messages"));

    let failed = eventually(&got, "the failed call's span", |g| {
        g.spans
            .iter()
            .find(|s| s.attributes.get("outcome").is_some_and(|o| o == "error"))
            .cloned()
    })
    .await;
    assert_eq!(failed.attributes["error.kind"], "unauthenticated");
    assert_eq!(failed.attributes["tool"], "phone_send");

    // Never a token or a message body, anywhere.
    {
        let got = got.lock().unwrap();
        for span in &got.spans {
            for (key, value) in &span.attributes {
                for secret in [&alice.token, &bob.token, &wrong, &secret_body] {
                    assert!(
                        !value.contains(secret.as_str()),
                        "{key} of {} leaks a secret",
                        span.name
                    );
                }
            }
        }
    }

    // ---- metrics
    type Check<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);
    let checks: &[Check] = &[
        (
            "phone.tool.calls",
            &[("tool", "phone_send"), ("outcome", "ok")],
            2.0,
        ),
        (
            "phone.tool.calls",
            &[
                ("tool", "phone_send"),
                ("outcome", "error"),
                ("error.kind", "unauthenticated"),
            ],
            1.0,
        ),
        (
            "phone.tool.calls",
            &[("tool", "phone_register"), ("outcome", "ok")],
            2.0,
        ),
        (
            "phone.tool.duration",
            &[("tool", "phone_inbox"), ("outcome", "ok")],
            2.0,
        ),
        (
            "http.server.request.duration",
            &[
                ("http.route", "/mcp"),
                ("http.request.method", "POST"),
                ("http.response.status_code", "200"),
            ],
            5.0,
        ),
        ("phone.messages.sent", &[], 2.0),
        ("phone.messages.read", &[("mode", "read")], 2.0),
        (
            "db.client.operation.duration",
            &[
                ("db.operation.name", "INSERT"),
                ("db.collection.name", "messages"),
            ],
            2.0,
        ),
        (
            "db.client.connection.wait_time",
            &[("db.client.connection.pool.name", "phone")],
            1.0,
        ),
        (
            "db.client.connection.count",
            &[("db.client.connection.state", "idle")],
            1.0,
        ),
        (
            "db.client.connection.count",
            &[("db.client.connection.state", "used")],
            0.0,
        ),
        ("db.client.connection.max", &[], 8.0),
        ("db.client.connection.pending_requests", &[], 0.0),
        ("phone.inbox.waiters", &[], 0.0),
    ];
    for (metric, attrs, at_least) in checks {
        eventually(&got, &format!("{metric} {attrs:?} >= {at_least}"), |g| {
            has_point(g, metric, attrs, *at_least).then_some(())
        })
        .await;
    }

    if std::env::var_os("TELEMETRY_TEST_DUMP").is_some() {
        let got = got.lock().unwrap();
        for s in &got.spans {
            eprintln!(
                "span {} kind={} trace={} id={} parent={} {:?}",
                s.name, s.kind, s.trace_id, s.span_id, s.parent_span_id, s.attributes
            );
        }
        let mut latest = BTreeMap::new();
        for p in &got.points {
            latest.insert((p.metric.clone(), format!("{:?}", p.attributes)), p.value);
        }
        for ((metric, attrs), value) in latest {
            eprintln!("metric {metric} {attrs} = {value}");
        }
    }
    client.cancel().await.unwrap();
    app.stop().await;
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
}
