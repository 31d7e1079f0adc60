//! The servers under test: `target/release/phone` replicas started on
//! 127.0.0.1 with the bench's environment, waited for until healthy, their
//! idle memory read, and stopped (SIGTERM, then SIGKILL).

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use crate::cli::{Opts, pg_url};
use crate::mcp::{self, Target};
use crate::stats::{self, Mem};

pub(crate) struct Replica {
    child: tokio::process::Child,
    pub(crate) pid: u32,
    pub(crate) port: u16,
    pub(crate) role: String,
    pub(crate) idle: Mem,
}

pub(crate) async fn start_replicas(
    opts: &Opts,
    database: &str,
    n: usize,
    first_port: u16,
    role: &str,
) -> Result<Vec<Replica>, String> {
    start_replicas_env(opts, database, n, first_port, role, &[]).await
}

/// For the load phases (mix, rate, popular inbox, webhooks, contact
/// policies, long polls, growth): the quotas an agent meets first raised
/// out of reach, not off. Their agents send thousands of messages an hour
/// each, to hundreds of recipients, past the defaults (1,000 an hour; 100
/// new recipients a day; 500 unread of one sender in one inbox), which
/// refused most sends of a full run's popular inbox and thousands of the
/// webhooks and policy phases' sends (`tool_error`), and measured
/// refusals. Every quota check still runs, as for agents within the
/// defaults; the `quotas` phase measures quotas on against off.
pub(crate) const QUOTAS_OUT_OF_REACH: [(&str, &str); 3] = [
    ("PHONE_SEND_QUOTA_PER_HOUR", "1000000"),
    ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "1000000"),
    ("PHONE_INBOX_UNREAD_PER_SENDER", "1000000"),
];

/// `start_replicas` with more environment variables for the replicas.
pub(crate) async fn start_replicas_env(
    opts: &Opts,
    database: &str,
    n: usize,
    first_port: u16,
    role: &str,
    env: &[(&str, &str)],
) -> Result<Vec<Replica>, String> {
    start_replicas_bin(opts, database, n, first_port, role, env, None).await
}

/// `start_replicas_env` of another build of the server (`bin`; the one
/// beside phone-bench when `None`).
pub(crate) async fn start_replicas_bin(
    opts: &Opts,
    database: &str,
    n: usize,
    first_port: u16,
    role: &str,
    env: &[(&str, &str)],
    bin: Option<&Path>,
) -> Result<Vec<Replica>, String> {
    let bin = match bin {
        Some(bin) => bin.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .parent()
            .ok_or("no exe dir")?
            .join("phone"),
    };
    if !bin.exists() {
        return Err(format!(
            "{} not found: build it with cargo build --release",
            bin.display()
        ));
    }
    let url = pg_url(opts, database);
    let log_dir = Path::new("data/bench/logs");
    std::fs::create_dir_all(log_dir).map_err(|e| e.to_string())?;
    let mut replicas = Vec::new();
    for i in 0..n {
        let port = first_port + i as u16;
        let log = std::fs::File::create(log_dir.join(format!("{role}-{}.log", i + 1)))
            .map_err(|e| e.to_string())?;
        let child = tokio::process::Command::new(&bin)
            .env("DATABASE_URL", &url)
            .env("PORT", port.to_string())
            .env("PHONE_BIND", "127.0.0.1")
            .env("PHONE_POOL_SIZE", opts.pool_size.to_string())
            // The replicas share the cores with PostgreSQL and the generator:
            // one worker each, as CONFIGURATION.md advises there (measured:
            // bench/RESULTS.md, seventh session). TOKIO_WORKER_THREADS for
            // builds from before PHONE_WORKER_THREADS (`before`).
            .env("PHONE_WORKER_THREADS", "1")
            .env("TOKIO_WORKER_THREADS", "1")
            .env("RUST_LOG", "warn")
            // Every bench agent registers from 127.0.0.1: lift the per-address limit.
            .env("PHONE_REGISTER_LIMIT", "0")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let pid = child.id().ok_or("replica exited at once")?;
        replicas.push(Replica {
            child,
            pid,
            port,
            role: format!("{role} #{}", i + 1),
            idle: Mem::default(),
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for r in &mut replicas {
        loop {
            if let Ok(Some(status)) = r.child.try_wait() {
                return Err(format!(
                    "replica on port {} exited ({status}) during startup; see data/bench/logs/ (port in use?)",
                    r.port
                ));
            }
            if mcp::health(&Target::local(r.port)).await {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "replica on port {} not healthy within 60 s",
                    r.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Idle: started, migrated, answered /health and one MCP handshake.
    for r in &replicas {
        let _ = mcp::Conn::open(&Target::local(r.port)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for r in &mut replicas {
        r.idle = stats::mem(r.pid).unwrap_or_default();
    }
    Ok(replicas)
}

pub(crate) async fn stop_replicas(replicas: Vec<Replica>) {
    for mut r in replicas {
        // SIGTERM for a graceful stop; SIGKILL if it lingers.
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(r.pid.to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(10), r.child.wait())
            .await
            .is_err()
        {
            let _ = r.child.kill().await;
        }
    }
}

pub(crate) fn targets(replicas: &[Replica]) -> Vec<Target> {
    replicas.iter().map(|r| Target::local(r.port)).collect()
}

pub(crate) fn pids(replicas: &[Replica]) -> Vec<u32> {
    replicas.iter().map(|r| r.pid).collect()
}
