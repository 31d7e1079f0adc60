//! The chaos harness: the suite's own PostgreSQL (started by
//! `scripts/chaos.sh`), replicas as real `phone` processes, and a TCP proxy
//! that can cut the network between a replica and PostgreSQL.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU8, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    process::{Child, Command},
    sync::watch,
    task::AbortHandle,
};
use tokio_postgres::NoTls;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where logs and the results table go.
pub fn out_dir() -> PathBuf {
    let dir = std::env::var("PHONE_CHAOS_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("target/chaos"));
    std::fs::create_dir_all(dir.join("logs")).expect("create the chaos output folder");
    dir
}

/// The admin URL of the chaos cluster (`scripts/chaos.sh` exports it).
pub fn admin_url() -> String {
    std::env::var("PHONE_CHAOS_DATABASE_URL").expect(
        "PHONE_CHAOS_DATABASE_URL is not set: run the chaos suite with `make chaos` (scripts/chaos.sh), \
         which starts its own PostgreSQL",
    )
}

pub fn pg_port() -> u16 {
    let url = admin_url();
    let after_at = url.rsplit_once('@').map(|(_, h)| h).unwrap_or(&url);
    let hostport = after_at.split('/').next().unwrap_or_default();
    hostport
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("port in PHONE_CHAOS_DATABASE_URL")
}

/// True when known server weaknesses should fail the suite instead of being
/// reported as findings.
pub fn strict() -> bool {
    std::env::var("PHONE_CHAOS_STRICT").is_ok_and(|v| v == "1")
}

pub async fn admin() -> tokio_postgres::Client {
    connect(&admin_url()).await
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the chaos PostgreSQL");
    tokio::spawn(connection);
    client
}

/// A fresh, empty database on the chaos cluster; returns its URL.
pub async fn fresh_database(label: &str) -> String {
    let name = format!("chaos_{label}_{:08x}", rand::random::<u32>());
    admin()
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    db_url(&name, pg_port())
}

/// The URL of database `name` on `port` (the cluster's, or a proxy's).
pub fn db_url(name: &str, port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{name}")
}

pub fn db_name(url: &str) -> String {
    url.rsplit_once('/')
        .expect("URL has a database")
        .1
        .to_owned()
}

/// Stops the chaos cluster in immediate mode (a crash: no checkpoint, every
/// backend killed) through `scripts/chaos.sh pg-crash`.
pub async fn pg_crash() {
    pg_ctl("pg-crash").await;
}

/// Starts the chaos cluster again (crash recovery runs) and waits until it
/// accepts connections.
pub async fn pg_start() {
    pg_ctl("pg-start").await;
}

async fn pg_ctl(what: &str) {
    let status = Command::new(repo_root().join("scripts/chaos.sh"))
        .arg(what)
        .stdin(Stdio::null())
        .status()
        .await
        .unwrap_or_else(|e| panic!("scripts/chaos.sh {what}: {e}"));
    assert!(status.success(), "scripts/chaos.sh {what} failed: {status}");
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind :0")
        .local_addr()
        .unwrap()
        .port()
}

/// One `phone` process. Keeps its port across restarts, so clients' list of
/// replicas stays valid.
pub struct Replica {
    pub name: String,
    pub port: u16,
    env: Vec<(String, String)>,
    /// `prlimit --nofile` for the process, to make descriptor exhaustion cheap.
    nofile: Option<u32>,
    child: Option<Child>,
    starts: u32,
}

impl Replica {
    pub fn new(name: &str, database_url: &str, extra: &[(&str, &str)]) -> Self {
        let port = free_port();
        let mut env: Vec<(String, String)> = vec![
            ("DATABASE_URL".into(), database_url.into()),
            ("PORT".into(), port.to_string()),
            ("PHONE_BIND".into(), "127.0.0.1".into()),
            ("PHONE_POOL_SIZE".into(), "8".into()),
            ("PHONE_POOL_TIMEOUT_MS".into(), "1000".into()),
            ("PHONE_SHUTDOWN_GRACE_SECS".into(), "2".into()),
            // The loads send far more than an agent's default hourly quota:
            // the faults are the subject here, quotas are tested in make test.
            ("PHONE_SEND_QUOTA_PER_HOUR".into(), "0".into()),
            ("RUST_LOG".into(), "warn".into()),
            ("NO_COLOR".into(), "1".into()),
        ];
        for (k, v) in extra {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v.to_string()));
        }
        Self {
            name: name.into(),
            port,
            env,
            nofile: None,
            child: None,
            starts: 0,
        }
    }

    pub fn with_nofile(mut self, limit: u32) -> Self {
        self.nofile = Some(limit);
        self
    }

    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn log_path(&self) -> PathBuf {
        out_dir().join("logs").join(format!("{}.log", self.name))
    }

    /// Spawns the process (appending to its log) without waiting for it.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open replica log");
        let bin = env!("CARGO_BIN_EXE_phone");
        let mut cmd = match self.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .kill_on_drop(true);
        self.child = Some(cmd.spawn().expect("spawn the phone binary"));
        self.starts += 1;
    }

    /// Spawns and waits until `/health` says 200; returns how long that took.
    pub async fn start(&mut self) -> Duration {
        let t0 = Instant::now();
        self.spawn();
        self.wait_healthy(Duration::from_secs(20)).await;
        t0.elapsed()
    }

    pub async fn wait_healthy(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if health(&self.base()).await == Some(200) {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "{} exited during startup ({status}); see {}",
                    self.name,
                    self.log_path().display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not healthy within {within:?}; see {}",
                self.name,
                self.log_path().display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9: no graceful shutdown, requests in flight are cut.
    pub async fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(pid.to_string())
                    .status()
                    .await;
            }
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }
}

