//! Direct PostgreSQL work: databases, bulk seeding with generate_series,
//! counting what the server stored, and the raw-SQL baselines (pgbench,
//! pg_test_fsync).

use std::{path::Path, process::Stdio, time::Duration};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_postgres::{Client, NoTls};

/// tokio-postgres prints only "db error"; the server's message is inside.
pub fn pg_err(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

pub async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("connect {url}: {}", pg_err(&e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

pub async fn recreate_database(admin: &Client, name: &str) -> Result<(), String> {
    // Neither statement may run in a transaction block: one at a time.
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("{sql}: {}", pg_err(&e)))?;
    }
    Ok(())
}

/// Drops a table's plain secondary indexes (not primary keys, not unique
/// ones) before a bulk load and returns their definitions for
/// `recreate_indexes`: one sorted build afterwards is several times cheaper
/// than maintaining them row by row. The definitions come from the
/// database itself, so the schema stays the server's own.
pub async fn drop_secondary_indexes(db: &Client, table: &str) -> Result<Vec<String>, String> {
    let rows = db
        .query(
            "SELECT i.relname::text, pg_get_indexdef(i.oid)
             FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
             WHERE x.indrelid = $1::text::regclass AND NOT x.indisunique AND NOT x.indisprimary",
            &[&table],
        )
        .await
        .map_err(|e| format!("list indexes of {table}: {}", pg_err(&e)))?;
    let mut defs = Vec::new();
    for r in &rows {
        let name: String = r.get(0);
        each(db, &[&format!("DROP INDEX {name}")]).await?;
        defs.push(r.get(1));
    }
    Ok(defs)
}

pub async fn recreate_indexes(db: &Client, defs: &[String]) -> Result<(), String> {
    each(db, &["SET maintenance_work_mem = '512MB'"]).await?;
    for d in defs {
        each(db, &[d.as_str()]).await?;
    }
    each(db, &["RESET maintenance_work_mem"]).await
}

/// Statements that refuse transaction blocks (VACUUM), one by one.
pub async fn each(db: &Client, statements: &[&str]) -> Result<(), String> {
    for sql in statements {
        db.batch_execute(sql)
            .await
            .map_err(|e| format!("{sql}: {}", pg_err(&e)))?;
    }
    Ok(())
}

pub async fn scalar_i64(db: &Client, sql: &str) -> Result<i64, String> {
    db.query_one(sql, &[])
        .await
        .map(|r| r.get(0))
        .map_err(|e| format!("{sql}: {}", pg_err(&e)))
}

pub async fn show(db: &Client, setting: &str) -> String {
    db.query_one(&format!("SHOW {setting}"), &[])
        .await
        .map(|r| r.get::<_, String>(0))
        .unwrap_or_else(|e| format!("? ({})", pg_err(&e)))
}

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

/// The messages the server really stored and marked read in a time window.
pub async fn count_window(
    db: &Client,
    names: &[String],
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> Result<(i64, i64), String> {
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE m.sent_at >= $2 AND m.sent_at < $3),
                    count(*) FILTER (WHERE m.read_at >= $2 AND m.read_at < $3)
             FROM messages m JOIN agents a ON a.id = m.sender_id
             WHERE a.name = ANY($1)",
            &[&names, &from, &to],
        )
        .await
        .map_err(|e| format!("count messages: {}", pg_err(&e)))?;
    Ok((row.get(0), row.get(1)))
}

/// Ids of agents in the order of `names`; pgbench needs them consecutive.
pub async fn consecutive_ids(db: &Client, names: &[String]) -> Result<i64, String> {
    let rows = db
        .query(
            "SELECT name, id FROM agents WHERE name = ANY($1)",
            &[&names],
        )
        .await
        .map_err(|e| format!("agent ids: {}", pg_err(&e)))?;
    let id_of = |n: &String| {
        rows.iter()
            .find(|r| r.get::<_, &str>(0) == n)
            .map(|r| r.get::<_, i64>(1))
    };
    let base = id_of(&names[0]).ok_or("first agent missing")?;
    for (i, n) in names.iter().enumerate() {
        if id_of(n) != Some(base + i as i64) {
            return Err(format!(
                "agent ids are not consecutive ({n} is not {base}+{i}); pgbench pairing needs them"
            ));
        }
    }
    Ok(base)
}

