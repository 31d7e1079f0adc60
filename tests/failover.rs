//! The database machine fails over (issue 30): `DATABASE_URL` with several
//! hosts, connections that follow the primary, a `/health` that says when
//! writes cannot succeed, errors that say what happened.
//!
//! Most tests run against private PostgreSQL clusters of their own (a
//! primary, and a standby made with `pg_basebackup`, promoted by the test),
//! from the machine's PostgreSQL binaries, in `target/failover-tests/`;
//! the others against the suite's PostgreSQL (`make test`).

mod common;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use common::*;
use phone::Application;
use serde_json::{Value, json};
use tokio::process::Command;

// ---------------------------------------------------------------------------
// Private clusters.

fn bindir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (scripts/pg.sh installs it)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop().expect("a PostgreSQL with initdb")
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// PostgreSQL refuses to run as root: as root, as the `postgres` user.
async fn pg(tool: &str, args: &[&str]) {
    if let Err(e) = try_pg(tool, args).await {
        panic!("{e}");
    }
}

async fn try_pg(tool: &str, args: &[&str]) -> Result<(), String> {
    let bin = bindir().join(tool);
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let out = cmd
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{tool} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// One PostgreSQL server in a folder of its own (`data/`, `server.log`);
/// stopped and removed on drop.
struct Node {
    root: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Node {
    fn folder(label: &str) -> PathBuf {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/failover-tests");
        let dir = root.join(format!("{label}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let _ = std::process::Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status();
        }
        dir
    }

    /// A new primary, started, with database `phone`.
    async fn primary() -> Self {
        let root = Self::folder("primary");
        let mut node = Self {
            dir: root.join("data"),
            root,
            port: 0,
        };
        let dir = node.dir.to_str().unwrap();
        pg(
            "initdb",
            &[
                "-D",
                dir,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "-N",
            ],
        )
        .await;
        node.start_on_a_free_port().await;
        connect(&node.url("postgres"))
            .await
            .batch_execute("CREATE DATABASE phone")
            .await
            .unwrap();
        node
    }

    /// A streaming standby of `primary`, started.
    async fn standby_of(primary: &Node) -> Self {
        let root = Self::folder("standby");
        let mut node = Self {
            dir: root.join("data"),
            root,
            port: 0,
        };
        let port = primary.port.to_string();
        pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                node.dir.to_str().unwrap(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        )
        .await;
        node.start_on_a_free_port().await;
        node
    }

    /// Starts on a port nobody held a moment ago. Such a port lies in the
    /// range the kernel hands client sockets, and one of the other tests'
    /// may take it before PostgreSQL binds it: then on another.
    async fn start_on_a_free_port(&mut self) {
        for _ in 0..5 {
            self.port = free_port();
            let logged = self.log().len();
            match self.try_start(&[]).await {
                Ok(()) => return,
                Err(e) if self.log()[logged..].contains("Address already in use") => {
                    eprintln!("port {} taken meanwhile, trying another: {e}", self.port);
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no free port for PostgreSQL in 5 tries");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    async fn start(&self, settings: &[&str]) {
        if let Err(e) = self.try_start(settings).await {
            panic!("{e}");
        }
    }

    async fn try_start(&self, settings: &[&str]) -> Result<(), String> {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off \
             -c hot_standby=on -c max_connections=60 -c shared_buffers=16MB",
            self.port
        );
        for s in settings {
            options.push_str(" -c ");
            options.push_str(s);
        }
        let log = self.root.join("server.log");
        try_pg(
            "pg_ctl",
            &[
                "-D",
                self.dir.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .await
    }

    /// `fast`: what a failover does to the old primary (sessions get 57P01);
    /// `immediate`: a crash.
    async fn stop(&self, mode: &str) {
        pg(
            "pg_ctl",
            &["-D", self.dir.to_str().unwrap(), "-m", mode, "-w", "stop"],
        )
        .await;
    }

    async fn promote(&self) {
        pg(
            "pg_ctl",
            &["-D", self.dir.to_str().unwrap(), "-w", "promote"],
        )
        .await;
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let bin = bindir().join("pg_ctl");
        let mut cmd = if is_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            std::process::Command::new(bin)
        };
        let _ = cmd
            .args(["-D", self.dir.to_str().unwrap(), "-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        // Kept, with its log, when the test failed.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------
// What the server says.

async fn health(app: &TestApp) -> (u16, Value) {
    let r = reqwest::get(app.url("/health")).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Polls `/health` until `want(status, body)`, at most `within`; how long it took.
async fn health_until(
    app: &TestApp,
    within: Duration,
    want: impl Fn(u16, &Value) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let (status, body) = health(app).await;
        if want(status, &body) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "/health still {status} {body} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends until one is stored, each with the same idempotency key, as a
/// client told to retry would; the attempts' error texts.
async fn send_until_stored(
    c: &Client,
    from: &Agent,
    to: &str,
    body: &str,
    key: &str,
    within: Duration,
) -> (Value, Vec<String>) {
    let started = Instant::now();
    let mut errors = Vec::new();
    loop {
        let r = call(
            c,
            "phone_send",
            from.with(json!({"to": to, "body": body, "idempotency_key": key})),
        )
        .await;
        if r.is_error != Some(true) {
            return (r.structured_content.unwrap(), errors);
        }
        let why = text(&r);
        assert!(
            why.contains("temporarily unavailable") && why.contains("idempotency_key"),
            "a send during a failover must hear 'retry with the same idempotency_key': {why}"
        );
        errors.push(why);
        assert!(
            started.elapsed() < within,
            "no send stored within {within:?}: {errors:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------

/// The scene, on a primary and its standby: `DATABASE_URL` names
/// both, the primary stops as a failover stops it, the standby is promoted.
/// The server keeps serving from the new primary without a restart; /health
/// is 503 between and 200 after; a long poll that began before the
/// failover is woken through the new primary; a send retried with its key
/// is stored once; and when the old primary comes back read-only at its
/// address, nothing goes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_url_follows_the_primary_through_a_failover() {
    let primary = Node::primary().await;
    let standby = Node::standby_of(&primary).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/phone?connect_timeout=2",
        primary.port, standby.port
    );
    let app = spawn_app_on(&url, &[("PHONE_POOL_TIMEOUT_MS", "1000")]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "before", "idempotency_key": "k0"})),
    )
    .await;
    health_until(&app, Duration::from_secs(5), |s, b| {
        s == 200 && b["notifications"] == "listening"
    })
    .await;

    // bob long-polls across the failover, as a client does: a poll that
    // hears "temporarily unavailable" polls again.
    assert_eq!(
        bodies(&ok(&c, "phone_inbox", bob.with(json!({}))).await),
        ["before"]
    );
    let across = {
        let c = app.client().await;
        let args = bob.with(json!({"wait_seconds": 25}));
        tokio::spawn(async move {
            for _ in 0..200 {
                let r = call(&c, "phone_inbox", args.clone()).await;
                if r.is_error == Some(true) {
                    let why = text(&r);
                    assert!(why.contains("temporarily unavailable"), "{why}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                let got = r.structured_content.unwrap();
                if !bodies(&got).is_empty() {
                    return (got, Instant::now());
                }
            }
            panic!("bob never got his mail");
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    primary.stop("fast").await;
    let stopped = Instant::now();
    let (status, body) = health(&app).await;
    assert_eq!(status, 503, "/health said ok with no primary: {body}");
    standby.promote().await;
    let promoted = Instant::now();
    let took = health_until(&app, Duration::from_secs(15), |s, b| {
        s == 200 && b["notifications"] == "listening"
    })
    .await;
    eprintln!(
        "primary stopped; promoted after {:?}; /health ok and listening {took:?} after the promotion",
        promoted - stopped
    );

    let (sent, errors) =
        send_until_stored(&c, &alice, "bob", "after", "k1", Duration::from_secs(10)).await;
    let sent_at = Instant::now();
    eprintln!("send after the failover: {} retries", errors.len());
    let (got, got_at) = across.await.unwrap();
    assert_eq!(bodies(&got), ["after"], "{got}");
    assert!(
        got_at.saturating_duration_since(sent_at) < Duration::from_secs(5),
        "the long poll slept through its mail"
    );

    // A long poll that begins now is woken through the new primary's
    // notifications (this replica's listener followed it): without them it
    // would sleep its whole 25 s.
    let woken = {
        let c = app.client().await;
        let args = bob.with(json!({"wait_seconds": 25}));
        tokio::spawn(async move {
            let got = ok(&c, "phone_inbox", args).await;
            (got, Instant::now())
        })
    };
    // (Its first look and waiter row take milliseconds.)
    tokio::time::sleep(Duration::from_millis(800)).await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "woken", "idempotency_key": "k2"})),
    )
    .await;
    let sent_at = Instant::now();
    let (got, got_at) = woken.await.unwrap();
    assert_eq!(bodies(&got), ["woken"]);
    assert!(
        got_at - sent_at < Duration::from_secs(5),
        "woken {:?} after the send",
        got_at - sent_at
    );
    // The retry with the same key is a replay, not a second message.
    let again = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "after", "idempotency_key": "k1"})),
    )
    .await;
    assert_eq!(again["id"], sent["id"]);
    assert_eq!(again["replayed"], true);

    // The old primary comes back at its address, read-only (as a demoted
    // primary would, a standby): new connections go past it.
    primary.start(&["default_transaction_read_only=on"]).await;
    let probe = connect(&primary.url("postgres")).await;
    let pool_connections = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'phone'";
    for i in 0..20 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": format!("later {i}")})),
        )
        .await;
    }
    let on_old: i64 = probe.query_one(pool_connections, &[]).await.unwrap().get(0);
    assert_eq!(on_old, 0, "connections kept on the read-only old primary");
    let inbox = ok(&c, "phone_inbox", bob.with(json!({"limit": 50}))).await;
    assert_eq!(bodies(&inbox).len(), 20);
    app.stop().await;
}

/// A server that stops taking writes under open connections (as a primary
/// made read-only, or a connection left on a demoted one): sends fail with
/// "temporarily unavailable … retry with the same idempotency_key" (not
/// "internal error"), /health says 503 `read_only` at once, the pool drops
/// its connections to it (the LISTEN connection too), and all is well again
/// as soon as the server takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_taking_writes_is_left_and_health_says_so() {
    let node = Node::primary().await;
    let app = spawn_app_on(&node.url("phone"), &[]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    register(&c, "bob", "B", "p").await;
    // Several pooled connections, all open.
    let mut sends = Vec::new();
    for i in 0..8 {
        let c = app.client().await;
        let args = alice.with(json!({"to": "bob", "body": format!("m{i}")}));
        sends.push(tokio::spawn(
            async move { ok(&c, "phone_send", args).await },
        ));
    }
    for s in sends {
        s.await.unwrap();
    }
    health_until(&app, Duration::from_secs(5), |s, b| {
        s == 200 && b["notifications"] == "listening"
    })
    .await;
    let admin = connect(&node.url("postgres")).await;
    let phone_connections =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'phone'";
    let before: i64 = admin
        .query_one(phone_connections, &[])
        .await
        .unwrap()
        .get(0);
    assert!(before >= 2, "pool and listener connected: {before}");

    admin
        .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .unwrap();
    reload(&admin, "default_transaction_read_only", "on").await;

    let (status, body) = health(&app).await;
    assert_eq!(
        (status, body["database"].as_str()),
        (503, Some("read_only")),
        "{body}"
    );
    let r = call(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "refused", "idempotency_key": "r1"})),
    )
    .await;
    let why = text(&r);
    assert!(
        why.contains("temporarily unavailable")
            && why.contains("read-only")
            && why.contains("retry with the same idempotency_key"),
        "{why}"
    );
    // Every connection to it goes (the listener's within its heartbeat),
    // and none is made again while it refuses writes.
    let started = Instant::now();
    loop {
        let n: i64 = admin
            .query_one(phone_connections, &[])
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{n} connections still open to a server that takes no writes"
        );
        let _ = health(&app).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // What the log says: PostgreSQL's code and words.
    let e = admin
        .batch_execute("CREATE TABLE t ()")
        .await
        .expect_err("read-only");
    let said = phone::store::StoreError::from(e).to_string();
    assert_eq!(
        said,
        "database error: SQLSTATE 25006: cannot execute CREATE TABLE in a read-only transaction"
    );

    admin
        .batch_execute("ALTER SYSTEM RESET default_transaction_read_only")
        .await
        .unwrap();
    reload(&admin, "default_transaction_read_only", "off").await;
    let took = health_until(&app, Duration::from_secs(10), |s, b| {
        s == 200 && b["notifications"] == "listening"
    })
    .await;
    eprintln!("writable again: /health ok and listening after {took:?}");
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "refused", "idempotency_key": "r1"})),
    )
    .await;
    app.stop().await;
}

