//! Test harness: each test gets its own database on the PostgreSQL that
//! `make test` started, and its own server on a random loopback port, driven
//! through rmcp's real MCP client over HTTP.
#![allow(dead_code)]

pub mod browser;
pub mod process;

use std::net::SocketAddr;

use phone::{Application, Config};
use rmcp::{
    ClientServiceExt, RoleClient, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
        ProtocolVersion,
    },
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_postgres::NoTls;

pub type Client = RunningService<RoleClient, ClientConfig>;

pub struct TestApp {
    pub addr: SocketAddr,
    pub database_url: String,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

pub fn admin_url() -> String {
    std::env::var("PHONE_TEST_DATABASE_URL").expect(
        "PHONE_TEST_DATABASE_URL is not set: run the suite with `make test`, which starts PostgreSQL",
    )
}

/// Creates an empty database; the application migrates it at startup.
pub async fn fresh_database() -> String {
    let admin = admin_url();
    let (client, connection) = tokio_postgres::connect(&admin, NoTls)
        .await
        .expect("connect to test PostgreSQL");
    tokio::spawn(connection);
    let name = format!("phone_t_{:016x}", rand::random::<u64>());
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create test database");
    let base = admin.rsplit_once('/').expect("URL has a database part").0;
    format!("{base}/{name}")
}

/// A plain connection to a test database.
pub async fn connect(database_url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(database_url, NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

pub fn test_config(database_url: &str, extra: &[(&str, &str)]) -> Config {
    let mut pairs: Vec<(String, String)> = vec![
        ("DATABASE_URL".into(), database_url.into()),
        ("PORT".into(), "0".into()),
        ("PHONE_BIND".into(), "127.0.0.1".into()),
        ("PHONE_POOL_SIZE".into(), "8".into()),
        ("RUST_LOG".into(), "warn".into()),
    ];
    for (k, v) in extra {
        pairs.retain(|(key, _)| key != k);
        pairs.push((k.to_string(), v.to_string()));
    }
    Config::from_lookup(|key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()))
        .expect("test configuration is valid")
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

pub async fn spawn_app_with(extra: &[(&str, &str)]) -> TestApp {
    let database_url = fresh_database().await;
    spawn_app_on(&database_url, extra).await
}

pub async fn spawn_app_on(database_url: &str, extra: &[(&str, &str)]) -> TestApp {
    let config = test_config(database_url, extra);
    phone::telemetry::init(&config.log_filter, config.log_format);
    let app = Application::build(&config)
        .await
        .expect("application starts");
    let addr = app.local_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async {
        let _ = stopped.await;
    }));
    TestApp {
        addr,
        database_url: database_url.to_owned(),
        stop: Some(stop),
        server: Some(server),
    }
}

impl TestApp {
    /// A handle on a server this process did not start (at `base`,
    /// `http://127.0.0.1:PORT`): its clients and URLs, nothing to stop.
    pub fn external(base: &str) -> Self {
        let addr = base
            .trim_start_matches("http://")
            .parse()
            .expect("base is http://IP:PORT");
        Self {
            addr,
            database_url: String::new(),
            stop: None,
            server: None,
        }
    }

    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// An MCP client using the initialize handshake (protocol 2025-11-25).
    pub async fn client(&self) -> Client {
        self.client_with(None).await
    }

    pub async fn client_with(&self, bearer: Option<&str>) -> Client {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.mcp_url());
        if let Some(token) = bearer {
            config = config.auth_header(token.to_owned());
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        client_info()
            .serve(transport)
            .await
            .expect("MCP client connects")
    }

    /// An MCP client speaking 2026-07-28: no initialize, `server/discover`.
    pub async fn modern_client(&self, bearer: Option<&str>) -> Client {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.mcp_url());
        if let Some(token) = bearer {
            config = config.auth_header(token.to_owned());
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        client_info()
            .serve_with_lifecycle(
                transport,
                rmcp::ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .expect("MCP client discovers the server")
    }

    pub async fn db(&self) -> tokio_postgres::Client {
        connect(&self.database_url).await
    }

    /// The single number a query such as `SELECT count(*) …` returns.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db()
            .await
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server
                .await
                .expect("server task")
                .expect("server exits cleanly");
        }
    }
}

fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("phone-tests", "0"),
    )
}

pub async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().expect("arguments are an object").clone();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"))
}

pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The structured result of a call that must succeed.
pub async fn ok(client: &Client, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args.clone()).await;
    assert_ne!(
        result.is_error,
        Some(true),
        "{tool}({args}) failed: {}",
        text(&result)
    );
    result
        .structured_content
        .clone()
        .expect("structured content")
}

