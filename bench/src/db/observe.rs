//! What PostgreSQL's statistics say while the server runs: commits and WAL
//! flushes, pg_stat_statements, wait events, notifications on a channel,
//! and the long polls' waiter rows.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use super::{connect, pg_err};

/// Database-wide counters around a phase: transactions and WAL flushes.
#[derive(Clone, Copy, Debug, Default)]
pub struct DbCounters {
    pub commits: i64,
    pub wal_syncs: i64,
}

pub async fn counters(db: &Client, database: &str) -> DbCounters {
    let commits = db
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
            &[&database],
        )
        .await
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0);
    let wal_syncs = db
        .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
        .await
        .map(|r| r.get::<_, i64>(0))
        .unwrap_or(0);
    DbCounters { commits, wal_syncs }
}

#[derive(Clone, Debug)]
pub struct StmtStat {
    pub query: String,
    pub calls: i64,
    pub total_ms: f64,
    pub rows: i64,
    /// Shared buffers hit + read: pages touched, whatever the CPU contention.
    pub blocks: i64,
    /// Times planned (≈ calls when a prepared statement is re-planned on
    /// every execution) and planning time, with track_planning on.
    pub plans: i64,
    pub plan_ms: f64,
}

impl StmtStat {
    /// Run by a replica's own timers, whoever waits or calls: the LISTEN
    /// connection's heartbeat (every 3 s, `failover::PRIMARY_SQL`), the
    /// webhook worker's look for due deliveries, the pruning (`prune.rs`,
    /// expired console sessions). By their exact openings (whitespace
    /// collapsed): other statements that delete, a long poll's removal of
    /// its waiter row above all, are per call and stay counted.
    pub fn from_a_timer(&self) -> bool {
        const TIMERS: &[&str] = &[
            "SELECT NOT (pg_is_in_recovery() OR",
            "WITH due AS MATERIALIZED",
            "DELETE FROM refused_sends WHERE id = ANY (ARRAY( SELECT id FROM refused_sends WHERE at <",
            "DELETE FROM webhook_deliveries WHERE id = ANY (ARRAY( SELECT id FROM webhook_deliveries WHERE state <> 'pending' AND finished_at <",
            "WITH gone AS ( DELETE FROM messages WHERE id = ANY",
            "DELETE FROM console_sessions WHERE secret_hash = ANY (ARRAY( SELECT secret_hash FROM console_sessions WHERE expires_at < now()",
        ];
        TIMERS.iter().any(|t| self.query.starts_with(t))
    }

    /// What a statement of the server is for, by its text.
    pub fn kind(&self) -> &'static str {
        let q = self.query.as_str();
        if q.starts_with("WITH woken AS") {
            // The server's group-commit statement, in the shape of its
            // batch: the parts for sends, for polls, or both.
            match (
                q.contains("INSERT INTO messages"),
                q.contains("SKIP LOCKED"),
            ) {
                (true, true) => "mail: sends+polls",
                (true, false) => "mail: sends",
                _ => "mail: polls",
            }
        } else if q.contains("INSERT INTO messages") {
            "send"
        } else if q.contains("SKIP LOCKED") {
            "poll"
        } else if q.contains("UPDATE agents SET last_seen_at") {
            "presence"
        } else if q.contains("inbox_waiters") {
            "waiters"
        } else if q.contains("token_hash") {
            "auth"
        } else if q.contains("FROM agents") {
            "directory"
        } else {
            "other"
        }
    }
}

/// Clears pg_stat_statements (all databases). Err when the module is not loaded.
pub async fn statements_reset(admin: &Client) -> Result<(), String> {
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .map_err(|e| format!("pg_stat_statements: {}", pg_err(&e)))
}

/// Statements run in `database` since the last reset, the costliest first.
pub async fn statements(admin: &Client, database: &str) -> Result<Vec<StmtStat>, String> {
    let rows = admin
        .query(
            "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time, rows,
                    shared_blks_hit + shared_blks_read, plans, total_plan_time
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = $1 AND calls > 0
             ORDER BY total_exec_time DESC",
            &[&database],
        )
        .await
        .map_err(|e| format!("pg_stat_statements: {}", pg_err(&e)))?;
    Ok(rows
        .iter()
        .map(|r| StmtStat {
            query: r.get(0),
            calls: r.get(1),
            total_ms: r.get(2),
            rows: r.get(3),
            blocks: r.get(4),
            plans: r.get(5),
            plan_ms: r.get(6),
        })
        .collect())
}

