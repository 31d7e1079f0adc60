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

const CREATE: &str = "INSERT INTO console_sessions
         (secret_hash, agent_id, token_hash, operator_hash, csrf, expires_at)
     VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))";

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
    let stmt = db.prepare_cached(CREATE).await?;
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
          WHEN m.dead_at IS NOT NULL THEN 'dead'
          WHEN m.leased_until > now() THEN 'leased'
          ELSE 'waiting' END AS state";

/// `$1`'s received mail, newest first, before id `$2` (NULL: the newest),
/// `$3` rows; with `$4`, unread only. A key range of
/// `messages_inbox_cover_idx` (unread only: of the partial unread index).
static INBOX: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, {STATE}
         FROM (SELECT * FROM messages m
               WHERE {} AND (NOT $4 OR (m.read_at IS NULL AND m.dead_at IS NULL))
               ORDER BY m.recipient_id DESC, m.id DESC
               LIMIT $3) m
         {SENDER_LOOKUP}
         JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.id DESC",
        message_columns("r.name"),
        key_range("recipient_id", "$1::bigint", "NULL::bigint", "$2::bigint")
    )
});

pub async fn inbox(
    db: &Client,
    recipient: i64,
    before: Option<i64>,
    fetch: i64,
    unread_only: bool,
) -> Result<Vec<Received>, StoreError> {
    let stmt = db.prepare_cached(&INBOX).await?;
    let rows = db
        .query(&stmt, &[&recipient, &before, &fetch, &unread_only])
        .await?;
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

/// The conversations `$1` took part in, latest activity first, whose latest
/// message is before id `$2` (NULL: all), `$3` rows. Reads the agent's
/// messages through the sender and recipient indexes.
const THREADS: &str = "WITH mine AS (
         SELECT m.thread_id, m.id, m.sent_at, m.recipient_id = $1 AND m.read_at IS NULL AS unread
         FROM messages m WHERE m.sender_id = $1
         UNION ALL
         SELECT m.thread_id, m.id, m.sent_at, m.read_at IS NULL
         FROM messages m WHERE m.recipient_id = $1 AND m.sender_id <> $1),
     t AS (
         SELECT thread_id, max(id) AS last_id, max(sent_at) AS last_at, count(*) AS messages,
                count(*) FILTER (WHERE unread) AS unread
         FROM mine GROUP BY thread_id
         HAVING $2::bigint IS NULL OR max(id) < $2
         ORDER BY max(id) DESC LIMIT $3)
     SELECT t.*, root.subject,
            CASE WHEN root.sender_id = $1 THEN r.name ELSE s.name END AS with
     FROM t
     JOIN messages root ON root.id = t.thread_id
     JOIN agents s ON s.id = root.sender_id
     JOIN agents r ON r.id = root.recipient_id
     ORDER BY t.last_id DESC";

pub async fn threads(
    db: &Client,
    agent: i64,
    before: Option<i64>,
    fetch: i64,
) -> Result<Vec<ThreadSummary>, StoreError> {
    let stmt = db.prepare_cached(THREADS).await?;
    let rows = db.query(&stmt, &[&agent, &before, &fetch]).await?;
    Ok(rows
        .iter()
        .map(|r| ThreadSummary {
            thread_id: r.get("thread_id"),
            subject: r.get("subject"),
            with: r.get("with"),
            messages: r.get("messages"),
            unread: r.get("unread"),
            last_id: r.get("last_id"),
            last_at: r.get("last_at"),
        })
        .collect())
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
