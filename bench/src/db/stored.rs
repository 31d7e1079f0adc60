//! What the server stored, read behind its back: messages sent and read in
//! a window, an inbox's rows, the webhook queue, refusals; and every
//! message marked read between runs.

use tokio_postgres::Client;

use super::{pg_err, scalar_i64};

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

/// Refused sends (`refused_sends`) of the agents named, since `since`: the
/// table keeps one row per sender, recipient, reason and hour with a count
/// of its refusals (`hits`, migration V11), so the refusals are its sum.
/// A row counts whole if it was hit since `since` (a hit sets `at`): its
/// earlier hits in the same hour count too, so the callers count senders
/// that were refused nothing before `since` (each phase's own database).
pub async fn refused_since(
    db: &Client,
    senders: &[String],
    since: chrono::DateTime<chrono::Utc>,
) -> Result<i64, String> {
    db.query_one(
        "SELECT coalesce(sum(r.hits), 0)::bigint FROM refused_sends r JOIN agents a ON a.id = r.sender_id
         WHERE a.name = ANY($1) AND r.at >= $2",
        &[&senders, &since],
    )
    .await
    .map(|r| r.get(0))
    .map_err(|e| format!("count refusals: {}", pg_err(&e)))
}
