//! Read-mode polls in one statement: verify each caller, take the oldest
//! unread messages of each inbox (SKIP LOCKED, so pollers on any replica
//! take disjoint messages) and mark them read.

use std::sync::Arc;

use super::{PendingWakes, Write, send::wake_sql};
use crate::domain::messages::{
    AVAILABLE, INBOX_ORDER, Message, POLLED_COLUMNS, POLLED_FIELDS, SENDER_LOOKUP, message,
};
use crate::domain::{presence_write, types::TokenHash};
use crate::store::{Pool, StoreError};

#[derive(Clone)]
pub(crate) struct QueuedPoll {
    pub token: TokenHash,
    pub claimed: Option<String>,
    pub limit: i64,
}

/// What the statement did for one poll.
pub(crate) struct PollOutcome {
    /// The caller, when its token (and claimed name) were accepted.
    pub me_id: Option<i64>,
    /// Taken and marked read, oldest first.
    pub messages: Vec<Message>,
    /// Unread messages before this poll took its own (at most limit + cap).
    pub waiting: i64,
}

/// Writes batches of read-mode polls; `cap` bounds the unread count.
pub(crate) struct PollWrite {
    pub pool: Pool,
    pub cap: i64,
    /// Taken along: this statement begins after their sends committed.
    pub wakes: Arc<PendingWakes>,
}

impl Write for PollWrite {
    type Item = QueuedPoll;
    type Outcome = PollOutcome;

    /// Two polls of one inbox in one statement would lock the same rows
    /// (a transaction does not skip its own locks) and take the same messages.
    fn exclusive_key(item: &QueuedPoll) -> Option<TokenHash> {
        Some(item.token)
    }

    async fn write(&self, polls: &[QueuedPoll]) -> Result<Vec<PollOutcome>, StoreError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(&POLL_BATCH_SQL).await?;
        let tokens: Vec<&[u8]> = polls.iter().map(|p| p.token.as_bytes()).collect();
        let claimed: Vec<Option<&str>> = polls.iter().map(|p| p.claimed.as_deref()).collect();
        let limits: Vec<i64> = polls.iter().map(|p| p.limit).collect();
        let to_wake = self.wakes.take();
        let rows = match client
            .query(&stmt, &[&tokens, &claimed, &limits, &self.cap, &to_wake])
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                self.wakes.add(to_wake);
                return Err(e);
            }
        };
        let mut outcomes: Vec<PollOutcome> = polls
            .iter()
            .map(|_| PollOutcome {
                me_id: None,
                messages: Vec::new(),
                waiting: 0,
            })
            .collect();
        for row in &rows {
            let ord: i64 = row.get("ord");
            let Some(outcome) = usize::try_from(ord - 1)
                .ok()
                .and_then(|i| outcomes.get_mut(i))
            else {
                continue;
            };
            outcome.me_id = Some(row.get("me_id"));
            outcome.waiting = row.get("waiting");
            if row.get::<_, Option<i64>>("id").is_some() {
                outcome.messages.push(message(row, false));
            }
        }
        Ok(outcomes)
    }
}

/// `$1` token digests, `$2` claimed names, `$3` limits (arrays, one element
/// per poll), `$4` the unread count's cap, `$5` recipients of committed
/// sends to wake (the one-time filter on `req` runs it whatever the polls
/// find, even when no token matches). Lookups are LATERAL with OFFSET 0:
/// one index probe per poll whatever the planner thinks of the array. The
/// arrays are wrapped in sub-selects so that no plan knows their length:
/// with it, every custom plan looked cheaper than the generic one and the
/// statement was planned again on every execution (~0.7 ms each,
/// pg_stat_statements in `make bench`). The messages taken are updated by
/// primary key from an array, so no plan can join them by scanning
/// `messages` (a generic plan did, once one inbox held most unread mail).
static POLL_BATCH_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let available = AVAILABLE;
    let touch = presence_write("SELECT id, last_seen_at FROM me");
    let wake = wake_sql("$5");
    format!(
        "WITH woken AS ({wake}),
         req AS (
             SELECT * FROM unnest((SELECT $1::bytea[]), (SELECT $2::text[]), (SELECT $3::bigint[]))
                 WITH ORDINALITY AS r(token, claimed, lim, ord)
             WHERE (SELECT n FROM woken) IS NOT NULL),
         me AS (
             SELECT r.ord, r.lim, a.id, a.name, a.last_seen_at
             FROM req r
             CROSS JOIN LATERAL (
                 SELECT id, name, last_seen_at FROM agents
                 WHERE token_hash = r.token AND unregistered_at IS NULL
                   AND (r.claimed IS NULL OR name = r.claimed)
                 OFFSET 0) a),
         touched AS ({touch}),
         picked AS (
             SELECT me.ord, p.id
             FROM me
             CROSS JOIN LATERAL (
                 SELECT m.id FROM messages m WHERE {available}
                 ORDER BY {INBOX_ORDER} LIMIT me.lim FOR UPDATE SKIP LOCKED) p),
         taken AS (
             UPDATE messages m SET read_at = now(), leased_until = NULL,
                                   delivery_count = m.delivery_count + 1
             WHERE m.id = ANY (ARRAY(SELECT id FROM picked))
             RETURNING {POLLED_FIELDS}),
         waiting AS MATERIALIZED (
             SELECT me.ord,
                    (SELECT count(*) FROM (
                         SELECT 1 FROM messages m WHERE {available}
                         ORDER BY {INBOX_ORDER} LIMIT me.lim + $4) w) AS n
             FROM me)
         SELECT me.ord, me.id AS me_id, {POLLED_COLUMNS}, waiting.n AS waiting
         FROM me
         JOIN waiting ON waiting.ord = me.ord
         LEFT JOIN (SELECT picked.ord, taken.* FROM taken JOIN picked ON picked.id = taken.id) m
             ON m.ord = me.ord
         {SENDER_LOOKUP}
         ORDER BY me.ord, m.id"
    )
});
