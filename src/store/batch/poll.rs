//! The read polls' part of the mail statement: verify each caller, take the
//! oldest unread messages of each inbox (SKIP LOCKED, so pollers on any
//! replica take disjoint messages) and mark them read.

use crate::store::fragments::{INBOX_ORDER, POLLED_FIELDS, available_to, caller_by_token};

/// One read poll. Not `Debug`: it holds a token digest.
#[derive(Clone)]
pub struct QueuedPoll {
    pub token: [u8; 32],
    pub claimed: Option<String>,
    pub limit: i64,
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
    let caller = caller_by_token("r.token", "r.claimed");
    let available = available_to("me.id");
    format!(
        "me AS (
             SELECT r.ord, r.lim, a.id, a.name, a.last_seen_at
             FROM preq r
             CROSS JOIN LATERAL (
                 SELECT id, name, last_seen_at FROM agents
                 WHERE {caller}
                 OFFSET 0) a),
         picked AS (
             SELECT me.ord, p.id
             FROM me
             CROSS JOIN LATERAL (
                 SELECT m.id FROM messages m WHERE {available}
                 ORDER BY {INBOX_ORDER} LIMIT me.lim FOR UPDATE SKIP LOCKED) p),
         taken AS (
             UPDATE messages m SET read_at = now(), leased_until = NULL,
                                   delivery_count = m.delivery_count + 1
             WHERE m.id = ANY (ARRAY(SELECT id FROM picked)) AND EXISTS (SELECT FROM picked)
             RETURNING {POLLED_FIELDS}),
         waiting AS MATERIALIZED (
             SELECT me.ord,
                    (SELECT count(*) FROM (
                         SELECT 1 FROM messages m WHERE {available}
                         ORDER BY {INBOX_ORDER} LIMIT me.lim + $13) w) AS n
             FROM me)"
    )
}

/// The callers of `polls`, for the presence write.
pub(super) const POLLERS: &str = "SELECT id, last_seen_at FROM me";