/// Reloads the server's configuration and waits until `setting` is
/// `value`: `pg_reload_conf` only signals the postmaster, which passes the
/// reload on to every backend at once, and each applies it before its next
/// command. Once this session shows it, the pool's connections will too.
async fn reload(admin: &tokio_postgres::Client, setting: &str, value: &str) {
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    wait_until(
        admin,
        &format!("{setting} is '{value}'"),
        &format!("SELECT current_setting('{setting}') = '{value}'"),
    )
    .await;
}

/// `/health` asks the very thing a send needs: that a transaction can
/// commit on the server reached. Two ways a server answers queries and yet
/// takes no writes: read-only (with `target_session_attrs=any` the pool
/// keeps connecting to it, as to a demoted primary named alone), and a
/// synchronous standby that never confirms (every commit waits). Both are
/// 503, and 200 again as soon as writes commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_writes_cannot_commit() {
    let node = Node::primary().await;
    let url = format!("{}?target_session_attrs=any", node.url("phone"));
    let app = spawn_app_on(&url, &[("PHONE_STATEMENT_TIMEOUT_MS", "1000")]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    assert_eq!(health(&app).await.0, 200);
    let admin = connect(&node.url("postgres")).await;
    let set = async |sql: &str, setting: &str, value: &str| {
        admin.batch_execute(sql).await.unwrap();
        reload(&admin, setting, value).await;
    };

    set(
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "default_transaction_read_only",
        "on",
    )
    .await;
    // A send meets PostgreSQL's refusal (25006) on a connection of its own:
    // a failover to retry, not an internal error.
    let r = call(
        &c,
        "phone_send",
        alice.with(json!({"to": "alice", "body": "ro", "idempotency_key": "ro1"})),
    )
    .await;
    let why = text(&r);
    assert!(
        why.contains("temporarily unavailable")
            && why.contains("read-only")
            && why.contains("retry with the same idempotency_key"),
        "{why}"
    );
    health_until(&app, Duration::from_secs(3), |s, b| {
        s == 503 && b["database"] == "read_only"
    })
    .await;
    set(
        "ALTER SYSTEM RESET default_transaction_read_only",
        "default_transaction_read_only",
        "off",
    )
    .await;
    health_until(&app, Duration::from_secs(5), |s, _| s == 200).await;

    // Commits wait for a standby that does not exist.
    set(
        "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
        "synchronous_standby_names",
        "nobody",
    )
    .await;
    let took = health_until(&app, Duration::from_secs(3), |s, b| {
        s == 503 && b["database"] == "timed_out"
    })
    .await;
    eprintln!("commits hang: /health 503 after {took:?}");
    let r = call(
        &c,
        "phone_send",
        alice.with(json!({"to": "alice", "body": "stuck", "idempotency_key": "s1"})),
    )
    .await;
    assert!(text(&r).contains("temporarily unavailable"), "{}", text(&r));
    set(
        "ALTER SYSTEM RESET synchronous_standby_names",
        "synchronous_standby_names",
        "",
    )
    .await;
    health_until(&app, Duration::from_secs(5), |s, _| s == 200).await;
    // The send that timed out had committed locally and is released now:
    // its retry is a replay, not a second message.
    let again = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "alice", "body": "stuck", "idempotency_key": "s1"})),
    )
    .await;
    let stored: i64 = connect(&node.url("phone"))
        .await
        .query_one("SELECT count(*) FROM messages WHERE body = 'stuck'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "{again}");
    app.stop().await;
}

