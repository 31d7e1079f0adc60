//! The read polls' part of the mail statement: verify each caller, take the
//! oldest unread messages of each inbox (SKIP LOCKED, so pollers on any
//! replica take disjoint messages) and mark them read.

use crate::store::fragments::{INBOX_ORDER, POLLED_FIELDS, available_to, caller_by_token};

/// One poll that takes mail: read mode (marks read), or lease mode (hands
/// out for `lease_seconds`, at most `max_deliveries` times in all). Not
/// `Debug`: it holds a token digest.
#[derive(Clone)]
pub struct QueuedPoll {
    pub token: [u8; 32],
    pub claimed: Option<String>,
    pub limit: i64,
    /// `Some` for a lease: its seconds and the most deliveries a message
    /// may have had before this one (it dies instead).
    pub lease: Option<Lease>,
    /// Leased messages to acknowledge first (phone_inbox's `ack`): id, and
    /// the delivery a receipt names (`None` for a plain id).
    pub acks: Vec<(i64, Option<i32>)>,
}

#[derive(Debug, Clone, Copy)]
pub struct Lease {
    pub seconds: u32,
    pub max_deliveries: u32,
}

/// The polls' CTEs of the mail statement, after `preq` (the polls: token,
/// claimed, lim, lease_secs, max_deliveries, ord): `me` the callers;
/// `inboxes` each inbox polled, with how many messages its polls want in
/// all; `pool` that many of its oldest available messages, locked (SKIP
/// LOCKED, so statements on any replica take disjoint messages) in one go
/// per inbox, numbered; `picked` each poll's own share of its inbox's pool,
/// in the polls' order, cut at `$28` bytes of text. Polls of one inbox thus share the statement
/// without locking each other's rows (a transaction does not skip its own
/// locks: one lock request per inbox). `read_taken` marks read polls' shares
/// read, `lease_taken` leases the others', `buried` ends messages already
/// leased `max_deliveries` times; `waiting` counts each inbox's available
/// mail before the statement (`$13` caps it beyond what was asked; only
/// when the pool is full) and what its polls took.
///
/// Lookups are LATERAL with OFFSET 0: one index probe per poll whatever the
/// planner thinks of the arrays. Updates find their rows by primary key
/// from arrays, so no plan can join them by scanning `messages` (a generic
/// plan did, once one inbox held most unread mail); one-time filters keep
/// the updates of a kind no poll asked for from running at all.
///
/// `leases`: whether the statement is for batches with lease polls. Without
/// it, `lease_taken` and `buried` are left out: two updates of `messages`
/// that read polls never run, but whose plan nodes every execution set up.
/// `acks`: whether some lease polls acknowledge first (see [`ack_ctes`]).
pub(super) fn polls(leases: bool, acks: bool) -> String {
    let caller = caller_by_token("r.token", "r.claimed");
    let mut available = available_to("i.agent");
    let ack_ctes = if acks {
        // A message this statement acknowledges is not handed out by it
        // too (a lease that just ended, acknowledged late): the pick would
        // not skip the statement's own lock, and one statement cannot
        // update a row twice. Hashed: one probe per row visited.
        available.push_str(" AND m.id NOT IN (SELECT id FROM ack_locked)");
        format!("{},", ack_ctes())
    } else {
        String::new()
    };
    let taken = if leases {
        format!(
            "lease_taken AS (
             UPDATE messages m
             SET leased_until = now() + make_interval(secs => (
                     SELECT p.lease_secs FROM picked p WHERE p.id = m.id)),
                 delivery_count = m.delivery_count + 1
             WHERE m.id = ANY (ARRAY(SELECT id FROM picked
                                     WHERE lease_secs IS NOT NULL AND delivery_count < max_deliveries))
               AND EXISTS (SELECT FROM picked WHERE lease_secs IS NOT NULL)
             RETURNING {POLLED_FIELDS}),
         buried AS (
             UPDATE messages m SET dead_at = now(), dead_reason = 'deliveries', leased_until = NULL
             WHERE m.id = ANY (ARRAY(SELECT id FROM picked
                                     WHERE lease_secs IS NOT NULL AND delivery_count >= max_deliveries))
               AND EXISTS (SELECT FROM picked WHERE lease_secs IS NOT NULL)
             RETURNING m.id),
         taken AS (
             SELECT * FROM read_taken UNION ALL SELECT * FROM lease_taken)"
        )
    } else {
        "taken AS (SELECT * FROM read_taken)".to_owned()
    };
    format!(
        "me AS (
             SELECT r.ord, r.lim, r.lease_secs, r.max_deliveries, a.id, a.name, a.last_seen_at
             FROM preq r
             CROSS JOIN LATERAL (
                 SELECT id, name, last_seen_at FROM agents
                 WHERE {caller}
                 OFFSET 0) a),
         {ack_ctes}
         inboxes AS MATERIALIZED (
             SELECT id AS agent, sum(lim)::bigint AS total FROM me GROUP BY id),
         pool AS MATERIALIZED (
             SELECT i.agent, p.id, p.delivery_count, p.bytes,
                    row_number() OVER (PARTITION BY i.agent ORDER BY p.id) AS n
             FROM inboxes i
             CROSS JOIN LATERAL (
                 -- The sizes from the values' headers: no body is read.
                 SELECT m.id, m.delivery_count,
                        octet_length(m.body) + coalesce(octet_length(m.subject), 0) AS bytes
                 FROM messages m WHERE {available}
                 ORDER BY {INBOX_ORDER} LIMIT i.total FOR UPDATE SKIP LOCKED) p),
         shares AS (
             SELECT me.ord, me.id AS agent, me.lim, me.lease_secs, me.max_deliveries,
                    coalesce(sum(me.lim) OVER (PARTITION BY me.id ORDER BY me.ord
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS skip
             FROM me),
         -- Each poll's share, up to the answer's byte budget ($28): the
         -- first message always, then each one while those before it
         -- hold less. A message that dies here (leased too often) is
         -- not in the answer: it neither counts nor is cut. The rest
         -- stay as they were, for the next poll.
         picked AS MATERIALIZED (
             SELECT x.ord, x.agent, x.lease_secs, x.max_deliveries, x.id, x.delivery_count
             FROM (SELECT y.*, sum(y.shown) OVER (PARTITION BY y.ord ORDER BY y.n
                                                  ROWS UNBOUNDED PRECEDING) - y.shown AS before
                   FROM (SELECT s.ord, s.agent, s.lease_secs, s.max_deliveries, p.id,
                                p.delivery_count, p.n,
                                CASE WHEN s.lease_secs IS NOT NULL
                                          AND p.delivery_count >= s.max_deliveries THEN 0
                                     ELSE p.bytes END AS shown
                         FROM shares s
                         JOIN pool p ON p.agent = s.agent
                                    AND p.n > s.skip AND p.n <= s.skip + s.lim) y) x
             WHERE x.before < $28 OR x.shown = 0),
         read_taken AS (
             UPDATE messages m SET read_at = now(), leased_until = NULL,
                                   delivery_count = m.delivery_count + 1
             WHERE m.id = ANY (ARRAY(SELECT id FROM picked WHERE lease_secs IS NULL))
               AND EXISTS (SELECT FROM picked WHERE lease_secs IS NULL)
             RETURNING {POLLED_FIELDS}),
         {taken},
         waiting AS MATERIALIZED (
             SELECT i.agent,
                    -- A pool short of what its polls asked for found
                    -- everything available: nothing waits beyond it but
                    -- messages other statements hold locked, which they
                    -- are taking. Only a full pool needs the count, a
                    -- second walk of the inbox's unread entries (read
                    -- ones not yet vacuumed included: the walk visits
                    -- each one's row).
                    CASE WHEN t.pooled < i.total THEN t.pooled
                         ELSE (SELECT count(*) FROM (
                                   SELECT 1 FROM messages m WHERE {available}
                                   ORDER BY {INBOX_ORDER} LIMIT i.total + $13) w) END AS n,
                    coalesce(k.taken, 0) AS taken
             FROM inboxes i
             CROSS JOIN LATERAL (SELECT count(*) AS pooled FROM pool p WHERE p.agent = i.agent) t
             LEFT JOIN (SELECT agent, count(*) AS taken FROM picked GROUP BY agent) k
                 ON k.agent = i.agent)"
    )
}