const ROLES: &[&str] = &[
    "Invoice assistant",
    "Email triage agent",
    "Calendar planner",
    "Code review bot",
    "Data analyst",
    "Support agent",
    "Research assistant",
    "Translation agent",
    "DevOps helper",
    "Sales assistant",
    "Recruiting coordinator",
    "Legal reviewer",
    "Security auditor",
    "Marketing writer",
    "Travel planner",
    "Inventory tracker",
    "QA tester",
    "Documentation writer",
    "Billing specialist",
    "Meeting summarizer",
];
const DOMAINS: &[&str] = &[
    "finance",
    "billing",
    "support",
    "platform engineering",
    "marketing",
    "sales",
    "legal",
    "people ops",
    "logistics",
    "security",
    "research",
    "operations",
    "data",
    "mobile",
    "payments",
    "compliance",
    "infrastructure",
    "design",
    "procurement",
    "customer success",
];
const CAPABILITIES: &[&str] = &[
    "summarize meeting notes",
    "triage support tickets",
    "reconcile invoices",
    "review pull requests",
    "translate documents between English and German",
    "schedule meetings across time zones",
    "monitor Kubernetes clusters",
    "draft marketing emails",
    "analyze weekly sales data",
    "answer customer questions",
    "generate regression test cases",
    "write SQL queries",
    "label training data",
    "plan travel itineraries",
    "track shipping orders",
    "audit access logs",
    "forecast inventory levels",
    "prepare quarterly tax reports",
    "book conference rooms",
    "moderate forum posts",
    "transcribe audio recordings",
    "scan contracts for risky clauses",
    "tune database indexes",
    "deploy web services",
    "rotate API credentials",
    "benchmark model latency",
    "curate research papers",
    "onboard new employees",
    "update CRM records",
    "resolve billing disputes",
    "file expense reports",
    "chase overdue payments",
    "write release notes",
    "triage failing CI builds",
    "extract tables from PDF files",
    "clean messy spreadsheets",
    "answer HR policy questions",
    "draft job descriptions",
    "check GDPR compliance",
    "localize app strings",
];
const TOOLS: &[&str] = &[
    "Slack",
    "Jira",
    "GitHub",
    "Postgres",
    "Salesforce",
    "Google Sheets",
    "Notion",
    "Zendesk",
    "Stripe",
    "S3",
    "Snowflake",
    "Figma",
    "Confluence",
    "Gmail",
    "PDF files",
    "Excel",
    "REST APIs",
    "Google Calendar",
    "Linear",
    "HubSpot",
];
const EXTRAS: &[&str] = &[
    "Replies within minutes.",
    "Works best with structured input.",
    "Escalates to a human when unsure.",
    "Available around the clock.",
    "Returns results as Markdown tables.",
    "Keeps an audit trail of every change.",
    "Prefers batched requests.",
    "Can handle attachments up to 10 MB.",
    "Speaks English, French and Spanish.",
    "Runs nightly and on demand.",
    "Asks clarifying questions before acting.",
    "",
];
/// Each appears in about 1 of 10,000 descriptions.
pub const RARE: &[&str] = &[
    "vexillology",
    "horology",
    "speleology",
    "mycology",
    "numismatics",
    "falconry",
    "marquetry",
    "glaciology",
    "papyrology",
    "philately",
    "lepidoptera",
    "seismograph",
    "astrolabe",
    "calligraphy",
    "oenology",
    "cartography",
    "bioluminescence",
    "hieroglyphs",
    "quasicrystals",
    "zymurgy",
];
/// Skewed: the first ones are much more common (power(random(), 2)).
pub const PROJECTS: &[&str] = &[
    "atlas",
    "apollo",
    "helios",
    "orion",
    "zephyr",
    "nimbus",
    "aurora",
    "cobalt",
    "falcon",
    "gemini",
    "hermes",
    "ion",
    "juniper",
    "kepler",
    "lumen",
    "meridian",
    "nova",
    "onyx",
    "pegasus",
    "quartz",
    "raven",
    "sierra",
    "titan",
    "umbra",
    "vega",
    "willow",
    "xenon",
    "yukon",
    "zenith",
    "acme-billing",
    "acme-support",
    "acme-data",
    "northwind",
    "contoso",
    "fabrikam",
    "globex",
    "initech",
    "umbrella",
    "hooli",
    "piedpiper",
    "stark-labs",
    "wayne-ops",
    "tyrell",
    "cyberdyne",
    "soylent",
    "wonka",
    "gringotts",
    "oscorp",
    "vandelay",
    "dunder-mifflin",
    "prestige",
    "monarch",
    "massive-dynamic",
    "aperture",
    "black-mesa",
    "blue-sun",
    "weyland",
    "virtucon",
    "genco",
    "krusty",
];