/// Lines of the replicas' logs that show a panic (there must be none).
pub fn panics_in_logs(replicas: &[&Replica]) -> Vec<String> {
    let mut found = Vec::new();
    for r in replicas {
        if let Ok(text) = std::fs::read_to_string(r.log_path()) {
            found.extend(
                text.lines()
                    .filter(|l| l.contains("panicked"))
                    .map(|l| format!("{}: {l}", r.name)),
            );
        }
    }
    found
}

/// GET /health with a short timeout: the status, or None when unreachable.
pub async fn health(base: &str) -> Option<u16> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .ok()?;
    client
        .get(format!("{base}/health"))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// Whether the replica's LISTEN connection is up, as /health reports it
/// (`notifications`: "listening" or "reconnecting"); None when unreachable.
pub async fn listening(base: &str) -> Option<bool> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .ok()?;
    let body: serde_json::Value = client
        .get(format!("{base}/health"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(body["notifications"].as_str()? == "listening")
}

// ---------------------------------------------------------------------------
// A TCP proxy between one replica and PostgreSQL.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Bytes flow.
    Up = 0,
    /// Every connection is closed and new ones are closed at once (a peer
    /// that is gone: connection refused / reset).
    Refuse = 1,
    /// Nothing flows in either direction, nothing is closed (a silent
    /// partition: packets dropped). Held bytes flow again when restored.
    Blackhole = 2,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<AtomicU8>,
    changed: watch::Sender<Link>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(AtomicU8::new(Link::Up as u8));
        let (changed, _) = watch::channel(Link::Up);
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let (state, conns, changed) = (state.clone(), conns.clone(), changed.clone());
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    if state.load(Ordering::SeqCst) == Link::Refuse as u8 {
                        drop(client);
                        continue;
                    }
                    let rx = changed.subscribe();
                    let task = tokio::spawn(pipe(client, upstream, rx));
                    let mut all = conns.lock().unwrap();
                    all.retain(|h| !h.is_finished());
                    all.push(task.abort_handle());
                }
            })
            .abort_handle()
        };
        Self {
            port,
            state,
            changed,
            conns,
            accept,
        }
    }

    pub fn set(&self, link: Link) {
        self.state.store(link as u8, Ordering::SeqCst);
        if link == Link::Refuse {
            for h in self.conns.lock().unwrap().drain(..) {
                h.abort();
            }
        }
        self.changed.send_replace(link);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

/// Waits until the link is up; false when it was cut for good (Refuse).
async fn link_up(rx: &mut watch::Receiver<Link>) -> bool {
    loop {
        match *rx.borrow_and_update() {
            Link::Up => return true,
            Link::Refuse => return false,
            Link::Blackhole => {}
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}

async fn pipe(client: TcpStream, upstream: SocketAddr, mut rx: watch::Receiver<Link>) {
    // A connection attempt during a blackhole gets no answer until the link heals.
    if !link_up(&mut rx).await {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(copy(cr, sw, rx.clone()));
    let down = tokio::spawn(copy(sr, cw, rx));
    // When this task is aborted (Refuse), both halves must go too.
    struct Both(AbortHandle, AbortHandle);
    impl Drop for Both {
        fn drop(&mut self) {
            self.0.abort();
            self.1.abort();
        }
    }
    let _guard = Both(up.abort_handle(), down.abort_handle());
    let _ = tokio::join!(up, down);
}

async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut rx: watch::Receiver<Link>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !link_up(&mut rx).await {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