/// `PHONE_REQUIRE_SYNC_STANDBY` (docs/RELIABILITY.md finding 21): a
/// failover manager that clears `synchronous_standby_names` (pg_auto_failover's
/// `wait_primary`, wrongly given to the old primary mid-failover) makes
/// commits asynchronous, and an old primary's asynchronous commits are
/// rewound when it rejoins. Here, on a primary with a streaming standby:
/// 1. no standby named: a send and a poll are refused before anything is
///    done (nothing stored, nothing marked read), `/health` says why;
/// 2. the setting cleared while a send's commit waits (PostgreSQL lets every
///    waiting commit go then), the same with the standby gone, and a cancel
///    of the waiting commit (COMMIT succeeds, the setting unchanged):
///    "outcome unknown", though stored; the retry with its key, once a
///    synchronous standby is back, is a replay;
/// 3. a role that cannot see the standbys' positions: startup refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_sync_standby_mail_is_acknowledged_only_where_a_standby_holds_it() {
    let primary = Node::primary().await;
    let standby = Node::standby_of(&primary).await;
    let admin = connect(&primary.url("postgres")).await;
    let set = async |sql: &str, setting: &str, value: &str| {
        admin.batch_execute(sql).await.unwrap();
        reload(&admin, setting, value).await;
    };
    let synchronous = async || {
        set(
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "synchronous_standby_names",
            "*",
        )
        .await;
        wait_until_for(
            &admin,
            "the standby is synchronous",
            "SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync')",
            Duration::from_secs(30),
        )
        .await;
    };
    synchronous().await;
    let app = spawn_app_on(
        &primary.url("phone"),
        &[("PHONE_REQUIRE_SYNC_STANDBY", "true")],
    )
    .await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let send = |body: &str, key: &str| {
        alice.with(json!({"to": "bob", "body": body, "idempotency_key": key}))
    };
    health_until(&app, Duration::from_secs(5), |s, _| s == 200).await;
    ok(&c, "phone_send", send("one", "k1")).await;
    let db = connect(&primary.url("phone")).await;
    let count = async |sql: &str| -> i64 { db.query_one(sql, &[]).await.unwrap().get(0) };

    // 1. No synchronous standby: refused, nothing done.
    set(
        "ALTER SYSTEM RESET synchronous_standby_names",
        "synchronous_standby_names",
        "",
    )
    .await;
    health_until(&app, Duration::from_secs(5), |s, b| {
        s == 503 && b["database"] == "no_sync_standby"
    })
    .await;
    let why = text(&call(&c, "phone_send", send("two", "k2")).await);
    assert!(
        why.contains("temporarily unavailable")
            && why.contains("no synchronous standby")
            && why.contains("nothing was done"),
        "{why}"
    );
    let why = text(&call(&c, "phone_inbox", bob.with(json!({}))).await);
    assert!(
        why.contains("no synchronous standby") && !why.contains("marked read"),
        "{why}"
    );
    assert_eq!(
        count("SELECT count(*) FROM messages WHERE body = 'two'").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM messages WHERE body = 'one' AND read_at IS NULL").await,
        1,
        "a refused poll marked mail read"
    );
    // Every other change a caller is told is done, too: a registration
    // rolled back by a failover would leave its token working nowhere and
    // its name free for anyone; a lost block, a stranger let in again.
    let refused = |r: &rmcp::model::CallToolResult| {
        let why = text(r);
        assert!(
            r.is_error == Some(true)
                && why.contains("no synchronous standby")
                && why.contains("nothing was done"),
            "{why}"
        );
    };
    refused(
        &call(
            &c,
            "phone_register",
            json!({"name": "dave", "description": "D", "project": "p"}),
        )
        .await,
    );
    refused(
        &call(
            &c,
            "phone_settings",
            bob.with(json!({"contact_policy": "contacts"})),
        )
        .await,
    );
    refused(&call(&c, "phone_settings", bob.with(json!({"block": ["alice"]}))).await);
    assert_eq!(
        count("SELECT count(*) FROM agents WHERE name = 'dave'").await,
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM agents WHERE name = 'bob' AND contact_policy = 'open'").await,
        1
    );
    assert_eq!(count("SELECT count(*) FROM contacts").await, 0);
    // What only reads goes on: a search of the directory, and of one's
    // mail, whose statement also writes the caller's presence when it is
    // old (bookkeeping, not a change the caller is told about).
    let found = ok(&c, "phone_search", json!({"query": "alice"})).await;
    assert!(found.to_string().contains("alice"), "{found}");
    db.execute(
        "UPDATE agents SET last_seen_at = now() - interval '1 hour' WHERE name = 'bob'",
        &[],
    )
    .await
    .unwrap();
    let mine = ok(&c, "phone_inbox", bob.with(json!({"query": "one"}))).await;
    assert_eq!(bodies(&mine), ["one"], "{mine}");

    // Until commits wait for a standby: the checkpointer decides that, and
    // reads a reloaded setting later than the sessions do. A probe commit of
    // its own that hangs shows it has (then it is cancelled).
    let commits_wait = async || {
        for _ in 0..50 {
            let probe = connect(&primary.url("postgres")).await;
            let pid: i32 = probe
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .unwrap()
                .get(0);
            let probing = tokio::spawn(async move {
                probe
                    .batch_execute("SELECT pg_logical_emit_message(true, 'phone.test', '')")
                    .await
            });
            for _ in 0..20 {
                let waits: bool = admin
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                         WHERE pid = $1 AND wait_event = 'SyncRep')",
                        &[&pid],
                    )
                    .await
                    .unwrap()
                    .get(0);
                if waits {
                    admin
                        .execute("SELECT pg_cancel_backend($1)", &[&pid])
                        .await
                        .unwrap();
                    let _ = probing.await;
                    return;
                }
                if probing.is_finished() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // It may begin to wait just now: cancelled all the same.
            admin
                .execute("SELECT pg_cancel_backend($1)", &[&pid])
                .await
                .unwrap();
            let _ = tokio::time::timeout(Duration::from_secs(10), probing).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("commits never began to wait for the standby named 'nobody'");
    };
    // A send whose commit waits for a standby named 'nobody': its task,
    // awaited once the test has let the commit go.
    #[allow(clippy::async_yields_async)]
    let waiting_call = async |tool: &'static str, args: Value| {
        set(
            "ALTER SYSTEM SET synchronous_standby_names = 'nobody'",
            "synchronous_standby_names",
            "nobody",
        )
        .await;
        commits_wait().await;
        let sending = {
            let c = app.client().await;
            tokio::spawn(async move { call(&c, tool, args).await })
        };
        wait_until_for(
            &db,
            "the call's commit waits for a synchronous standby",
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event = 'SyncRep' AND query = 'COMMIT')",
            Duration::from_secs(10),
        )
        .await;
        sending
    };
    #[allow(clippy::async_yields_async)]
    let waiting_send = async |body: &'static str, key: &'static str| {
        waiting_call("phone_send", send(body, key)).await
    };
    let clear = async || {
        set(
            "ALTER SYSTEM RESET synchronous_standby_names",
            "synchronous_standby_names",
            "",
        )
        .await
    };
    let unknown = |r: &rmcp::model::CallToolResult| {
        let why = text(r);
        assert!(
            r.is_error == Some(true)
                && why.contains("outcome is unknown")
                && why.contains("retry with the same idempotency_key"),
            "{why}"
        );
    };

    // 2. The setting cleared under the waiting commit (which lets it go):
    // the standby, still streaming, is asynchronous now, and may not be the
    // one promoted: its position does not count.
    let sending = waiting_send("three", "k3").await;
    clear().await;
    unknown(&sending.await.unwrap());
    // So is a change of settings that was committed unconfirmed.
    let changing = waiting_call(
        "phone_settings",
        bob.with(json!({"contact_policy": "project"})),
    )
    .await;
    clear().await;
    let r = changing.await.unwrap();
    assert!(
        r.is_error == Some(true) && text(&r).contains("outcome is unknown"),
        "{}",
        text(&r)
    );

    // The same with no standby at all.
    standby.stop("fast").await;
    let sending = waiting_send("four", "k4").await;
    clear().await;
    unknown(&sending.await.unwrap());
    // And the wait cancelled (a pooler's query timeout): COMMIT succeeds
    // with a warning, the setting unchanged.
    let sending = waiting_send("five", "k5").await;
    admin
        .batch_execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
             WHERE datname = 'phone' AND wait_event = 'SyncRep' AND query = 'COMMIT'",
        )
        .await
        .unwrap();
    unknown(&sending.await.unwrap());
    clear().await;
    assert_eq!(
        count("SELECT count(*) FROM messages WHERE body IN ('three', 'four', 'five')").await,
        3,
        "the commits let go without a standby"
    );

    // A standby back: the refused send is stored once, the unknown one replayed.
    standby.start(&[]).await;
    synchronous().await;
    health_until(&app, Duration::from_secs(5), |s, _| s == 200).await;
    ok(&c, "phone_send", send("two", "k2")).await;
    for (body, key) in [("three", "k3"), ("four", "k4"), ("five", "k5")] {
        let again = ok(&c, "phone_send", send(body, key)).await;
        assert_eq!(again["replayed"], true, "{again}");
    }
    assert_eq!(
        count("SELECT count(*) FROM messages WHERE body IN ('two', 'three', 'four', 'five')").await,
        4
    );
    register(&c, "dave", "D", "p").await;
    ok(&c, "phone_settings", bob.with(json!({"block": ["alice"]}))).await;
    assert_eq!(
        count("SELECT count(*) FROM contacts WHERE is_blocked").await,
        1
    );
    app.stop().await;

    // 3. A role that cannot see the standbys' positions would commit every
    // call and then hear "outcome unknown": startup refuses it, and says
    // what to grant.
    for sql in [
        "CREATE ROLE mailer LOGIN",
        "CREATE DATABASE mail OWNER mailer",
    ] {
        admin.batch_execute(sql).await.unwrap();
    }
    let url = format!("postgres://mailer@127.0.0.1:{}/mail", primary.port);
    let guarded = [("PHONE_REQUIRE_SYNC_STANDBY", "true")];
    let err = Application::build(&test_config(&url, &guarded))
        .await
        .err()
        .expect("startup refuses a role without pg_read_all_stats")
        .to_string();
    assert!(
        err.contains("GRANT pg_read_all_stats") && err.contains("mailer"),
        "{err}"
    );
    admin
        .batch_execute("GRANT pg_read_all_stats TO mailer")
        .await
        .unwrap();
    let app = spawn_app_on(&url, &guarded).await;
    let c = app.client().await;
    let carol = register(&c, "carol", "C", "p").await;
    ok(
        &c,
        "phone_send",
        carol.with(json!({"to": "carol", "body": "seen", "idempotency_key": "s1"})),
    )
    .await;
    app.stop().await;
}