fn sql_array(items: &[&str]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("'{}'", s.replace('\'', "''")))
        .collect();
    format!("ARRAY[{}]", quoted.join(","))
}

fn pick(items: &[&str]) -> String {
    format!(
        "({})[1 + floor(random() * {})::int]",
        sql_array(items),
        items.len()
    )
}

/// A token the bench can reconstruct for seeded agent `g` (prefix tells the
/// seeded sets apart).
pub fn seeded_token(prefix: char, g: i64) -> String {
    format!("phn_{prefix}{g:0>42}")
}

/// Directory agents g in [from, to]: realistic, varied descriptions.
pub async fn seed_directory(db: &Client, from: i64, to: i64) -> Result<(), String> {
    let sql = format!(
        "INSERT INTO agents (name, description, project, token_hash, registered_at, last_seen_at)
         SELECT lower(regexp_replace(role, '[^A-Za-z]+', '-', 'g')) || '-' || g,
                format('%s for the %s team. I %s and %s, working with %s and %s. %s%s',
                       role, domain, cap1, cap2, tool1, tool2, extra,
                       CASE WHEN rare_roll < 0.002 THEN ' Also knows ' || rare || '.' ELSE '' END),
                project,
                sha256(convert_to('phn_s' || lpad(g::text, 42, '0'), 'UTF8')),
                now() - random() * interval '365 days',
                CASE WHEN random() < 0.7 THEN now() - random() * interval '30 days' END
         FROM (SELECT g, {role} AS role, {domain} AS domain, {cap} AS cap1, {cap} AS cap2,
                      {tool} AS tool1, {tool} AS tool2, {extra} AS extra, random() AS rare_roll,
                      {rare} AS rare,
                      ({projects})[1 + floor(power(random(), 2) * {nprojects})::int] AS project
               FROM generate_series($1::bigint, $2::bigint) g) w",
        role = pick(ROLES),
        domain = pick(DOMAINS),
        cap = pick(CAPABILITIES),
        tool = pick(TOOLS),
        extra = pick(EXTRAS),
        rare = pick(RARE),
        projects = sql_array(PROJECTS),
        nprojects = PROJECTS.len(),
    );
    db.execute(&sql, &[&from, &to])
        .await
        .map_err(|e| format!("seed directory: {}", pg_err(&e)))?;
    Ok(())
}

/// `n` agents named `{prefix}-1` … `{prefix}-n` in `project`, with tokens
/// `seeded_token(prefix, g)`: registered in one statement instead of `n`
/// calls of `phone_register`.
pub async fn seed_agents(db: &Client, prefix: char, project: &str, n: i64) -> Result<(), String> {
    db.execute(
        "INSERT INTO agents (name, description, project, token_hash)
         SELECT $1 || '-' || g, 'Benchmark agent ' || g || ' of ' || $2 || ': reads its inbox in a loop.', $2,
                sha256(convert_to('phn_' || $1 || lpad(g::text, 42, '0'), 'UTF8'))
         FROM generate_series(1, $3::bigint) g",
        &[&prefix.to_string(), &project, &n],
    )
    .await
    .map_err(|e| format!("seed agents {prefix}-*: {}", pg_err(&e)))?;
    Ok(())
}