/// What the active backends of `database` wait on, sampled every `every`
/// from `from` to `to` (pg_stat_activity): per wait event (`CPU` when none),
/// the average number of backends in it, most first.
pub async fn wait_events(
    admin: &Client,
    database: &str,
    every: Duration,
    from: tokio::time::Instant,
    to: tokio::time::Instant,
) -> Vec<(String, f64)> {
    let mut totals: std::collections::BTreeMap<String, i64> = Default::default();
    let mut samples = 0i64;
    tokio::time::sleep_until(from).await;
    for _ in 0..100_000 {
        if tokio::time::Instant::now() >= to {
            break;
        }
        let Ok(rows) = admin
            .query(
                "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*)
                 FROM pg_stat_activity
                 WHERE datname = $1 AND state = 'active' AND pid <> pg_backend_pid()
                 GROUP BY 1",
                &[&database],
            )
            .await
        else {
            break;
        };
        samples += 1;
        for r in rows {
            *totals.entry(r.get(0)).or_default() += r.get::<_, i64>(1);
        }
        tokio::time::sleep(every).await;
    }
    let mut out: Vec<(String, f64)> = totals
        .into_iter()
        .map(|(k, n)| (k, n as f64 / samples.max(1) as f64))
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// Counts the notifications sent on a channel, from its own LISTEN
/// connection (one more listener for PostgreSQL to signal).
pub struct NotifyCounter {
    received: std::sync::Arc<std::sync::atomic::AtomicU64>,
    _client: Client,
    driver: tokio::task::JoinHandle<()>,
}

impl NotifyCounter {
    pub async fn listen(url: &str, channel: &str) -> Result<Self, String> {
        use futures_util::StreamExt;
        let (client, mut connection) = tokio_postgres::connect(url, NoTls)
            .await
            .map_err(|e| format!("connect {url}: {}", pg_err(&e)))?;
        let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = received.clone();
        // Driving the connection also completes the LISTEN below.
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(_) = message {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(|e| format!("LISTEN {channel}: {}", pg_err(&e)))?;
        Ok(Self {
            received,
            _client: client,
            driver,
        })
    }

    /// Notifications received so far.
    pub fn count(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The count once those of commits just made had time to arrive.
    pub async fn settled_count(&self) -> u64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.count()
    }
}

impl Drop for NotifyCounter {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Looks into `inbox_waiters`, the table a long poll adds its row to once
/// it has found nothing and is about to wait (one prepared statement).
pub struct WaiterRows {
    client: Client,
    count: tokio_postgres::Statement,
}

impl WaiterRows {
    pub async fn connect(url: &str) -> Result<Self, String> {
        let client = connect(url).await?;
        let count = client
            .prepare(
                "SELECT count(DISTINCT agent_id) FROM inbox_waiters
                 WHERE agent_id = ANY($1) AND expires_at > now()",
            )
            .await
            .map_err(|e| format!("prepare waiter count: {}", pg_err(&e)))?;
        Ok(Self { client, count })
    }

    /// How many of `agent_ids` have a live waiter row.
    pub async fn waiting(&self, agent_ids: &[i64]) -> Result<i64, String> {
        self.client
            .query_one(&self.count, &[&agent_ids])
            .await
            .map(|r| r.get(0))
            .map_err(|e| format!("count waiters: {}", pg_err(&e)))
    }

    /// Polls every `every` until all of `agent_ids` wait, or `deadline`.
    /// Returns how many waited at the last look.
    pub async fn until_waiting(
        &self,
        agent_ids: &[i64],
        every: Duration,
        deadline: tokio::time::Instant,
    ) -> Result<i64, String> {
        let mut n = 0;
        for _ in 0..100_000 {
            n = self.waiting(agent_ids).await?;
            if n >= agent_ids.len() as i64 || tokio::time::Instant::now() + every > deadline {
                break;
            }
            tokio::time::sleep(every).await;
        }
        Ok(n)
    }
}
