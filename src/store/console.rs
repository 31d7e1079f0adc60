//! Statements of the console (`/console`): its sessions, the listings a
//! person reads (which change nothing: no read mark, no lease, no presence),
//! and the operator's overview over the analytics views.

use std::sync::LazyLock;

use chrono::{DateTime, NaiveDate, Utc};

use super::fragments::{SENDER_LOOKUP, key_range, message_columns};
use super::rows::{Delivery, Message};
use super::{Client, StoreError};

/// Who a console session belongs to.
#[derive(Debug, Clone)]
pub enum SessionOwner {
    /// An agent, with the token digest it signed in with (still its token).
    Agent {
        id: i64,
        name: String,
        project: String,
        token_hash: Vec<u8>,
    },
    /// An operator, with the digest of the admin token it signed in with.
    Operator { admin_hash: Vec<u8> },
}

#[derive(Debug, Clone)]
pub struct Session {
    pub owner: SessionOwner,
    pub csrf: String,
    pub expires_at: DateTime<Utc>,
}

/// Sessions an agent keeps: a sign-in beyond ends its oldest. A person
/// has a few browsers; a script signing in again and again (each sign-in a
/// row kept for the session's hours) has no more than these.
pub const SESSIONS_PER_AGENT: i64 = 20;

/// A new session, and the agent's sessions beyond the newest
/// `SESSIONS_PER_AGENT - 1` ended (`console_sessions_agent_idx`). Sign-ins
/// at the same instant may each keep one more, for as long as they last.
static CREATE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH ended AS (
             DELETE FROM console_sessions WHERE secret_hash = ANY (ARRAY(
                 SELECT secret_hash FROM console_sessions
                 WHERE $2::bigint IS NOT NULL AND agent_id = $2
                 ORDER BY created_at DESC OFFSET {kept})))
         INSERT INTO console_sessions
             (secret_hash, agent_id, token_hash, operator_hash, csrf, expires_at)
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
        kept = SESSIONS_PER_AGENT - 1
    )
});

/// Stores a session for `secret_hash`, valid for `ttl_secs`.
pub async fn create_session(
    db: &Client,
    secret_hash: &[u8],
    owner: &SessionOwner,
    csrf: &str,
    ttl_secs: f64,
) -> Result<(), StoreError> {
    let (agent, token, admin): (Option<i64>, Option<&[u8]>, Option<&[u8]>) = match owner {
        SessionOwner::Agent { id, token_hash, .. } => (Some(*id), Some(token_hash), None),
        SessionOwner::Operator { admin_hash } => (None, None, Some(admin_hash)),
    };
    let stmt = db.prepare_cached(&CREATE).await?;
    db.execute(
        &stmt,
        &[&secret_hash, &agent, &token, &admin, &csrf, &ttl_secs],
    )
    .await?;
    Ok(())
}

/// The live session of `$1`: not expired, and for an agent, still the
/// agent's token and the agent registered and not suspended. Primary key.
const SESSION: &str = "SELECT s.agent_id, s.token_hash, s.operator_hash, s.csrf, s.expires_at,
            a.name, a.project
     FROM console_sessions s
     LEFT JOIN agents a ON a.id = s.agent_id AND a.token_hash = s.token_hash
          AND a.unregistered_at IS NULL AND a.suspended_at IS NULL
     WHERE s.secret_hash = $1 AND s.expires_at > now()
       AND (s.agent_id IS NULL OR a.id IS NOT NULL)";

pub async fn session(db: &Client, secret_hash: &[u8]) -> Result<Option<Session>, StoreError> {
    let stmt = db.prepare_cached(SESSION).await?;
    let Some(row) = db.query_opt(&stmt, &[&secret_hash]).await? else {
        return Ok(None);
    };
    let owner = match row.get::<_, Option<i64>>("agent_id") {
        Some(id) => SessionOwner::Agent {
            id,
            name: row.get("name"),
            project: row.get("project"),
            token_hash: row.get("token_hash"),
        },
        None => SessionOwner::Operator {
            admin_hash: row.get("operator_hash"),
        },
    };
    Ok(Some(Session {
        owner,
        csrf: row.get("csrf"),
        expires_at: row.get("expires_at"),
    }))
}

const DELETE: &str = "DELETE FROM console_sessions WHERE secret_hash = $1";

pub async fn delete_session(db: &Client, secret_hash: &[u8]) -> Result<bool, StoreError> {
    // Not behind the sync-standby guard, as signing in is not: a sign-out
    // refused while no standby is there left the session open (and the
    // browser's cookie set).
    let stmt = db.prepare_cached(DELETE).await?;
    Ok(db.execute(&stmt, &[&secret_hash]).await? > 0)
}