/// `n` mailbox owners for the growth test, named g-1..g-n, tokens known.
pub async fn seed_mailbox_agents(db: &Client, n: i64) -> Result<i64, String> {
    seed_agents(db, 'g', "growth", n).await?;
    scalar_i64(db, "SELECT min(id) FROM agents WHERE project = 'growth'").await
}

/// Agent ids in the order of `names`.
pub async fn ids_by_name(db: &Client, names: &[String]) -> Result<Vec<i64>, String> {
    let rows = db
        .query(
            "SELECT n.id FROM unnest($1::text[]) WITH ORDINALITY AS x(name, i)
             LEFT JOIN agents n ON n.name = x.name ORDER BY x.i",
            &[&names],
        )
        .await
        .map_err(|e| format!("agent ids: {}", pg_err(&e)))?;
    rows.iter()
        .zip(names)
        .map(|(r, n)| {
            r.get::<_, Option<i64>>(0)
                .ok_or_else(|| format!("agent {n} not found"))
        })
        .collect()
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

/// Messages addressed to `recipient_ids`: (all, still unread).
pub async fn addressed_to(db: &Client, recipient_ids: &[i64]) -> Result<(i64, i64), String> {
    let row = db
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE read_at IS NULL)
             FROM messages WHERE recipient_id = ANY($1)",
            &[&recipient_ids],
        )
        .await
        .map_err(|e| format!("count messages: {}", pg_err(&e)))?;
    Ok((row.get(0), row.get(1)))
}