/// A long poll waits on its `inbox_waiters` row, which is unlogged: a
/// standby promoted by a failover, or a server restarted after a crash, has
/// none. When the replica's LISTEN connection comes back (as it does after
/// either), a waiting poll registers again; otherwise no sender would wake
/// it and it would sleep through its mail until its wait ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_registers_again_when_its_listener_reconnects() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    health_until(&app, Duration::from_secs(5), |s, b| {
        s == 200 && b["notifications"] == "listening"
    })
    .await;
    let waiting = {
        let c = app.client().await;
        let args = bob.with(json!({"wait_seconds": 20}));
        tokio::spawn(async move {
            let got = ok(&c, "phone_inbox", args).await;
            (got, Instant::now())
        })
    };
    let db = connect(&app.database_url).await;
    wait_until(
        &db,
        "bob waits",
        "SELECT EXISTS (SELECT 1 FROM inbox_waiters)",
    )
    .await;
    // What a promotion does to the unlogged table, and to the listener.
    db.batch_execute("TRUNCATE inbox_waiters").await.unwrap();
    db.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'phone'
           AND (query LIKE 'LISTEN%' OR query LIKE 'SELECT NOT (pg_is_in_recovery()%')",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    health_until(&app, Duration::from_secs(5), |s, b| {
        s == 200 && b["notifications"] == "listening"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "wake up"})),
    )
    .await;
    let sent_at = Instant::now();
    let (got, got_at) = waiting.await.unwrap();
    assert_eq!(bodies(&got), ["wake up"]);
    assert!(
        got_at - sent_at < Duration::from_secs(5),
        "the long poll woke {:?} after the send (its wait's end, not the send)",
        got_at - sent_at
    );
    app.stop().await;
}