/// A message as its recipient's console lists it, with where it stands.
#[derive(Debug, Clone)]
pub struct Received {
    pub message: Message,
    pub state: Delivery,
}

/// The state of `messages m`, as the outbox names it.
const STATE: &str = "CASE WHEN m.acked_at IS NOT NULL THEN 'acknowledged'
          WHEN m.read_at IS NOT NULL THEN 'read'
          WHEN m.dead_reason = 'expired' THEN 'expired'
          WHEN m.dead_at IS NOT NULL THEN 'dead'
          WHEN m.expires_at <= now() THEN 'expired'
          WHEN m.leased_until > now() THEN 'leased'
          ELSE 'waiting' END AS state";

/// `$1`'s received mail, newest first, before id `$2` (NULL: the newest),
/// `$3` rows; `filter` narrows it. Two statements, not one with a flag: a
/// generic plan cannot tell that a flag makes the unread condition hold,
/// so it kept the unread view off the partial unread index and walked
/// every read message of a long history to find the few unread ones.
fn inbox_sql(filter: &str, index_order: &str) -> String {
    format!(
        "SELECT {}, {STATE}
         FROM (SELECT * FROM messages m
               WHERE {} {filter}
               ORDER BY {index_order}
               LIMIT $3) m
         {SENDER_LOOKUP}
         JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.id DESC",
        message_columns("r.name"),
        key_range("recipient_id", "$1::bigint", "NULL::bigint", "$2::bigint")
    )
}

/// All of it: a key range of `messages_inbox_cover_idx`.
static INBOX: LazyLock<String> = LazyLock::new(|| inbox_sql("", "m.recipient_id DESC, m.id DESC"));
/// Unread only: the partial unread index (`messages_unread_idx`).
static INBOX_UNREAD: LazyLock<String> = LazyLock::new(|| {
    inbox_sql(
        "AND m.read_at IS NULL AND m.dead_at IS NULL",
        "m.recipient_id DESC, m.id DESC",
    )
});

pub async fn inbox(
    db: &Client,
    recipient: i64,
    before: Option<i64>,
    fetch: i64,
    unread_only: bool,
) -> Result<Vec<Received>, StoreError> {
    let sql: &str = if unread_only { &INBOX_UNREAD } else { &INBOX };
    let stmt = db.prepare_cached(sql).await?;
    let rows = db.query(&stmt, &[&recipient, &before, &fetch]).await?;
    Ok(rows
        .iter()
        .map(|r| Received {
            message: Message::from_row(r),
            state: Delivery::parse(r.get("state")),
        })
        .collect())
}

/// Unread mail of `$1`, counted up to `$2` (a page header, not a scan of a
/// backlog). The partial unread index.
const UNREAD: &str = "SELECT count(*) FROM (
         SELECT 1 FROM messages m WHERE m.recipient_id = $1 AND m.read_at IS NULL
           AND m.dead_at IS NULL LIMIT $2) u";

pub async fn unread(db: &Client, recipient: i64, cap: i64) -> Result<i64, StoreError> {
    let stmt = db.prepare_cached(UNREAD).await?;
    Ok(db.query_one(&stmt, &[&recipient, &cap]).await?.get(0))
}

/// One conversation in a list of threads.
#[derive(Debug, Clone)]
pub struct ThreadSummary {
    pub thread_id: i64,
    pub subject: Option<String>,
    /// The other party of its first message, from the agent's side.
    pub with: String,
    pub messages: i64,
    pub unread: i64,
    pub last_id: i64,
    pub last_at: DateTime<Utc>,
}

/// Messages of each side (sent, received) one threads page walks, at most:
/// the page costs the same however large the mailbox (0.41 s at 200k
/// messages when it grouped all of them).
pub const THREADS_WALK: i64 = 500;
/// A thread's counts stop here (shown as "N+").
pub const THREAD_COUNT_MAX: i64 = 1000;