/// The callers of `polls`, for the presence write.
pub(super) const POLLERS: &str = "SELECT id, last_seen_at FROM me";

/// The acknowledgements of the polls' CTEs (phone_inbox's `ack`), after
/// `me` and before the picks, which leave out what they lock: `areq`
/// (poll `ord`, message id, the delivery a receipt names, `n` its place)
/// from `$25`-`$27`. `ack_locked` locks each poll's own messages among
/// them (a poll names only its caller's: another agent's ids are neither
/// locked nor left out of its picks), in id order, skipping rows another
/// transaction holds: the batch never waits on a lock for an
/// acknowledgement (those come back undecided, and the caller
/// acknowledges them alone, as phone_ack does). `FOR NO KEY UPDATE`, as
/// an update that changes no key takes: a reply's foreign-key check on
/// the row does not wait for it. `acked` acknowledges the locked ones whose delivery
/// is still the receipt's; already acknowledged rows take the update too,
/// unchanged, so that one acknowledged since this statement's snapshot
/// counts (as in `messages::ACK`); a receipt of an earlier delivery is
/// stale, also when a later one was acknowledged. `ack_outcomes`: one row per request,
/// numbered from 1 within its poll. Primary key throughout.
fn ack_ctes() -> String {
    "areq AS (
         SELECT * FROM unnest($25::bigint[], $26::bigint[], $27::int[])
             WITH ORDINALITY AS r(ord, id, delivery, n)),
     ack_mine AS MATERIALIZED (
         SELECT r.id, me.id AS agent FROM areq r JOIN me ON me.ord = r.ord),
     ack_locked AS MATERIALIZED (
         SELECT m.id FROM messages m
         WHERE m.id = ANY (ARRAY(SELECT id FROM ack_mine))
           AND (m.id, m.recipient_id) IN (SELECT id, agent FROM ack_mine)
         ORDER BY m.id
         FOR NO KEY UPDATE SKIP LOCKED),
     acked AS (
         UPDATE messages m
         SET acked_at = coalesce(m.acked_at, now()), read_at = coalesce(m.read_at, now()),
             leased_until = NULL
         FROM areq r JOIN me ON me.ord = r.ord
         WHERE m.id = ANY (ARRAY(SELECT id FROM ack_locked))
           AND m.id = r.id AND m.recipient_id = me.id
           AND (r.delivery IS NULL OR m.delivery_count = r.delivery)
         RETURNING m.id, m.delivery_count AS delivery),
     ack_outcomes AS (
         SELECT r.ord, row_number() OVER (PARTITION BY r.ord ORDER BY r.n) AS n,
                CASE WHEN m.id IS NULL THEN 'not_found'
                     WHEN EXISTS (SELECT 1 FROM acked a
                                  WHERE a.id = r.id
                                    AND (r.delivery IS NULL OR a.delivery = r.delivery))
                          OR (m.acked_at IS NOT NULL
                              AND (r.delivery IS NULL OR m.delivery_count = r.delivery))
                     THEN 'acknowledged'
                     WHEN r.id NOT IN (SELECT id FROM ack_locked) THEN 'locked'
                     ELSE 'stale' END AS state,
                m.delivery_count AS current
         FROM areq r JOIN me ON me.ord = r.ord
         LEFT JOIN messages m ON m.id = r.id AND m.recipient_id = me.id)"
        .to_owned()
}