/// A first host that refuses, or accepts and then never answers, is passed
/// over within its connect timeout: startup and every later connection
/// reach the host that answers (on the suite's PostgreSQL).
#[tokio::test]
async fn dead_and_silent_hosts_before_the_primary_are_passed_over() {
    let db = fresh_database().await;
    let (base, name) = db.rsplit_once('/').unwrap();
    let pg_port = base.rsplit_once(':').unwrap().1;
    let refusing = free_port();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let url = format!(
        "postgres://postgres@127.0.0.1:{refusing},127.0.0.1:{silent_port},127.0.0.1:{pg_port}/{name}?connect_timeout=1"
    );
    let started = Instant::now();
    let app = spawn_app_on(&url, &[]).await;
    eprintln!(
        "started past a refusing and a silent host in {:?}",
        started.elapsed()
    );
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "alice", "body": "to self"})),
    )
    .await;
    // A /health that needs a new connection spends the silent host's
    // whole connect timeout (1 s) before reaching the primary, and /health
    // answers within 1 s: one 503 then is its budget, not a lost host
    // (seen once in CI). It must come back to 200.
    health_until(&app, Duration::from_secs(10), |s, _| s == 200).await;
    app.stop().await;
    held.abort();
}

/// Pooled connections whose path broke while they sat idle, unnoticed
/// until used (a restart, sessions ended from outside, a NAT that forgot
/// them): `/health` must not call the database down for it. It asks again
/// on a fresh connection (seen in CI: one 503 right after every session was
/// ended, before the client noticed). A proxy in front of the suite's
/// PostgreSQL cuts every connection made before the cut at its next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_not_fooled_by_pooled_connections_that_broke_unseen() {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = fresh_database().await;
    let (base, name) = db.rsplit_once('/').unwrap();
    let pg = base.rsplit_once('@').unwrap().1.to_owned();
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = proxy.local_addr().unwrap().port();
    // Connections numbered below `cut_below` die at their next write.
    let cut_below = Arc::new(AtomicU64::new(0));
    let cuts = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let (cut, counted, numbered) = (cut_below.clone(), cuts.clone(), accepted.clone());
    let forwarding = tokio::spawn(async move {
        while let Ok((mut down, _)) = proxy.accept().await {
            let id = numbered.fetch_add(1, Ordering::SeqCst) + 1;
            let (pg, cut, counted) = (pg.clone(), cut.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(mut up) = tokio::net::TcpStream::connect(&pg).await else {
                    return;
                };
                let (mut down_r, mut down_w) = down.split();
                let (mut up_r, mut up_w) = up.split();
                let upstream = async {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(k) = down_r.read(&mut buf).await {
                        if k == 0 {
                            break;
                        }
                        if id < cut.load(Ordering::SeqCst) {
                            counted.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if up_w.write_all(&buf[..k]).await.is_err() {
                            break;
                        }
                    }
                };
                let downstream = async {
                    let _ = tokio::io::copy(&mut up_r, &mut down_w).await;
                };
                tokio::select! {
                    _ = upstream => {}
                    _ = downstream => {}
                }
            });
        }
    });
    let url = format!("postgres://postgres@127.0.0.1:{proxy_port}/{name}");
    // Also with a pool of one: the broken connection must be given back
    // before a fresh one is asked for.
    for pool in ["10", "1"] {
        let app = spawn_app_on(&url, &[("PHONE_POOL_SIZE", pool)]).await;
        let c = app.client().await;
        let me = register(&c, &format!("alice-{pool}"), "A", "p").await;
        ok(
            &c,
            "phone_send",
            me.with(json!({"to": me.name, "body": "before the cut"})),
        )
        .await;
        health_until(&app, Duration::from_secs(5), |s, _| s == 200).await;
        // Every connection open now dies at its next write; new ones pass.
        let cut_before = cuts.load(Ordering::SeqCst);
        cut_below.store(accepted.load(Ordering::SeqCst) + 1, Ordering::SeqCst);
        let (status, body) = health(&app).await;
        assert!(
            cuts.load(Ordering::SeqCst) > cut_before,
            "pool {pool}: no pooled connection was used and cut: nothing was tested"
        );
        assert_eq!(
            (status, &body["database"]),
            (200, &json!("ok")),
            "pool {pool}: /health called the database down for a pooled connection that broke: {body}"
        );
        app.stop().await;
    }
    forwarding.abort();
}