/// History messages g in [from, to] among `agents` agents starting at id
/// `base`: recipient g mod agents. Agents with slot < `all_read_slots` have
/// every history message read; the others leave 1 in 100 unread.
pub async fn seed_history(
    db: &Client,
    base: i64,
    agents: i64,
    all_read_slots: i64,
    from: i64,
    to: i64,
) -> Result<(), String> {
    db.execute(
        "INSERT INTO messages (id, sender_id, recipient_id, subject, body, thread_id, sent_at, read_at)
         SELECT id, $1 + (g * 7919 + 13) % $2, $1 + g % $2,
                CASE WHEN g % 3 = 0 THEN 'Status update ' || g END,
                'Progress note ' || g || ': the nightly import finished, 1423 rows merged, 2 rejected '
                  || '(bad dates). Details are in the usual bucket; tell me if you want a retry.',
                id, ts,
                CASE WHEN g % $2 < $3 OR g % 100 <> 0 THEN ts + interval '1 minute' END
         FROM (SELECT nextval('messages_id_seq') AS id, g,
                      timestamptz '2025-01-01' + g * interval '1 second' AS ts
               FROM generate_series($4::bigint, $5::bigint) g) x",
        &[&base, &agents, &all_read_slots, &from, &to],
    )
    .await
    .map_err(|e| format!("seed history: {}", pg_err(&e)))?;
    Ok(())
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
    /// What a statement of the server is for, by its text.
    pub fn kind(&self) -> &'static str {
        let q = self.query.as_str();
        if q.contains("INSERT INTO messages") && q.contains("SKIP LOCKED") {
            // The server's group-commit statement: sends and polls together.
            "send+poll"
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

#[derive(Clone, Copy, Debug)]
pub enum Seed {
    Directory,
    History {
        base: i64,
        agents: i64,
        all_read_slots: i64,
    },
}

/// Seeds g in [from, to] in chunks over `conns` parallel sessions, taking
/// no new chunk after `deadline`. Returns the last g loaded: chunks are
/// handed out in order and each one started is finished, so [from, result]
/// is complete. Sessions skip foreign-key triggers (the rows reference
/// agents that exist by construction) and commit asynchronously: this is
/// set-up, not measurement.
pub async fn seed_parallel(
    url: &str,
    what: Seed,
    from: i64,
    to: i64,
    chunk: i64,
    conns: usize,
    deadline: std::time::Instant,
) -> Result<i64, String> {
    use std::sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    };
    let next = Arc::new(AtomicI64::new(from));
    let done = Arc::new(AtomicI64::new(from - 1));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let client = connect(url).await?;
        let (next, done) = (next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            each(
                &client,
                &[
                    "SET session_replication_role = replica",
                    "SET synchronous_commit = off",
                ],
            )
            .await?;
            for _ in 0..1_000_000 {
                if std::time::Instant::now() >= deadline {
                    break;
                }
                let a = next.fetch_add(chunk, Ordering::SeqCst);
                if a > to {
                    break;
                }
                let b = (a + chunk - 1).min(to);
                match what {
                    Seed::Directory => seed_directory(&client, a, b).await?,
                    Seed::History {
                        base,
                        agents,
                        all_read_slots,
                    } => seed_history(&client, base, agents, all_read_slots, a, b).await?,
                }
                done.fetch_max(b, Ordering::SeqCst);
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    // Every chunk handed out was finished, so the highest end is the prefix.
    Ok(done
        .load(Ordering::SeqCst)
        .min(next.load(Ordering::SeqCst) - 1)
        .min(to))
}

pub struct PgbenchResult {
    pub tps: f64,
    pub failed: u64,
    pub latency_ms: f64,
}

/// pgbench, prepared, `clients` clients: client k is agent base+k and
/// pairs with k^1 like the mix; each transaction is the mix's minimal SQL:
/// one INSERT (a send) and one UPDATE … SKIP LOCKED … RETURNING (a poll),
/// each its own autocommit transaction. Returns the running child; see
/// `pgbench_finish`.
#[allow(clippy::too_many_arguments)]
pub fn pgbench_start(
    bin: &Path,
    host: &str,
    port: u16,
    database: &str,
    base_id: i64,
    clients: usize,
    secs: u64,
    script: &Path,
) -> Result<tokio::process::Child, String> {
    let body = crate::load::BODY;
    std::fs::write(
        script,
        format!(
            "\\set me {base_id} + :client_id\n\
             \\set peer {base_id} + (:client_id # 1)\n\
             INSERT INTO messages (id, sender_id, recipient_id, body, thread_id) SELECT n, :me, :peer, '{body}', n FROM nextval('messages_id_seq') AS n;\n\
             UPDATE messages SET read_at = now() WHERE id IN (SELECT id FROM messages WHERE recipient_id = :me AND read_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id, sender_id, subject, body, reply_to, thread_id, sent_at;\n"
        ),
    )
    .map_err(|e| format!("write pgbench script: {e}"))?;
    pgbench_spawn(bin, host, port, database, clients, secs, script)
}

/// `pgbench -n -M prepared` of `script` with `clients` clients for `secs`.
fn pgbench_spawn(
    bin: &Path,
    host: &str,
    port: u16,
    database: &str,
    clients: usize,
    secs: u64,
    script: &Path,
) -> Result<tokio::process::Child, String> {
    tokio::process::Command::new(bin.join("pgbench"))
        .args(["-n", "-M", "prepared", "-h", host, "-U", "postgres"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-c")
        .arg(clients.to_string())
        .arg("-j")
        .arg(clients.min(2).to_string())
        .arg("-T")
        .arg(secs.to_string())
        .arg("-f")
        .arg(script)
        .arg(database)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("run pgbench: {e}"))
}

/// The popular inbox's baseline: `clients` pgbench clients on one
/// recipient `hot`, the even ones senders (client k is agent
/// `sender_base + (k/2) % senders`), the odd ones pollers, like the
/// bench's closed loop. A send is the mix baseline's INSERT; a poll its
/// `UPDATE … SKIP LOCKED … RETURNING` with the one recipient. With a lease
/// (`Some(seconds)`), the poll leases instead (`leased_until`,
/// `delivery_count`) and, when it took any, a second statement
/// acknowledges them by id (`acked_at`, `read_at`), as `phone_ack` does.
/// Each statement is its own autocommit transaction.
#[allow(clippy::too_many_arguments)]
pub fn pgbench_hot_start(
    bin: &Path,
    host: &str,
    port: u16,
    database: &str,
    hot: i64,
    sender_base: i64,
    senders: usize,
    lease: Option<u32>,
    clients: usize,
    secs: u64,
    script: &Path,
) -> Result<tokio::process::Child, String> {
    std::fs::write(script, hot_script(hot, sender_base, senders, lease))
        .map_err(|e| format!("write pgbench script: {e}"))?;
    pgbench_spawn(bin, host, port, database, clients, secs, script)
}

/// The pgbench script of `pgbench_hot_start`.
pub fn hot_script(hot: i64, sender_base: i64, senders: usize, lease: Option<u32>) -> String {
    let body = crate::load::BODY;
    let send = format!(
        "\\set s {sender_base} + (:client_id / 2) % {senders}\n\
         INSERT INTO messages (id, sender_id, recipient_id, body, thread_id) SELECT n, :s, {hot}, '{body}', n FROM nextval('messages_id_seq') AS n;\n"
    );
    let poll = match lease {
        None => format!(
            "UPDATE messages SET read_at = now() WHERE id IN (SELECT id FROM messages WHERE recipient_id = {hot} AND read_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id, sender_id, subject, body, reply_to, thread_id, sent_at;\n"
        ),
        Some(secs) => format!(
            "WITH l AS (UPDATE messages SET leased_until = now() + interval '{secs} seconds', delivery_count = delivery_count + 1 WHERE id IN (SELECT id FROM messages WHERE recipient_id = {hot} AND read_at IS NULL AND dead_at IS NULL AND (leased_until IS NULL OR leased_until <= now()) ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id, sender_id, subject, body, reply_to, thread_id, sent_at, delivery_count) SELECT count(*) AS n, coalesce(array_agg(id), '{{}}') AS ids FROM l \\gset\n\
             \\if :n > 0\n\
             UPDATE messages SET acked_at = now(), read_at = now(), leased_until = NULL WHERE id = ANY (:ids::bigint[]) AND recipient_id = {hot} AND acked_at IS NULL;\n\
             \\endif\n"
        ),
    };
    format!("\\if :client_id % 2 = 0\n{send}\\else\n{poll}\\endif\n")
}

/// Messages to `recipient` sent, and read (in lease mode: acknowledged,
/// which sets `read_at` too), inside a time window.
pub async fn count_inbox_window(
    db: &Client,
    recipient: i64,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> Result<(i64, i64), String> {
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE sent_at >= $2 AND sent_at < $3),
                    count(*) FILTER (WHERE read_at >= $2 AND read_at < $3)
             FROM messages WHERE recipient_id = $1",
            &[&recipient, &from, &to],
        )
        .await
        .map_err(|e| format!("count messages: {}", pg_err(&e)))?;
    Ok((row.get(0), row.get(1)))
}

/// One message of an inbox as the database holds it.
#[derive(Clone, Copy, Debug)]
pub struct InboxRow {
    pub id: i64,
    pub read: bool,
    pub acked: bool,
    pub deliveries: i32,
}

/// Every message addressed to `recipient`.
pub async fn inbox_rows(db: &Client, recipient: i64) -> Result<Vec<InboxRow>, String> {
    let rows = db
        .query(
            "SELECT id, read_at IS NOT NULL, acked_at IS NOT NULL, delivery_count
             FROM messages WHERE recipient_id = $1",
            &[&recipient],
        )
        .await
        .map_err(|e| format!("inbox rows: {}", pg_err(&e)))?;
    Ok(rows
        .iter()
        .map(|r| InboxRow {
            id: r.get(0),
            read: r.get(1),
            acked: r.get(2),
            deliveries: r.get(3),
        })
        .collect())
}

pub async fn pgbench_finish(
    child: tokio::process::Child,
    secs: u64,
) -> Result<PgbenchResult, String> {
    let out = tokio::time::timeout(Duration::from_secs(secs + 60), child.wait_with_output())
        .await
        .map_err(|_| "pgbench did not finish in time".to_string())?
        .map_err(|e| format!("pgbench: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("pgbench failed: {text}"));
    }
    let number_after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
    };
    Ok(PgbenchResult {
        tps: number_after("tps = ").ok_or_else(|| format!("no tps in pgbench output: {text}"))?,
        failed: number_after("number of failed transactions:").unwrap_or(0.0) as u64,
        latency_ms: number_after("latency average =").unwrap_or(0.0),
    })
}

/// pg_test_fsync's "one 8kB write" fdatasync rate; stops the tool as soon
/// as that line is out (the full run takes ~20 s even at -s 1).
pub async fn fdatasync_rate(bin: &Path, file: &Path) -> Result<f64, String> {
    let mut child = tokio::process::Command::new(bin.join("pg_test_fsync"))
        .args(["-s", "1", "-f"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("run pg_test_fsync: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("fdatasync")
                && let Some(n) = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<f64>().ok())
            {
                return Some(n);
            }
        }
        None
    })
    .await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = std::fs::remove_file(file);
    match found {
        Ok(Some(n)) => Ok(n),
        _ => Err("pg_test_fsync printed no fdatasync rate".into()),
    }
}

/// Every unread message marked read: the inboxes of the webhook and policy
/// phases start each run empty, so the server's unread-backlog check
/// (`PHONE_INBOX_UNREAD_MAX`) costs every run the same.
pub async fn mark_all_read(db: &Client) -> Result<(), String> {
    db.batch_execute("UPDATE messages SET read_at = now() WHERE read_at IS NULL")
        .await
        .map_err(|e| format!("mark read: {}", pg_err(&e)))
}

/// Webhook deliveries waiting (`state = 'pending'`, claimed or not).
pub async fn webhooks_pending(db: &Client) -> Result<i64, String> {
    scalar_i64(
        db,
        "SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'",
    )
    .await
}

/// Webhook deliveries that ended delivered inside a time window.
pub async fn webhooks_delivered(
    db: &Client,
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> Result<i64, String> {
    db.query_one(
        "SELECT count(*) FROM webhook_deliveries
         WHERE state = 'delivered' AND finished_at >= $1 AND finished_at < $2",
        &[&from, &to],
    )
    .await
    .map(|r| r.get(0))
    .map_err(|e| format!("count deliveries: {}", pg_err(&e)))
}

/// The deliveries of these messages by state: (state, deliveries, of
/// them with more than one attempt); and messages with no delivery at all.
pub async fn webhook_states(
    db: &Client,
    message_ids: &[i64],
) -> Result<(Vec<(String, i64, i64)>, i64), String> {
    let rows = db
        .query(
            "SELECT state, count(*), count(*) FILTER (WHERE attempts > 1)
             FROM webhook_deliveries WHERE message_id = ANY($1)
             GROUP BY state ORDER BY state",
            &[&message_ids],
        )
        .await
        .map_err(|e| format!("delivery states: {}", pg_err(&e)))?;
    let none = db
        .query_one(
            "SELECT count(*) FROM unnest($1::bigint[]) AS m(id)
             WHERE NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.message_id = m.id)",
            &[&message_ids],
        )
        .await
        .map_err(|e| format!("delivery states: {}", pg_err(&e)))?
        .get(0);
    Ok((
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
        none,
    ))
}

/// Refused sends (`refused_sends`) of the agents named, since `since`.
pub async fn refused_since(
    db: &Client,
    senders: &[String],
    since: chrono::DateTime<chrono::Utc>,
) -> Result<i64, String> {
    db.query_one(
        "SELECT count(*) FROM refused_sends r JOIN agents a ON a.id = r.sender_id
         WHERE a.name = ANY($1) AND r.at >= $2",
        &[&senders, &since],
    )
    .await
    .map(|r| r.get(0))
    .map_err(|e| format!("count refusals: {}", pg_err(&e)))
}
