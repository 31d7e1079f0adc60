//! Sends in one statement: verify each caller, resolve each recipient,
//! insert, and wake the recipients that wait in a long poll.

use chrono::{DateTime, Utc};

use std::sync::Arc;

use super::{PendingWakes, Write};
use crate::domain::{presence_write, types::TokenHash, wakeup::CHANNEL};
use crate::store::{Pool, StoreError};

/// One send, resolved as far as the request alone allows. Not `Debug`: it
/// holds a token digest and a message body, which logs must never show.
#[derive(Clone)]
pub(crate) struct QueuedSend {
    pub token: TokenHash,
    pub claimed: Option<String>,
    pub to_name: String,
    pub subject: Option<String>,
    pub body: String,
    pub reply_to: Option<i64>,
    pub thread_id: Option<i64>,
    pub idempotency_key: Option<String>,
    /// A reply's recipient, by id (a name may have been re-registered).
    pub to_id: Option<i64>,
}

/// What the statement did with one send.
#[derive(Debug, Clone)]
pub(crate) struct SendOutcome {
    /// The sender, when its token (and claimed name) were accepted.
    pub me_id: Option<i64>,
    /// The stored message; `None` when the recipient is unknown or the
    /// idempotency key was already used.
    pub stored: Option<Stored>,
}

#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub id: i64,
    pub thread_id: i64,
    pub sent_at: DateTime<Utc>,
}

/// Writes batches of sends.
pub(crate) struct SendWrite {
    pub pool: Pool,
    pub wakes: Arc<PendingWakes>,
}

impl Write for SendWrite {
    type Item = QueuedSend;
    type Outcome = SendOutcome;

    /// One statement for the whole batch; one outcome per send, in order.
    /// It also wakes the recipients of earlier batches (committed before it
    /// began); its own recipients wait for a later statement.
    async fn write(&self, sends: &[QueuedSend]) -> Result<Vec<SendOutcome>, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(&SEND_BATCH_SQL).await?;
        let tokens: Vec<&[u8]> = sends.iter().map(|s| s.token.as_bytes()).collect();
        let claimed: Vec<Option<&str>> = sends.iter().map(|s| s.claimed.as_deref()).collect();
        let to_names: Vec<&str> = sends.iter().map(|s| s.to_name.as_str()).collect();
        let subjects: Vec<Option<&str>> = sends.iter().map(|s| s.subject.as_deref()).collect();
        let bodies: Vec<&str> = sends.iter().map(|s| s.body.as_str()).collect();
        let reply_tos: Vec<Option<i64>> = sends.iter().map(|s| s.reply_to).collect();
        let threads: Vec<Option<i64>> = sends.iter().map(|s| s.thread_id).collect();
        let keys: Vec<Option<&str>> = sends.iter().map(|s| s.idempotency_key.as_deref()).collect();
        let to_ids: Vec<Option<i64>> = sends.iter().map(|s| s.to_id).collect();
        let to_wake = self.wakes.take();
        let rows = match client
            .query(
                &stmt,
                &[
                    &tokens, &claimed, &to_names, &subjects, &bodies, &reply_tos, &threads, &keys,
                    &to_ids, &to_wake,
                ],
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                self.wakes.add(to_wake);
                return Err(e);
            }
        };
        let mut stored_for = Vec::with_capacity(sends.len());
        let mut outcomes = vec![
            SendOutcome {
                me_id: None,
                stored: None,
            };
            sends.len()
        ];
        for row in rows {
            let ord: i64 = row.get("ord");
            let Some(outcome) = usize::try_from(ord - 1)
                .ok()
                .and_then(|i| outcomes.get_mut(i))
            else {
                continue;
            };
            outcome.me_id = row.get("me_id");
            if let Some(recipient) = row.get::<_, Option<i64>>("recipient_id") {
                stored_for.push(recipient);
            }
            outcome.stored = row.get::<_, Option<i64>>("id").map(|id| Stored {
                id,
                thread_id: row.get("thread_id"),
                sent_at: row.get("sent_at"),
            });
        }
        self.wakes.add(stored_for);
        Ok(outcomes)
    }

    fn has_follow_up(&self) -> bool {
        !self.wakes.is_empty()
    }

    /// Wakes the waiters of what the last batches stored, in a statement
    /// that began after their commit, when no batch took them along.
    async fn follow_up(&self) {
        let to_wake = self.wakes.take();
        if to_wake.is_empty() {
            return;
        }
        let outcome = async {
            let client = self.pool.get().await?;
            let stmt = client.prepare_cached(&WAKE_SQL).await?;
            client.query(&stmt, &[&to_wake]).await?;
            Ok::<_, StoreError>(())
        }
        .await;
        if let Err(e) = outcome {
            // The waiters' own timeout still ends their wait.
            tracing::warn!(error = %e, "could not wake waiting pollers");
        }
    }
}

