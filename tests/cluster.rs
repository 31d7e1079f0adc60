//! The cluster part of the suite: real replica processes sharing one
//! database, behind the real nginx load balancer (deploy/nginx.conf).

mod common;

use std::{
    collections::HashSet,
    net::TcpListener,
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use common::*;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Replica {
    port: u16,
    child: Child,
}

impl Replica {
    /// Starts a replica; [`Replica::ready`] waits for it. On port 0: it
    /// binds a free port itself and logs it (a port found free here, then
    /// bound by the replica after its migrations, could be taken meanwhile
    /// by a test running beside, whose server would answer for it).
    fn spawn(database_url: &str, extra: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_phone"));
        cmd.env_clear()
            .env("DATABASE_URL", database_url)
            .env("PORT", "0")
            .env("PHONE_BIND", "127.0.0.1")
            .env("PHONE_POOL_SIZE", "6")
            .env("PHONE_TRUST_FORWARDED_FOR", "true")
            .env("RUST_LOG", "warn,phone::cli::serve=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        Replica {
            port: 0,
            child: cmd.spawn().expect("start a replica"),
        }
    }

    /// Waits until the replica logs the port it listens on, then until it
    /// is healthy; the rest of its log is read and dropped.
    async fn ready(&mut self) {
        use tokio::io::AsyncBufReadExt as _;
        let stdout = self.child.stdout.take().expect("stdout is piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let port = tokio::time::timeout(Duration::from_secs(60), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(port) = common::process::listening_port(&line) {
                    return port;
                }
            }
            panic!("the replica ended before it listened");
        })
        .await
        .expect("the replica listens within 60 s");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        self.port = port;
        wait_healthy(port).await;
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

async fn wait_healthy(port: u16) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("replica on port {port} never became healthy");
}

struct Balancer {
    port: u16,
    child: Child,
    _dir: PathBuf,
}

