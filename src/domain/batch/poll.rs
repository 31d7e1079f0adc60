//! The read polls' part of the mail statement: verify each caller, take the
//! oldest unread messages of each inbox (SKIP LOCKED, so pollers on any
//! replica take disjoint messages) and mark them read.

use crate::domain::messages::{AVAILABLE, INBOX_ORDER, Message, POLLED_FIELDS, message};
use crate::domain::types::TokenHash;

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

impl PollOutcome {
    pub(super) fn not_accepted() -> Self {
        Self {
            me_id: None,
            messages: Vec::new(),
            waiting: 0,
        }
    }

    /// Adds a row of the polls' result (one per message taken, or one
    /// without a message when none was), rows in message order.
    pub(super) fn add_row(&mut self, row: &tokio_postgres::Row) {
        self.me_id = Some(row.get("me_id"));
        self.waiting = row.get("waiting");
        if row.get::<_, Option<i64>>("id").is_some() {
            self.messages.push(message(row, false));
        }
    }
}

/// The polls' CTEs of the mail statement, after `preq` (the polls: token,
/// claimed, lim, ord): `me` the callers, `picked` and `taken` the messages
/// taken and marked read, `waiting` each inbox's unread count (`$13` caps
/// it). Lookups are LATERAL with OFFSET 0: one index probe per poll whatever
/// the planner thinks of the array. The messages taken are updated by
/// primary key from an array, so no plan can join them by scanning
/// `messages` (a generic plan did, once one inbox held most unread mail);
/// with nothing picked (a batch of sends only) that update does not run.
pub(super) fn polls() -> String {
    format!(
        "me AS (
             SELECT r.ord, r.lim, a.id, a.name, a.last_seen_at
             FROM preq r
             CROSS JOIN LATERAL (
                 SELECT id, name, last_seen_at FROM agents
                 WHERE token_hash = r.token AND unregistered_at IS NULL
                   AND (r.claimed IS NULL OR name = r.claimed)
                 OFFSET 0) a),
         picked AS (
             SELECT me.ord, p.id
             FROM me
             CROSS JOIN LATERAL (
                 SELECT m.id FROM messages m WHERE {AVAILABLE}
                 ORDER BY {INBOX_ORDER} LIMIT me.lim FOR UPDATE SKIP LOCKED) p),
         taken AS (
             UPDATE messages m SET read_at = now(), leased_until = NULL,
                                   delivery_count = m.delivery_count + 1
             WHERE m.id = ANY (ARRAY(SELECT id FROM picked)) AND EXISTS (SELECT FROM picked)
             RETURNING {POLLED_FIELDS}),
         waiting AS MATERIALIZED (
             SELECT me.ord,
                    (SELECT count(*) FROM (
                         SELECT 1 FROM messages m WHERE {AVAILABLE}
                         ORDER BY {INBOX_ORDER} LIMIT me.lim + $13) w) AS n
             FROM me)"
    )
}

/// The callers of `polls`, for the presence write.
pub(super) const POLLERS: &str = "SELECT id, last_seen_at FROM me";