/// Wakes the long polls of the given recipients: a NOTIFY where one
/// waits (its `inbox_waiters` row), nothing otherwise, so sends nobody
/// waits for pay no NOTIFY (NOTIFY serialises commits).
///
/// Why after the commit, in a later statement: a long poll registers its
/// row, then looks for mail; a send inserts, then looks for waiters. Were
/// both looks in the writing statement's own snapshot, a send that began
/// before the row was committed and committed after the poll looked would
/// be seen by neither side, and the poll would sleep through its mail
/// (the wake phase of `make bench` caught 9 of 160). A statement that
/// begins after the send's commit sees every row committed before the
/// poll looked.
pub(crate) fn wake_sql(recipients: &str) -> String {
    format!(
        "SELECT count(pg_notify('{CHANNEL}', r.agent_id::text)) AS n
         FROM (SELECT DISTINCT agent_id FROM unnest((SELECT {recipients}::bigint[])) AS u(agent_id)) r
         WHERE EXISTS (SELECT 1 FROM inbox_waiters w
                       WHERE w.agent_id = r.agent_id AND w.expires_at > now())"
    )
}

/// The wake-ups alone, when no batch follows: `$1` recipients.
static WAKE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| wake_sql("$1"));

/// The batch send statement, built once. Arrays, one element per send:
/// `$1` token digests, `$2` claimed names, `$3` recipient names, `$4`
/// subjects, `$5` bodies, `$6` reply_to, `$7` threads, `$8` idempotency
/// keys, `$9` recipient ids (replies), `$10` recipients of earlier
/// batches to wake (`PendingWakes`). Each lookup is a LATERAL subquery
/// with OFFSET 0, so it stays one index probe per send whatever the
/// planner thinks of the array's size. The arrays sit in sub-selects so that no plan knows their
/// length and the generic plan is used (see the poll batch).
static SEND_BATCH_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let wake_previous = wake_sql("$10");
    let touch = presence_write("SELECT sender_id AS id, last_seen_at FROM resolved");
    format!(
        "WITH req AS (
             SELECT * FROM unnest((SELECT $1::bytea[]), (SELECT $2::text[]), (SELECT $3::text[]),
                                  (SELECT $4::text[]), (SELECT $5::text[]), (SELECT $6::bigint[]),
                                  (SELECT $7::bigint[]), (SELECT $8::text[]), (SELECT $9::bigint[]))
                 WITH ORDINALITY AS r(token, claimed, to_name, subject, body, reply_to, thread_id,
                                      idempotency_key, to_id, ord)),
         resolved AS (
             SELECT r.ord, me.id AS sender_id, me.last_seen_at, recipient.id AS recipient_id
             FROM req r
             LEFT JOIN LATERAL (
                 SELECT id, last_seen_at FROM agents
                 WHERE token_hash = r.token AND unregistered_at IS NULL
                   AND (r.claimed IS NULL OR name = r.claimed)
                 OFFSET 0) me ON true
             LEFT JOIN LATERAL (
                 SELECT a.id FROM agents a
                 WHERE r.to_id IS NULL AND a.name = r.to_name AND a.unregistered_at IS NULL
                 UNION ALL
                 SELECT a.id FROM agents a WHERE a.id = r.to_id AND a.unregistered_at IS NULL
             ) recipient ON me.id IS NOT NULL),
         touched AS ({touch}),
         numbered AS (
             SELECT x.ord, nextval('messages_id_seq') AS id, x.sender_id, x.recipient_id
             FROM (SELECT ord, sender_id, recipient_id FROM resolved
                   WHERE recipient_id IS NOT NULL ORDER BY ord) x),
         inserted AS (
             INSERT INTO messages (id, sender_id, recipient_id, subject, body, reply_to, thread_id, idempotency_key)
             SELECT n.id, n.sender_id, n.recipient_id, r.subject, r.body, r.reply_to,
                    coalesce(r.thread_id, n.id), r.idempotency_key
             FROM numbered n JOIN req r ON r.ord = n.ord
             ON CONFLICT (sender_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
             RETURNING id, thread_id, sent_at, recipient_id),
         woken AS ({wake_previous})
         SELECT rs.ord, rs.sender_id AS me_id, i.id, i.thread_id, i.sent_at, i.recipient_id,
                (SELECT n FROM woken) AS woke
         FROM resolved rs
         LEFT JOIN numbered n ON n.ord = rs.ord
         LEFT JOIN inserted i ON i.id = n.id"
    )
});