impl Balancer {
    /// nginx with deploy/nginx.conf, only its listening port changed so the
    /// test does not collide with anything on :3000.
    async fn start(replicas: &[u16]) -> Self {
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("nginx is installed by scripts/test.sh");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("phone-lb-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx.conf"))
                .unwrap();
        assert!(conf.contains("listen 3000;"));
        std::fs::write(
            dir.join("nginx.conf"),
            conf.replace("listen 3000;", &format!("listen 127.0.0.1:{port};")),
        )
        .unwrap();
        let upstream: String = replicas
            .iter()
            .map(|p| format!("server 127.0.0.1:{p} max_fails=2 fail_timeout=10s;\n"))
            .collect();
        std::fs::write(dir.join("phone-upstream.conf"), upstream).unwrap();
        let child = Command::new(nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-g")
            .arg("daemon off;")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start nginx");
        wait_healthy(port).await;
        Balancer {
            port,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

struct Cluster {
    database_url: String,
    replicas: Vec<Replica>,
    balancer: Balancer,
}

impl Cluster {
    /// Three replicas started at the same moment against an empty database:
    /// the migrations must run exactly once, under the advisory lock.
    async fn start() -> Self {
        let database_url = fresh_database().await;
        let mut replicas: Vec<Replica> =
            (0..3).map(|_| Replica::spawn(&database_url, &[])).collect();
        for r in &mut replicas {
            r.ready().await;
        }
        let balancer = Balancer::start(&replicas.iter().map(|r| r.port).collect::<Vec<_>>()).await;
        Cluster {
            database_url,
            replicas,
            balancer,
        }
    }

    async fn client(&self, replica: usize) -> Client {
        client_for(&self.replicas[replica].url(), None).await
    }

    async fn balanced_client(&self) -> Client {
        client_for(&self.balancer.url(), None).await
    }

    async fn db(&self) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.database_url, tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        client
    }

    async fn stop(mut self) {
        // nginx's master stops its workers on SIGQUIT; SIGKILL would orphan them.
        if let Some(pid) = self.balancer.child.id() {
            let _ = std::process::Command::new("kill")
                .arg("-QUIT")
                .arg(pid.to_string())
                .status();
            let _ = tokio::time::timeout(Duration::from_secs(10), self.balancer.child.wait()).await;
        }
        for r in &mut self.replicas {
            let _ = r.child.kill().await;
        }
    }
}

#[tokio::test]
async fn replicas_started_together_migrate_once_and_serve_the_flow_without_affinity() {
    let cluster = Cluster::start().await;
    let db = cluster.db().await;
    let versions: Vec<i32> = db
        .query(
            "SELECT version FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let unique: HashSet<&i32> = versions.iter().collect();
    assert_eq!(
        unique.len(),
        versions.len(),
        "a migration ran twice: {versions:?}"
    );
    assert!(versions.len() >= 3);

    // Every call of the flow on a different replica, then through the balancer.
    let (r0, r1, r2) = (
        cluster.client(0).await,
        cluster.client(1).await,
        cluster.client(2).await,
    );
    let email = register(
        &r0,
        "email",
        "Email assistant with access to all Fortea mail",
        "hassing",
    )
    .await;
    let coder = register(&r1, "coder", "Writes code", "kodo").await;
    let found = ok(&r2, "phone_search", json!({"query": "invoice mail"})).await;
    assert_eq!(found["agents"][0]["name"], "email");
    let q = ok(
        &r0,
        "phone_send",
        coder.with(json!({"to": "email", "body": "Please fetch the latest invoice mail."})),
    )
    .await;
    let inbox = ok(&r1, "phone_inbox", email.with(json!({}))).await;
    assert_eq!(inbox["messages"][0]["id"], q["id"]);
    ok(
        &r2,
        "phone_send",
        email.with(json!({"reply_to": q["id"], "body": "Done."})),
    )
    .await;
    let lb = cluster.balanced_client().await;
    let answer = ok(&lb, "phone_inbox", coder.with(json!({}))).await;
    assert_eq!(answer["messages"][0]["reply_to"], q["id"]);
    // Through the balancer, consecutive calls land on different replicas;
    // nothing breaks because nothing is kept between them.
    for i in 0..12 {
        ok(&lb, "phone_search", json!({"query": format!("mail {i}")})).await;
    }
    cluster.stop().await;
}

#[tokio::test]
async fn eight_pollers_over_three_replicas_get_a_thousand_messages_exactly_once() {
    const TOTAL: usize = 1000;
    let cluster = Arc::new(Cluster::start().await);
    let c = cluster.client(0).await;
    let alice = register(&c, "alice", "sender", "p").await;
    let bob = register(&c, "bob", "receiver", "p").await;

    let mut senders = Vec::new();
    for s in 0..4 {
        let client = if s % 2 == 0 {
            cluster.balanced_client().await
        } else {
            cluster.client(s % 3).await
        };
        let base = alice.with(json!({"to": "bob"}));
        senders.push(tokio::spawn(async move {
            for i in (s..TOTAL).step_by(4) {
                let mut args = base.clone();
                args["body"] = json!(format!("n{i}"));
                args["idempotency_key"] = json!(format!("k{i}"));
                ok(&client, "phone_send", args).await;
            }
        }));
    }
    // Set once every send is done: until then an empty inbox is a pause of
    // the senders (a stall of a replica, say), not the end.
    let sent_all = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pollers = Vec::new();
    for p in 0..8 {
        let sent_all = sent_all.clone();
        let client = if p == 7 {
            cluster.balanced_client().await
        } else {
            cluster.client(p % 3).await
        };
        let args = bob.with(json!({"limit": 10}));
        pollers.push(tokio::spawn(async move {
            let mut got: Vec<String> = Vec::new();
            let mut idle = 0;
            // Bounded: at most 3,000 polls; stop after 2 s of nothing new
            // once every send is done.
            for _ in 0..3000 {
                let out = ok(&client, "phone_inbox", args.clone()).await;
                let batch: Vec<String> = out["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["body"].as_str().unwrap().to_owned())
                    .collect();
                if batch.is_empty() {
                    if sent_all.load(std::sync::atomic::Ordering::SeqCst) {
                        idle += 1;
                        if idle > 100 {
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                } else {
                    idle = 0;
                    got.extend(batch);
                }
            }
            got
        }));
    }
    for s in senders {
        s.await.unwrap();
    }
    sent_all.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut all = Vec::new();
    for p in pollers {
        all.extend(p.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(
        unique.len(),
        all.len(),
        "{} deliveries were duplicates",
        all.len() - unique.len()
    );
    assert_eq!(all.len(), TOTAL, "every message delivered");
    let unread: i64 = cluster
        .db()
        .await
        .query_one("SELECT count(*) FROM messages WHERE read_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(unread, 0);
    Arc::into_inner(cluster).unwrap().stop().await;
}

#[tokio::test]
async fn races_between_replicas_have_one_winner() {
    let cluster = Cluster::start().await;
    let (r0, r1) = (cluster.client(0).await, cluster.client(1).await);
    let (r0, r1) = (Arc::new(r0), Arc::new(r1));

    // The same name registered at once through two replicas.
    for round in 0..10 {
        let name = format!("racer{round}");
        let args = json!({"name": name, "description": "d", "project": "p"});
        let (a, b) = tokio::join!(
            call(&r0, "phone_register", args.clone()),
            call(&r1, "phone_register", args.clone())
        );
        let outcomes = [&a, &b];
        let winners = outcomes.iter().filter(|r| r.is_error != Some(true)).count();
        assert_eq!(winners, 1, "round {round}: exactly one registration wins");
        let loser = outcomes.iter().find(|r| r.is_error == Some(true)).unwrap();
        assert!(
            text(loser).starts_with("name already registered"),
            "{}",
            text(loser)
        );
        let winner = outcomes.iter().find(|r| r.is_error != Some(true)).unwrap();
        assert!(winner.structured_content.as_ref().unwrap()["token"].is_string());
    }

    // The same idempotency key sent at once through two replicas.
    let alice = register(&r0, "alice", "A", "p").await;
    register(&r0, "bob", "B", "p").await;
    for round in 0..10 {
        let args = alice
            .with(json!({"to": "bob", "body": "once", "idempotency_key": format!("race-{round}")}));
        let (a, b) = tokio::join!(
            ok(&r0, "phone_send", args.clone()),
            ok(&r1, "phone_send", args.clone())
        );
        assert_eq!(a["id"], b["id"]);
        let fresh = [&a, &b].iter().filter(|v| v["replayed"] == false).count();
        assert_eq!(fresh, 1);
    }
    let count: i64 = cluster
        .db()
        .await
        .query_one("SELECT count(*) FROM messages", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 10);
    cluster.stop().await;
}

async fn raw_send(http: &reqwest::Client, url: &str, args: Value) -> Result<Value, String> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "phone_send", "arguments": args}});
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(|e| format!("body cut: {e}"))?;
    if !status.is_success() {
        return Err(format!("status {status}: {text}"));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("bad JSON {e}: {text}"))?;
    Ok(v["result"].clone())
}

#[tokio::test]
async fn sigterm_under_load_finishes_every_accepted_request() {
    let database_url = fresh_database().await;
    let mut replica = Replica::spawn(&database_url, &[("PHONE_SHUTDOWN_GRACE_SECS", "10")]);
    replica.ready().await;
    let url = replica.url();
    let c = client_for(&url, None).await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    drop(c);

    // A long poll in flight when the signal comes must end at once, not be cut.
    let long_poll = {
        let http = reqwest::Client::new();
        let url = url.clone();
        let args = bob.with(json!({"wait_seconds": 25}));
        tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "phone_inbox", "arguments": args}});
            http.post(&url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body.to_string())
                .send()
                .await
                .map(|r| r.status())
        })
    };

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..8 {
        let url = url.clone();
        let base = alice.with(json!({"to": "bob"}));
        let stop = stop.clone();
        let progress = progress.clone();
        workers.push(tokio::spawn(async move {
            // A fresh connection per request: after the signal, new
            // connections are refused rather than accepted and dropped.
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            let (mut acknowledged, mut refused, mut failed) = (Vec::new(), 0, Vec::new());
            for i in 0..2000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let mut args = base.clone();
                args["body"] = json!(format!("w{w}-{i}"));
                args["idempotency_key"] = json!(format!("w{w}-{i}"));
                match raw_send(&http, &url, args).await {
                    Ok(result) if result["isError"] == false => {
                        acknowledged.push(format!("w{w}-{i}"));
                        progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(result) => failed.push(result.to_string()),
                    Err(e) if e.starts_with("transport") => refused += 1,
                    Err(e) => failed.push(e),
                }
                if refused > 20 {
                    break;
                }
            }
            (acknowledged, refused, failed)
        }));
    }
    // Signal once the load is well under way (bounded wait).
    for _ in 0..600 {
        if progress.load(std::sync::atomic::Ordering::Relaxed) >= 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = replica.child.id().expect("replica running");
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(20), replica.child.wait())
        .await
        .expect("the replica exits within its grace period")
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(exit.success(), "exit status {exit}");

    let mut acknowledged = HashSet::new();
    for w in workers {
        let (acked, _refused, failed) = w.await.unwrap();
        assert!(failed.is_empty(), "accepted requests failed: {failed:?}");
        acknowledged.extend(acked);
    }
    assert!(!acknowledged.is_empty(), "the load ran before the signal");
    let status = long_poll
        .await
        .unwrap()
        .expect("the long poll got its answer");
    assert!(status.is_success());

    // Everything stored was acknowledged, and everything acknowledged stored.
    let (db, connection) = tokio_postgres::connect(&database_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let stored: HashSet<String> = db
        .query("SELECT idempotency_key FROM messages", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        stored, acknowledged,
        "a request was processed but its answer lost, or vice versa"
    );
}

async fn client_for(url: &str, bearer: Option<&str>) -> Client {
    use rmcp::ServiceExt;
    let mut config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            url.to_owned(),
        );
    if let Some(token) = bearer {
        config = config.auth_header(token.to_owned());
    }
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    rmcp::model::ClientConfig::new(
        Default::default(),
        rmcp::model::Implementation::new("cluster-tests", "0"),
    )
    .serve(transport)
    .await
    .expect("MCP client connects")
}
