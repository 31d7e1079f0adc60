//! Statements of the operator's commands (`phone admin …`).

use super::{Client, StoreError};

/// `$1` name, `$2` true to suspend, false to lift it. The active agent of
/// that name; returns whether one changed. `agents_active_name_idx`.
const SUSPEND: &str = "UPDATE agents
     SET suspended_at = CASE WHEN $2 THEN coalesce(suspended_at, now()) END, updated_at = now()
     WHERE name = $1 AND unregistered_at IS NULL AND (suspended_at IS NULL) = $2
     RETURNING id";

pub async fn suspend(db: &Client, name: &str, suspend: bool) -> Result<bool, StoreError> {
    let stmt = db.prepare_cached(SUSPEND).await?;
    Ok(db.query_opt(&stmt, &[&name, &suspend]).await?.is_some())
}

/// Whether `$1` names a registered agent, and whether it is suspended.
const STATE: &str =
    "SELECT suspended_at IS NOT NULL FROM agents WHERE name = $1 AND unregistered_at IS NULL";

pub async fn suspended(db: &Client, name: &str) -> Result<Option<bool>, StoreError> {
    let stmt = db.prepare_cached(STATE).await?;
    Ok(db.query_opt(&stmt, &[&name]).await?.map(|r| r.get(0)))
}

/// The agents that sent most in the last `$1` hours, with their refused
/// sends: name, sent, refused; `$2` rows. `messages_day_idx` does not
/// help here: a bounded window of the newest ids, by the primary key.
const TOP_SENDERS: &str = "WITH sent AS (
         SELECT sender_id, count(*) AS n FROM messages
         WHERE sent_at > now() - make_interval(hours => $1) GROUP BY sender_id),
     refused AS (
         SELECT sender_id, count(*) AS n FROM refused_sends
         WHERE at > now() - make_interval(hours => $1) GROUP BY sender_id)
     SELECT a.name, coalesce(s.n, 0) AS sent, coalesce(r.n, 0) AS refused,
            a.suspended_at IS NOT NULL AS suspended
     FROM (SELECT sender_id FROM sent UNION SELECT sender_id FROM refused) x
     JOIN agents a ON a.id = x.sender_id
     LEFT JOIN sent s ON s.sender_id = x.sender_id
     LEFT JOIN refused r ON r.sender_id = x.sender_id
     ORDER BY coalesce(s.n, 0) + coalesce(r.n, 0) DESC, a.name LIMIT $2";

pub struct SenderLine {
    pub name: String,
    pub sent: i64,
    pub refused: i64,
    pub suspended: bool,
}

pub async fn top_senders(
    db: &Client,
    hours: i32,
    rows: i64,
) -> Result<Vec<SenderLine>, StoreError> {
    let stmt = db.prepare_cached(TOP_SENDERS).await?;
    Ok(db
        .query(&stmt, &[&hours, &rows])
        .await?
        .iter()
        .map(|r| SenderLine {
            name: r.get("name"),
            sent: r.get("sent"),
            refused: r.get("refused"),
            suspended: r.get("suspended"),
        })
        .collect())
}

/// Refused sends of the last `$1` hours by sender, recipient and reason
/// (each row counts its `hits`); `$2` rows. `refused_sends_at_idx`.
const REFUSED: &str = "SELECT s.name AS sender, coalesce(r.name, '') AS recipient, x.reason,
            sum(x.hits)::bigint AS n, max(x.at) AS last
     FROM refused_sends x
     JOIN agents s ON s.id = x.sender_id
     LEFT JOIN agents r ON r.id = x.recipient_id
     WHERE x.at > now() - make_interval(hours => $1)
     GROUP BY s.name, r.name, x.reason
     ORDER BY sum(x.hits) DESC, s.name LIMIT $2";

pub struct RefusedLine {
    pub sender: String,
    pub recipient: String,
    pub reason: String,
    pub count: i64,
    pub last: chrono::DateTime<chrono::Utc>,
}

pub async fn refused(db: &Client, hours: i32, rows: i64) -> Result<Vec<RefusedLine>, StoreError> {
    let stmt = db.prepare_cached(REFUSED).await?;
    Ok(db
        .query(&stmt, &[&hours, &rows])
        .await?
        .iter()
        .map(|r| RefusedLine {
            sender: r.get("sender"),
            recipient: r.get("recipient"),
            reason: r.get("reason"),
            count: r.get("n"),
            last: r.get("last"),
        })
        .collect())
}

/// Registered agents unseen for `$1` days (never seen: since they
/// registered), longest unseen first, `$2` at most. Reads the agents table
/// (an operator's command, not a hot path).
const STALE: &str = "SELECT id, name, project, last_seen_at FROM agents
     WHERE unregistered_at IS NULL
       AND coalesce(last_seen_at, registered_at) < now() - make_interval(days => $1)
     ORDER BY coalesce(last_seen_at, registered_at), id LIMIT $2";

/// An agent `phone admin stale` lists.
#[derive(Debug, Clone)]
pub struct StaleAgent {
    pub id: i64,
    pub name: String,
    pub project: String,
    pub last_seen_at: Option<chrono::DateTime<chrono::Utc>>,
}

pub async fn stale(db: &Client, days: i32, rows: i64) -> Result<Vec<StaleAgent>, StoreError> {
    let stmt = db.prepare_cached(STALE).await?;
    Ok(db
        .query(&stmt, &[&days, &rows])
        .await?
        .iter()
        .map(|r| StaleAgent {
            id: r.get("id"),
            name: r.get("name"),
            project: r.get("project"),
            last_seen_at: r.get("last_seen_at"),
        })
        .collect())
}