/// The error text of a call that must fail with a tool error.
pub async fn tool_err(client: &Client, tool: &str, args: Value) -> String {
    let result = call(client, tool, args.clone()).await;
    assert_eq!(
        result.is_error,
        Some(true),
        "{tool}({args}) should fail, got {:?}",
        result.structured_content
    );
    assert!(
        result.structured_content.is_none(),
        "errors carry no structured content"
    );
    text(&result)
}

pub struct Agent {
    pub name: String,
    pub token: String,
}

/// `sender` mails `body` to `recipient`, who takes it in lease mode (60 s):
/// the message's id and its receipt (the only message waiting, so the
/// first one the lease hands out).
pub async fn sent_and_leased(
    client: &Client,
    sender: &Agent,
    recipient: &Agent,
    body: &str,
) -> (String, String) {
    ok(
        client,
        "phone_send",
        sender.with(json!({"to": recipient.name, "body": body})),
    )
    .await;
    let leased = ok(
        client,
        "phone_inbox",
        recipient.with(json!({"mode": "lease", "lease_seconds": 60})),
    )
    .await;
    let first = &leased["messages"][0];
    assert_eq!(first["body"], body, "{leased}");
    (
        first["id"].as_str().unwrap().to_owned(),
        first["receipt"].as_str().unwrap().to_owned(),
    )
}

/// Sets `agent`'s contact policy (`open`, `project`, `contacts`, `closed`).
pub async fn set_policy(c: &Client, agent: &Agent, policy: &str) {
    ok(
        c,
        "phone_settings",
        agent.with(json!({"contact_policy": policy})),
    )
    .await;
}

pub async fn register(client: &Client, name: &str, description: &str, project: &str) -> Agent {
    let out = ok(
        client,
        "phone_register",
        json!({"name": name, "description": description, "project": project}),
    )
    .await;
    assert_eq!(out["created"], true);
    Agent {
        name: out["name"].as_str().unwrap().to_owned(),
        token: out["token"].as_str().unwrap().to_owned(),
    }
}

impl Agent {
    /// `extra` plus this agent's name and token.
    pub fn with(&self, extra: Value) -> Value {
        let mut map = extra.as_object().cloned().unwrap_or_default();
        map.insert("name".into(), json!(self.name));
        map.insert("token".into(), json!(self.token));
        Value::Object(map)
    }
}

