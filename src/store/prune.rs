//! Housekeeping: what is kept only for a while. Refused sends (for `phone
//! admin refused`) and finished webhook deliveries are deleted a week after
//! they happened, and console sessions once they expire, by every replica
//! (idempotent), in bounded batches so that no statement holds locks for
//! long. Messages are kept forever unless the operator sets a retention
//! (`PHONE_RETENTION_DAYS`): then those older than that go the same way.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Client, Store, StoreError};

/// How long refused sends and finished deliveries are kept.
pub const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often each replica looks (and once at start).
const EVERY: Duration = Duration::from_secs(600);
/// Rows deleted per statement; a full batch is followed by another.
const BATCH: i64 = 5_000;

/// `$1` seconds kept, `$2` batch. `refused_sends_at_idx`.
const REFUSED: &str = "DELETE FROM refused_sends WHERE id = ANY (ARRAY(
         SELECT id FROM refused_sends WHERE at < now() - make_interval(secs => $1)
         ORDER BY at LIMIT $2))";
/// `$1` seconds kept, `$2` batch. `webhook_deliveries_finished_idx`.
const DELIVERIES: &str = "DELETE FROM webhook_deliveries WHERE id = ANY (ARRAY(
         SELECT id FROM webhook_deliveries
         WHERE state <> 'pending' AND finished_at < now() - make_interval(secs => $1)
         ORDER BY finished_at LIMIT $2))";

/// Messages older than `$1` seconds among the `$2` oldest (by id), so that a
/// round reads at most `$2` rows whether or not any are old: ids grow with
/// `sent_at` (each statement numbers its messages as it inserts them), so
/// the oldest ids are the oldest messages. A reply to one loses its
/// `reply_to` (ON DELETE SET NULL, `messages_reply_to_idx`). Primary key.
///
/// Returns how many it deleted (`n`) and the groups whose first copy was
/// among them (`groups`): a copy a retry added to a group later may still
/// be kept, and search finds a group by its first copy (`heal_groups`
/// names another).
const MESSAGES: &str = "WITH gone AS (
         DELETE FROM messages WHERE id = ANY (ARRAY(
             SELECT id FROM (SELECT id, sent_at FROM messages ORDER BY id LIMIT $2) oldest
             WHERE sent_at < now() - make_interval(secs => $1)))
         RETURNING id, group_id)
     SELECT (SELECT count(*) FROM gone) AS n,
            ARRAY(SELECT group_id FROM gone WHERE group_id = id) AS groups";

/// How often each replica marks mail past its lifetime.
const EXPIRY_EVERY: Duration = Duration::from_secs(5);
/// Messages marked per statement; a full batch is followed by another.
const EXPIRY_BATCH: i64 = 1_000;

/// Live mail past its lifetime, `$1` at a time, marked dead ('expired',
/// at its expiry): it leaves the unread index, which polls, sends and
/// shares walk (migration V30). Answers still show it expired, not dead
/// (`fragments::DEAD_AT`). Mail still leased waits for its lease to end
/// (its worker may acknowledge it), and rows a poll, a block or a reply's
/// key check holds are left for the next round (NO KEY UPDATE: a foreign
/// key's check does not wait for it). `messages_expiring_idx`.
const EXPIRED: &str = "UPDATE messages m SET dead_at = m.expires_at, dead_reason = 'expired'
     WHERE m.id = ANY (ARRAY(
         SELECT id FROM messages
         WHERE read_at IS NULL AND dead_at IS NULL AND expires_at <= now()
           AND (leased_until IS NULL OR leased_until <= now())
         ORDER BY expires_at LIMIT $1
         FOR NO KEY UPDATE SKIP LOCKED))
       AND m.read_at IS NULL AND m.dead_at IS NULL";

/// Marks mail past its lifetime (see [`EXPIRED`]); how many.
pub async fn expire(db: &Client) -> Result<u64, StoreError> {
    let stmt = db.prepare_cached(EXPIRED).await?;
    let mut marked = 0;
    // Bounded: a backlog is cleared over later rounds.
    for _ in 0..100 {
        let n = db.execute(&stmt, &[&EXPIRY_BATCH]).await?;
        marked += n;
        if n < EXPIRY_BATCH as u64 {
            break;
        }
    }
    Ok(marked)
}

/// Runs [`expire`] every few seconds until `stop`.
pub async fn expire_run(store: Store, stop: CancellationToken) {
    loop {
        let outcome = async { expire(&store.db().await?).await }.await;
        match outcome {
            Ok(0) => {}
            Ok(expired) => tracing::debug!(expired, "marked mail past its lifetime"),
            Err(e) => tracing::warn!(error = %e, "could not mark mail past its lifetime"),
        }
        tokio::select! {
            _ = tokio::time::sleep(EXPIRY_EVERY) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The retention of `PHONE_RETENTION_DAYS` (0: none).
pub fn retention(days: u32) -> Option<Duration> {
    (days > 0).then(|| Duration::from_secs(u64::from(days) * 24 * 3600))
}

/// What one round deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub refused: u64,
    pub deliveries: u64,
    pub sessions: u64,
    pub messages: u64,
}

/// One round: deletes what is older than `keep`, expired console
/// sessions, and messages older than `retention` when there is one.
pub async fn once(
    db: &Client,
    keep: Duration,
    retention: Option<Duration>,
) -> Result<Pruned, StoreError> {
    let keep = keep.as_secs_f64();
    let mut deleted = [0u64; 3];
    for (i, sql) in [REFUSED, DELIVERIES, super::console::EXPIRED]
        .into_iter()
        .enumerate()
    {
        let stmt = db.prepare_cached(sql).await?;
        // Bounded: a backlog of years is cleared over later rounds.
        for _ in 0..100 {
            let n = if i == 2 {
                db.execute(&stmt, &[&BATCH]).await?
            } else {
                db.execute(&stmt, &[&keep, &BATCH]).await?
            };
            deleted[i] += n;
            if n < BATCH as u64 {
                break;
            }
        }
    }
    let mut messages = 0;
    if let Some(retention) = retention {
        let stmt = db.prepare_cached(MESSAGES).await?;
        let secs = retention.as_secs_f64();
        for _ in 0..100 {
            let row = db.query_one(&stmt, &[&secs, &BATCH]).await?;
            let n = row.get::<_, i64>("n") as u64;
            super::messages::heal_groups(db, &row.get::<_, Vec<i64>>("groups")).await?;
            messages += n;
            if n < BATCH as u64 {
                break;
            }
        }
    }
    Ok(Pruned {
        refused: deleted[0],
        deliveries: deleted[1],
        sessions: deleted[2],
        messages,
    })
}

/// Runs [`once`] at start and every ten minutes until `stop`.
pub async fn run(store: Store, stop: CancellationToken, retention: Option<Duration>) {
    loop {
        let outcome = async {
            let db = store.db().await?;
            once(&db, KEEP, retention).await
        }
        .await;
        match outcome {
            Ok(pruned) if pruned == Pruned::default() => {}
            Ok(Pruned {
                refused,
                deliveries,
                sessions,
                messages,
            }) => {
                tracing::info!(
                    refused,
                    deliveries,
                    sessions,
                    messages,
                    "pruned old refused sends, webhook deliveries, console sessions and messages"
                )
            }
            Err(e) => tracing::warn!(error = %e, "could not prune old rows"),
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.cancelled() => return,
        }
    }
}
