//! Group commit for sends: concurrent `phone_send` calls on one replica are
//! written by one statement and one commit.
//!
//! Measured with pgbench on this machine, the send statement carrying 8
//! messages stores about 4 times as many messages per second as 8 separate
//! statements: per-statement work (executor start-up, commit, WAL flush,
//! waking a backend) dominates a one-row insert. Batches form only under
//! load: a send that finds fewer than [`MAX_IN_FLIGHT`] batches running
//! starts one at once, so a lone send waits for nothing. Only requests in
//! flight live here; every reply is sent after the commit, so a crash loses
//! nothing that was acknowledged.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::{PhoneError, wakeup::CHANNEL};
use crate::store::Pool;

/// Batches of one replica's sends that may run at once (each on its own
/// connection). Two keep a batch forming while the other commits.
const MAX_IN_FLIGHT: usize = 2;
/// At most this many sends per statement.
const MAX_BATCH: usize = 64;

/// One send, resolved as far as the request alone allows. Not `Debug`: it
/// holds a token digest and a message body, which logs must never show.
#[derive(Clone)]
pub(crate) struct QueuedSend {
    pub token: super::types::TokenHash,
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

type Reply = oneshot::Sender<Result<SendOutcome, PhoneError>>;

#[derive(Default)]
struct Queue {
    waiting: VecDeque<(QueuedSend, Reply)>,
    running: usize,
}

#[derive(Clone)]
pub(crate) struct SendBatcher {
    pool: Pool,
    queue: Arc<Mutex<Queue>>,
}

impl SendBatcher {
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            queue: Arc::default(),
        }
    }

    /// Stores one send, alone or with others in flight.
    pub async fn send(&self, send: QueuedSend) -> Result<SendOutcome, PhoneError> {
        let (reply, outcome) = oneshot::channel();
        let start = {
            let mut queue = self.queue.lock().expect("send queue lock");
            queue.waiting.push_back((send, reply));
            let start = queue.running < MAX_IN_FLIGHT;
            if start {
                queue.running += 1;
            }
            start
        };
        if start {
            // A task of its own, so a caller that goes away (a closed
            // connection drops its request) cannot abandon the others' sends
            // halfway. Its first batch is traced under this request.
            tokio::spawn(self.clone().drain(tracing::Span::current()));
        }
        outcome.await.unwrap_or(Err(PhoneError::Internal))
    }

    /// Writes batches until nobody waits.
    async fn drain(self, first_span: tracing::Span) {
        let mut span = Some(first_span);
        loop {
            let batch: Vec<(QueuedSend, Reply)> = {
                let mut queue = self.queue.lock().expect("send queue lock");
                if queue.waiting.is_empty() {
                    queue.running -= 1;
                    return;
                }
                let n = queue.waiting.len().min(MAX_BATCH);
                queue.waiting.drain(..n).collect()
            };
            let span = span
                .take()
                .unwrap_or_else(|| tracing::info_span!("send batch"));
            self.write(batch).instrument(span).await;
        }
    }

    async fn write(&self, batch: Vec<(QueuedSend, Reply)>) {
        let (sends, replies): (Vec<QueuedSend>, Vec<Reply>) = batch.into_iter().unzip();
        match self.insert(&sends).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            // One send the database refuses must not fail the others: write
            // them one by one, so only its own caller gets the error.
            Err(e) if sends.len() > 1 && !e.is_unavailable() => {
                tracing::warn!(error = %e, size = sends.len(), "send batch refused; writing its sends one by one");
                for (send, reply) in sends.into_iter().zip(replies) {
                    let outcome = self
                        .insert(std::slice::from_ref(&send))
                        .await
                        .map(|mut one| one.remove(0));
                    let _ = reply.send(outcome.map_err(PhoneError::from));
                }
            }
            Err(e) => {
                let e = PhoneError::from(e);
                for reply in replies {
                    let _ = reply.send(Err(clone_error(&e)));
                }
            }
        }
    }

    /// One statement for the whole batch; one outcome per send, in order.
    async fn insert(
        &self,
        sends: &[QueuedSend],
    ) -> Result<Vec<SendOutcome>, crate::store::StoreError> {
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
        let rows = client
            .query(
                &stmt,
                &[
                    &tokens, &claimed, &to_names, &subjects, &bodies, &reply_tos, &threads, &keys,
                    &to_ids,
                ],
            )
            .await?;
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
            outcome.stored = row.get::<_, Option<i64>>("id").map(|id| Stored {
                id,
                thread_id: row.get("thread_id"),
                sent_at: row.get("sent_at"),
            });
        }
        Ok(outcomes)
    }
}

/// `PhoneError` is not `Clone` (it wraps sources); the ones a whole batch
/// can fail with carry only text.
fn clone_error(e: &PhoneError) -> PhoneError {
    match e {
        PhoneError::Unavailable(reason) => PhoneError::Unavailable(reason.clone()),
        _ => PhoneError::Internal,
    }
}

/// The batch send statement, built once. Arrays, one element per send:
/// `$1` token digests, `$2` claimed names, `$3` recipient names, `$4`
/// subjects, `$5` bodies, `$6` reply_to, `$7` threads, `$8` idempotency
/// keys, `$9` recipient ids (replies). Each lookup is a LATERAL subquery
/// with OFFSET 0, so it stays one index probe per send whatever the
/// planner thinks of the array's size. A send nobody waits for pays no
/// NOTIFY (NOTIFY serialises commits); one whose recipient waits in a long
/// poll wakes it.
static SEND_BATCH_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH req AS (
             SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::text[],
                                  $6::bigint[], $7::bigint[], $8::text[], $9::bigint[])
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
         touched AS (
             UPDATE agents SET last_seen_at = now()
             WHERE id = ANY (ARRAY(
                     SELECT sender_id FROM resolved
                     WHERE last_seen_at IS NULL OR last_seen_at < now() - interval '60 seconds'))
               AND (last_seen_at IS NULL OR last_seen_at < now() - interval '60 seconds')),
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
         woken AS (
             SELECT count(pg_notify('{CHANNEL}', i.recipient_id::text)) AS n
             FROM (SELECT DISTINCT recipient_id FROM inserted) i
             WHERE EXISTS (SELECT 1 FROM inbox_waiters w
                           WHERE w.agent_id = i.recipient_id AND w.expires_at > now()))
         SELECT rs.ord, rs.sender_id AS me_id, i.id, i.thread_id, i.sent_at, (SELECT n FROM woken) AS woke
         FROM resolved rs
         LEFT JOIN numbered n ON n.ord = rs.ord
         LEFT JOIN inserted i ON i.id = n.id"
    )
});