/// libpq's key=value form, and TLS verified against the suite's CA on every
/// host of a multi-host URL.
#[tokio::test]
async fn the_key_value_form_and_tls_with_several_hosts() {
    let db = fresh_database().await;
    let (base, name) = db.rsplit_once('/').unwrap();
    let pg_port = base.rsplit_once(':').unwrap().1;
    let ca = format!(
        "{}/ca.pem",
        std::env::var("PHONE_TEST_PG_TLS_DIR").expect("run with `make test` (TLS on)")
    );
    let dead = free_port();
    for url in [
        format!(
            "host=127.0.0.1,127.0.0.1 port={dead},{pg_port} dbname={name} user=postgres sslmode=require"
        ),
        format!(
            "postgres://postgres@localhost:{dead},localhost:{pg_port}/{name}?sslmode=verify-full&sslrootcert={ca}"
        ),
    ] {
        let app = spawn_app_on(&url, &[]).await;
        let c = app.client().await;
        register(&c, "alice", "A", "p").await;
        let encrypted: bool = connect(&admin_url())
            .await
            .query_one(
                "SELECT bool_and(s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
                 WHERE a.datname = $1 AND a.application_name = 'phone'",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        assert!(encrypted, "{url}");
        app.stop().await;
        connect(&db)
            .await
            .batch_execute("DELETE FROM agents")
            .await
            .unwrap();
    }
}

/// What is really malformed stops startup, naming DATABASE_URL and the part.
#[tokio::test]
async fn a_malformed_connection_string_stops_startup_clearly() {
    for (url, says) in [
        ("postgres://u@h1:5432,h2:port/db", "port"),
        (
            "postgres://u@h1,h2/db?target_session_attrs=standby",
            "target_session_attrs",
        ),
        ("host=h1,h2,h3 port=1,2 user=u", "2 ports for 3 hosts"),
    ] {
        let config = test_config(url, &[]);
        let err = Application::build(&config)
            .await
            .err()
            .expect("startup refuses it")
            .to_string();
        assert!(
            err.contains("DATABASE_URL") && err.contains(says),
            "{url}: {err}"
        );
    }
}