/// The conversations `$1` took part in, latest activity first, whose latest
/// message is before id `$2` (NULL: all), `$3` rows. It walks the agent's
/// newest `$4` sent and `$4` received messages (key ranges of the sender
/// and recipient indexes), not its whole mail: where a walk stopped short
/// (`walk_bound`, the larger of the two sides' oldest ids walked, when one
/// was cut), only threads whose latest message is at or after it are known
/// for certain, and the next page continues from there. Threads with any
/// message at or after `$2` were on an earlier page. Counts come from the
/// thread index, up to [`THREAD_COUNT_MAX`]. Always one row at least (a
/// NULL thread when there is none), carrying `walk_bound`.
static THREADS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH sent AS MATERIALIZED (
             SELECT m.thread_id, m.id FROM messages m
             WHERE {sent} ORDER BY m.sender_id DESC, m.id DESC LIMIT $4),
         got AS MATERIALIZED (
             SELECT m.thread_id, m.id FROM messages m
             WHERE {got} AND m.sender_id <> $1
             ORDER BY m.recipient_id DESC, m.id DESC LIMIT $4),
         bound AS (
             SELECT greatest(
                 CASE WHEN (SELECT count(*) FROM sent) >= $4 THEN (SELECT min(id) FROM sent) END,
                 CASE WHEN (SELECT count(*) FROM got) >= $4 THEN (SELECT min(id) FROM got) END) AS b),
         t AS (
             SELECT x.thread_id, max(x.id) AS last_id
             FROM (SELECT * FROM sent UNION ALL SELECT * FROM got) x
             GROUP BY x.thread_id
             HAVING max(x.id) >= coalesce((SELECT b FROM bound), 0)
                AND ($2::bigint IS NULL OR NOT EXISTS (
                        SELECT 1 FROM messages y
                        WHERE (y.thread_id, y.id) >= (x.thread_id, $2::bigint)
                          AND y.thread_id = x.thread_id
                          AND (y.sender_id = $1 OR y.recipient_id = $1)))
             ORDER BY max(x.id) DESC LIMIT $3)
         SELECT t.thread_id, t.last_id, last.sent_at AS last_at, root.subject,
                CASE WHEN root.sender_id = $1 THEN r.name ELSE s.name END AS with,
                (SELECT count(*) FROM (
                     SELECT 1 FROM messages c
                     WHERE c.thread_id = t.thread_id AND (c.sender_id = $1 OR c.recipient_id = $1)
                     LIMIT {cap}) n) AS messages,
                (SELECT count(*) FROM (
                     SELECT 1 FROM messages c
                     WHERE c.thread_id = t.thread_id AND c.recipient_id = $1 AND c.read_at IS NULL
                     LIMIT {cap}) n) AS unread,
                w.b AS walk_bound
         FROM bound w
         LEFT JOIN t ON true
         LEFT JOIN messages last ON last.id = t.last_id
         LEFT JOIN messages root ON root.id = t.thread_id
         LEFT JOIN agents s ON s.id = root.sender_id
         LEFT JOIN agents r ON r.id = root.recipient_id
         ORDER BY t.last_id DESC",
        sent = key_range("sender_id", "$1::bigint", "NULL::bigint", "$2::bigint"),
        got = key_range("recipient_id", "$1::bigint", "NULL::bigint", "$2::bigint"),
        cap = THREAD_COUNT_MAX,
    )
});

/// A page of threads, and where the walk stopped short (see [`THREADS`]).
pub async fn threads(
    db: &Client,
    agent: i64,
    before: Option<i64>,
    fetch: i64,
) -> Result<(Vec<ThreadSummary>, Option<i64>), StoreError> {
    let stmt = db.prepare_cached(&THREADS).await?;
    let rows = db
        .query(&stmt, &[&agent, &before, &fetch, &THREADS_WALK])
        .await?;
    let walk_bound = rows.first().and_then(|r| r.get("walk_bound"));
    let threads = rows
        .iter()
        .filter_map(|r| {
            Some(ThreadSummary {
                thread_id: r.get::<_, Option<i64>>("thread_id")?,
                subject: r.get("subject"),
                with: r.get("with"),
                messages: r.get("messages"),
                unread: r.get("unread"),
                last_id: r.get("last_id"),
                last_at: r.get("last_at"),
            })
        })
        .collect();
    Ok((threads, walk_bound))
}

/// What the operator's overview shows.
#[derive(Debug, Clone, Default)]
pub struct Overview {
    pub agents: i64,
    pub agents_seen_today: i64,
    pub agents_suspended: i64,
    pub messages: i64,
    /// The last `days` UTC days, oldest first, each with its count (0 for a
    /// day without mail).
    pub daily: Vec<(NaiveDate, i64)>,
    /// Projects by messages sent and received over those days.
    pub projects: Vec<ProjectCount>,
    /// Agents with the most unread mail.
    pub backlog: Vec<Backlog>,
    pub unread: i64,
    pub waiters: i64,
    pub webhooks_pending: i64,
    pub webhooks_due: i64,
    pub webhooks_oldest_due: Option<DateTime<Utc>>,
    pub webhooks_failed_today: i64,
}