/// The bodies of the messages a tool answered with (`messages`).
pub fn bodies(answer: &Value) -> Vec<String> {
    answer["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect()
}

/// One statement that ran in this test's database, per pg_stat_statements
/// (which `scripts/pg.sh` loads for the tests' PostgreSQL; the tests share
/// it, so only this database's statements count). Executions that failed
/// are not counted.
pub struct Ran {
    pub query: String,
    pub calls: i64,
    pub plans: i64,
}

/// The statements of this test's database whose text is `LIKE` `pattern`.
pub async fn statements_like(db: &tokio_postgres::Client, pattern: &str) -> Vec<Ran> {
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .unwrap();
    db.query(
        "SELECT query, calls, plans FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query LIKE $1",
        &[&pattern],
    )
    .await
    .expect("pg_stat_statements is loaded (scripts/pg.sh starts the tests' PostgreSQL with it)")
    .iter()
    .map(|r| Ran {
        query: r.get(0),
        calls: r.get(1),
        plans: r.get(2),
    })
    .collect()
}

/// The first column of every row `sql` returns, as text.
pub async fn texts(db: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    db.query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Polls `sql` (one boolean) until it is true, for up to 5 s; on timeout
/// fails with what every session of the database is doing.
pub async fn wait_until(db: &tokio_postgres::Client, what: &str, sql: &str) {
    wait_until_for(db, what, sql, std::time::Duration::from_secs(5)).await;
}

/// [`wait_until`] for up to `limit`.
pub async fn wait_until_for(
    db: &tokio_postgres::Client,
    what: &str,
    sql: &str,
    limit: std::time::Duration,
) {
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if db.query_one(sql, &[]).await.unwrap().get::<_, bool>(0) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let activity = texts(
        db,
        "SELECT coalesce(wait_event_type, '-') || ' ' || coalesce(wait_event, '-') || ' ' || state || ' ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 80)
         FROM pg_stat_activity WHERE datname = current_database()",
    )
    .await;
    panic!("timed out waiting until {what}; sessions: {activity:#?}");
}

/// [`wait_until`] `sql` holds while no other session of the database runs
/// a statement. A condition that is also true *before* the server's
/// statement runs (mail unread again after an abandoned poll: it was unread
/// before that poll took it, too) only means something once the server is
/// quiet: a backend turns idle only after its transaction is committed.
pub async fn wait_until_settled(db: &tokio_postgres::Client, what: &str, sql: &str) {
    let settled = format!(
        "SELECT ({sql}) AND NOT EXISTS (
             SELECT 1 FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND state <> 'idle')"
    );
    wait_until(db, what, &settled).await;
}

/// Scans of `messages` so far: (sequential scans, index scans, rows the
/// index scans fetched). Counters reach the shared statistics up to a
/// second after a backend goes idle; see [`messages_scans_after`].
pub async fn messages_scans(db: &tokio_postgres::Client) -> (i64, i64, i64) {
    db.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let row = db
        .query_one(
            "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0)
             FROM pg_stat_user_tables WHERE relname = 'messages'",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Zeroes the counters of `messages` once what came before has been
/// reported, and returns the starting point for [`messages_scans_after`].
pub async fn messages_scans_from_zero(db: &tokio_postgres::Client) -> (i64, i64, i64) {
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    db.batch_execute("SELECT pg_stat_reset_single_table_counters('messages'::regclass)")
        .await
        .unwrap();
    messages_scans(db).await
}

/// Scans of `messages` since `before`, once at least `scans` of them
/// (sequential or index) have been reported (waits up to 15 s).
pub async fn messages_scans_after(
    db: &tokio_postgres::Client,
    before: (i64, i64, i64),
    scans: i64,
) -> (i64, i64, i64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let (seq, idx, fetched) = messages_scans(db).await;
        let since = (seq - before.0, idx - before.1, fetched - before.2);
        if since.0 + since.1 >= scans || std::time::Instant::now() > deadline {
            assert!(
                since.0 + since.1 >= scans,
                "scans not reported: {} sequential, {} index",
                since.0,
                since.1
            );
            return since;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A send held mid-statement, its snapshot taken: the sender's presence is
/// made stale, so the statement's presence write queues behind a lock this
/// takes on the sender's row. Returns once the send waits for it, with the
/// connection that holds the lock (`COMMIT` lets the send go on) and the
/// send itself. Lock waits are looked for in this test's database only:
/// the tests share one PostgreSQL, and another test's wait let a send start
/// after the change it was meant to miss.
pub async fn send_held_by_a_row_lock(
    app: &TestApp,
    sender: &Agent,
    args: Value,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<Value>) {
    let lock = app.db().await;
    lock.execute(
        "UPDATE agents SET last_seen_at = NULL WHERE name = $1",
        &[&sender.name],
    )
    .await
    .unwrap();
    lock.batch_execute("BEGIN").await.unwrap();
    lock.execute(
        "SELECT 1 FROM agents WHERE name = $1 FOR UPDATE",
        &[&sender.name],
    )
    .await
    .unwrap();
    let sending = send_in_background(app, args).await;
    sends_waiting_on_locks(app, 1).await;
    (lock, sending)
}

/// `n` messages from `sender` to `to` at once ("spam 0" …), a stranger's
/// flood: each must be stored.
pub async fn flood(client: &Client, sender: &Agent, to: &str, n: usize) {
    futures_util::future::join_all((0..n).map(|i| {
        ok(
            client,
            "phone_send",
            sender.with(json!({"to": to, "body": format!("spam {i}")})),
        )
    }))
    .await;
}

/// `phone_send` with `args` through `app`, answered in a task.
pub async fn send_in_background(app: &TestApp, args: Value) -> tokio::task::JoinHandle<Value> {
    let c = app.client().await;
    tokio::spawn(async move { ok(&c, "phone_send", args).await })
}

/// Returns once `n` send statements wait on a lock in this test's database
/// (the tests share one PostgreSQL).
pub async fn sends_waiting_on_locks(app: &TestApp, n: i64) {
    wait_until(
        &app.db().await,
        &format!("{n} sends wait on a lock"),
        &format!(
            "SELECT count(*) >= {n} FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%unnest%'"
        ),
    )
    .await;
}

/// A counter of one index in `pg_stat_user_indexes` (`idx_scan`,
/// `idx_tup_read`), read after `settle`. A backend reports its counters
/// when it goes idle, but one that reported less than a second before
/// holds them for up to 10 s (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`): a
/// count that must include every statement waits 11 s.
pub async fn index_counter(
    db: &tokio_postgres::Client,
    index: &str,
    column: &str,
    settle: std::time::Duration,
) -> i64 {
    tokio::time::sleep(settle).await;
    db.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    db.query_one(
        &format!("SELECT {column} FROM pg_stat_user_indexes WHERE indexrelname = $1"),
        &[&index],
    )
    .await
    .unwrap()
    .get(0)
}

/// Long enough for every backend's held statistics to be reported.
pub const STATS_SETTLED: std::time::Duration = std::time::Duration::from_secs(11);