#[derive(Debug, Clone)]
pub struct ProjectCount {
    pub project: String,
    pub sent: i64,
    pub received: i64,
}

#[derive(Debug, Clone)]
pub struct Backlog {
    pub agent: String,
    pub project: String,
    pub unread: i64,
    pub oldest_unread_at: Option<DateTime<Utc>>,
}

const COUNTS: &str = "SELECT
        (SELECT count(*) FROM agents WHERE unregistered_at IS NULL) AS agents,
        (SELECT count(*) FROM agents WHERE unregistered_at IS NULL
           AND last_seen_at > now() - interval '1 day') AS seen_today,
        (SELECT count(*) FROM agents WHERE unregistered_at IS NULL
           AND suspended_at IS NOT NULL) AS suspended,
        (SELECT coalesce(max(id), 0) FROM messages) AS messages,
        (SELECT count(*) FROM messages WHERE read_at IS NULL AND dead_at IS NULL) AS unread,
        (SELECT count(*) FROM inbox_waiters WHERE expires_at > now()) AS waiters,
        (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending') AS pending,
        (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'
           AND next_at <= now()) AS due,
        (SELECT min(next_at) FROM webhook_deliveries WHERE state = 'pending'
           AND next_at <= now()) AS oldest_due,
        (SELECT count(*) FROM webhook_deliveries WHERE state = 'failed'
           AND finished_at > now() - interval '1 day') AS failed_today";

/// `$1` days, ending today (UTC); days without mail count 0.
const DAILY: &str = "SELECT d::date AS day, coalesce(v.messages, 0) AS messages
     FROM generate_series((now() AT TIME ZONE 'UTC')::date - ($1::int - 1),
                          (now() AT TIME ZONE 'UTC')::date, interval '1 day') d
     LEFT JOIN analytics.daily_messages v
            ON v.day = d::date
           AND v.day >= (now() AT TIME ZONE 'UTC')::date - ($1::int - 1)
     ORDER BY 1";

const PROJECTS: &str =
    "SELECT project, sum(sent)::bigint AS sent, sum(received)::bigint AS received
     FROM analytics.project_daily_messages
     WHERE day >= (now() AT TIME ZONE 'UTC')::date - ($1::int - 1)
     GROUP BY project ORDER BY sum(sent) + sum(received) DESC, project LIMIT $2";

const BACKLOG: &str = "SELECT agent, project, unread, oldest_unread_at
     FROM analytics.unread_backlog WHERE unregistered_at IS NULL
     ORDER BY unread DESC, agent LIMIT $1";

/// The overview over the last `days` days, with `top` rows per table.
pub async fn overview(db: &Client, days: i32, top: i64) -> Result<Overview, StoreError> {
    let row = db.query_one(COUNTS, &[]).await?;
    let daily = db
        .query(DAILY, &[&days])
        .await?
        .iter()
        .map(|r| (r.get("day"), r.get("messages")))
        .collect();
    let projects = db
        .query(PROJECTS, &[&days, &top])
        .await?
        .iter()
        .map(|r| ProjectCount {
            project: r.get("project"),
            sent: r.get("sent"),
            received: r.get("received"),
        })
        .collect();
    let backlog = db
        .query(BACKLOG, &[&top])
        .await?
        .iter()
        .map(|r| Backlog {
            agent: r.get("agent"),
            project: r.get("project"),
            unread: r.get("unread"),
            oldest_unread_at: r.get("oldest_unread_at"),
        })
        .collect();
    Ok(Overview {
        agents: row.get("agents"),
        agents_seen_today: row.get("seen_today"),
        agents_suspended: row.get("suspended"),
        messages: row.get("messages"),
        daily,
        projects,
        backlog,
        unread: row.get("unread"),
        waiters: row.get("waiters"),
        webhooks_pending: row.get("pending"),
        webhooks_due: row.get("due"),
        webhooks_oldest_due: row.get("oldest_due"),
        webhooks_failed_today: row.get("failed_today"),
    })
}

/// Expired sessions, `$1` at a time. `console_sessions_expires_idx`.
pub(super) const EXPIRED: &str = "DELETE FROM console_sessions WHERE secret_hash = ANY (ARRAY(
         SELECT secret_hash FROM console_sessions WHERE expires_at < now()
         ORDER BY expires_at LIMIT $1))";
