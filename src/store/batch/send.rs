//! The sends' part of the mail statement: verify each caller, resolve each
//! recipient, insert; and the wake-up check for recipients waiting in a
//! long poll.

use chrono::{DateTime, Utc};

use crate::store::fragments::{INBOX_ORDER, available_to, caller_by_token, stored_words};
use crate::store::wakeup::CHANNEL;

/// One send, resolved as far as the request alone allows: one message per
/// addressee, in one statement. Not `Debug`: it holds a token digest and a
/// message body, which logs must never show.
#[derive(Clone)]
pub struct QueuedSend {
    pub token: [u8; 32],
    pub claimed: Option<String>,
    /// One or more (a group send: up to 20); each is decided on its own.
    pub to: Vec<Addressee>,
    pub subject: Option<String>,
    pub body: String,
    pub reply_to: Option<i64>,
    pub thread_id: Option<i64>,
    pub idempotency_key: Option<String>,
    /// Seconds until it is no longer delivered (`None`: never).
    pub expires_in: Option<f64>,
}

/// One recipient of a send.
#[derive(Debug, Clone)]
pub struct Addressee {
    pub name: String,
    /// A reply's recipient, by id (a name may have been re-registered).
    pub id: Option<i64>,
    /// It answers a message this recipient sent the caller: allowed under
    /// any contact policy (not a block).
    pub answers_recipient: bool,
}

/// The idempotency key stored on one copy of a send: the key itself for a
/// send to one, and the key with the recipient's name after a unit
/// separator (a control character, which no key may hold) for each copy of
/// a group send, so that each copy is stored at most once and a retry finds
/// each of them (`messages_idempotency_idx`).
pub fn copy_key(key: &str, recipient: &str, copies: usize) -> String {
    if copies > 1 {
        format!("{key}\u{1f}{recipient}")
    } else {
        key.to_owned()
    }
}

/// The key the same copy would have been stored with had the send gone to
/// one recipient instead of several, or to several instead of one: a
/// retry whose `to` changed between the two (a reply to everyone whose
/// conversation grew between the tries) finds its first try's copy by it,
/// stored to the same recipient. See [`copy_key`].
pub fn other_copy_key(key: &str, recipient: &str, copies: usize) -> String {
    copy_key(key, recipient, if copies > 1 { 1 } else { 2 })
}

/// What the statement did with one send: per addressee, in order.
#[derive(Debug, Clone)]
pub struct SendOutcome {
    /// The sender, when its token (and claimed name) were accepted.
    pub me_id: Option<i64>,
    pub copies: Vec<CopyOutcome>,
}

/// What the statement did with one copy of a send.
#[derive(Debug, Clone, Default)]
pub struct CopyOutcome {
    /// The stored message; `None` when the recipient is unknown, the
    /// idempotency key was already used, or the send was refused.
    pub stored: Option<Stored>,
    /// Why the recipient's policy or a quota refused it: `refused`,
    /// `send_quota`, `new_recipient_quota`, `inbox_full`, `inbox_share`.
    pub refusal: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Stored {
    pub id: i64,
    pub thread_id: i64,
    /// The group of a copy of a group send (its first copy's id).
    pub group_id: Option<i64>,
    pub sent_at: DateTime<Utc>,
}

impl SendOutcome {
    pub(super) fn not_accepted(copies: usize) -> Self {
        Self {
            me_id: None,
            copies: vec![CopyOutcome::default(); copies],
        }
    }

    /// Adds a row of the sends' part of the mail statement's result, for
    /// copy `copy`.
    pub(super) fn add_row(&mut self, copy: usize, row: &tokio_postgres::Row) {
        self.me_id = row.get("me_id");
        if let Some(slot) = self.copies.get_mut(copy) {
            *slot = CopyOutcome {
                stored: row.get::<_, Option<i64>>("id").map(|id| Stored {
                    id,
                    thread_id: row.get("thread_id"),
                    group_id: row.get("group_id"),
                    sent_at: row.get("sent_at"),
                }),
                refusal: row.get("refusal"),
            };
        }
    }
}

/// Which of the given recipients (`recipients`, an SQL expression for a
/// bigint[]) wait in a long poll now (their `inbox_waiters` row), as one
/// array `ids`: only those get a NOTIFY, so sends nobody waits for pay
/// none (NOTIFY serialises commits).
///
/// Why after the commit, in a later statement: a long poll registers its
/// row, then looks for mail; a send inserts, then looks for waiters. Were
/// both looks in the writing statement's own snapshot, a send that began
/// before the row was committed and committed after the poll looked would
/// be seen by neither side, and the poll would sleep through its mail
/// (the wake phase of `make bench` caught 9 of 160). A statement that
/// begins after the send's commit sees every row committed before the
/// poll looked. Index: `inbox_waiters_agent_idx`. The array is read through
/// a sub-select because `WAKE_SQL` runs with the default plan cache mode:
/// no custom plan sees its length (see `sends` for what that did to the
/// mail statement). In the mail statement, which runs only its generic
/// plan, it is one InitPlan.
pub(super) fn waiting_among(recipients: &str) -> String {
    format!(
        "SELECT ARRAY(
             SELECT r.agent_id
             FROM (SELECT DISTINCT agent_id FROM unnest((SELECT {recipients}::bigint[])) AS u(agent_id)) r
             WHERE EXISTS (SELECT 1 FROM inbox_waiters w
                           WHERE w.agent_id = r.agent_id AND w.expires_at > now())) AS ids"
    )
}

/// The wake-ups alone, when no batch follows: `$1` recipients; notifies
/// those that wait.
pub(super) static WAKE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT count(pg_notify('{CHANNEL}', a::text)) AS n
         FROM ({}) w CROSS JOIN unnest(w.ids) AS a",
        waiting_among("$1")
    )
});

/// NOTIFY for `$1`, agents known to wait.
pub(super) static NOTIFY_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT count(pg_notify('{CHANNEL}', a::text)) AS n FROM unnest($1::bigint[]) AS a")
});

/// The sends' CTEs of the mail statement. Arrays, one element per send:
/// `$1` token digests, `$2` claimed names, `$4` subjects, `$5` bodies, `$6`
/// reply_to, `$7` threads, `$23` lifetimes in seconds (NULL: none); one
/// element per copy (a send to several recipients has one per recipient):
/// `$24` the send it belongs to (1-based), `$3` recipient names, `$9`
/// recipient ids (replies), `$17` whether the copy answers a message its
/// recipient sent the caller, `$8` idempotency keys (see [`copy_key`]) and
/// `$29` the same in their other form (see [`other_copy_key`]; read by
/// group sends only); and
/// the quotas (0: off): `$18`
/// sends per sender per hour (refused sends count too), `$19` first
/// messages to new recipients per sender per day, `$20` unread messages a
/// recipient may hold from agents it does not know (twice that from those
/// it does), `$21` unread messages one sender may hold in one inbox.
///
/// `sme` verifies each send's caller once; `resolved` has the sender and
/// recipient of each copy; `judged` what the
/// recipient's contact policy says (`contacts` is probed only for a
/// recipient whose `uses_contacts` flag says it ever marked anyone: no
/// row can exist otherwise) (a block wins over everything; an answer
/// to the recipient's own message passes any other policy); `decided`
/// the quotas' verdict, for the copies the policy let through (several
/// copies of one sender in the batch count in order); `stored` each copy
/// as it is to be stored (the copies of one send share a thread and a
/// `group_id`, the first copy's id) and `inserted` the ids that went in
/// (not an idempotent replay); `refusals` logs the rest; `hooked` queues a webhook delivery for
/// each message to a recipient with a webhook (nothing for the others), up
/// to `$22` pending per recipient; beyond, one "mail waits" summary stands
/// for the rest (at most one pending: the unique index ignores the others). Each lookup is a LATERAL subquery with
/// OFFSET 0, so it stays one index probe per send whatever the planner
/// thinks of the arrays; quota work that is off does not run (one-time
/// filters on the parameters). Indexes: token, names, `contacts` and
/// `correspondents` primary keys, `messages_unread_idx`, `send_counts`
/// primary key (and, in the functions of migration V25,
/// `correspondents_recent_idx` and `messages_unread_sender_idx`).
///
/// Parts a batch cannot use are left out, not skipped: a plan's nodes are
/// set up on every execution whether they run or not. `keyed`: some send
/// carries an idempotency key (without, the insert has no ON CONFLICT);
/// `grouped`: some send has several recipients (without, `stored` takes
/// each copy as it is: only a group's copies look for earlier ones).
/// `quotas`: some quota is on; without, `hour`, `hour_counted` and `met`
/// are left out, and `decided` is `judged`.
pub(super) fn sends(keyed: bool, grouped: bool, quotas: bool) -> String {
    let caller = caller_by_token("r.token", "r.claimed");
    let backlog = available_to("q.recipient_id");
    // Bare parameters: the statement runs only its generic plan
    // (`Client::query_generic`), which knows no parameter's value, so the
    // parts of quotas that are off (when another is on) stay in it and are
    // skipped at run time (one-time filters). They were sub-selects
    // (InitPlans) while custom plans were made: a custom plan folded away
    // the parts of quotas that were off, looked cheaper than the generic
    // one, and the statement was planned again on every execution (~3 ms a
    // batch). As sub-selects they were 54
    // plan nodes of their own, set up on every execution: a batch of 4
    // sends and 4 polls took 8% longer with them (pgbench,
    // bench/RESULTS.md), with the same plan otherwise.
    let per_hour = "$18::int";
    let new_per_day = "$19::int";
    let unread_max = "$20::int";
    let per_sender = "$21::int";
    let backlog_max = "$22::int";
    let words = stored_words("r.subject", "r.body");
    // With keys, a group's copies' keys in the other form too
    // (`other_copy_key`), to find earlier copies by (`stored`); a send to
    // one needs no look: its insert's conflict is all it would learn.
    let (other_keys, other_key) = if keyed && grouped {
        (", $29::text[]", ", other_key")
    } else {
        ("", "")
    };
    let mut ctes = vec![format!(
        "
    sreq AS (
        SELECT * FROM unnest($1::bytea[], $2::text[], $4::text[], $5::text[], $6::bigint[],
                             $7::bigint[], $23::float8[])
            WITH ORDINALITY AS r(token, claimed, subject, body, reply_to, thread_id, expires_in, sord)),
    sme AS (
        SELECT r.sord, me.id, me.project, me.last_seen_at, r.reply_to IS NOT NULL AS replying
        FROM sreq r
        CROSS JOIN LATERAL (
            SELECT id, project, last_seen_at FROM agents
            WHERE {caller}
            OFFSET 0) me),
    scopy AS (
        SELECT x.*, count(*) OVER (PARTITION BY x.sord) AS copies
        FROM unnest($24::bigint[], $3::text[], $9::bigint[], $17::bool[], $8::text[]{other_keys})
            WITH ORDINALITY AS x(sord, to_name, to_id, answers_recipient, idempotency_key{other_key}, ord)),
    resolved AS (
        SELECT x.ord, x.sord, x.answers_recipient, me.replying, me.id AS sender_id,
               me.project AS sender_project, me.last_seen_at, recipient.id AS recipient_id,
               recipient.project AS recipient_project, recipient.contact_policy, recipient.suspended, recipient.hooked,
               recipient.uses_contacts
        FROM scopy x
        LEFT JOIN sme me ON me.sord = x.sord
        LEFT JOIN LATERAL (
            SELECT a.id, a.project, a.contact_policy, a.suspended_at IS NOT NULL AS suspended,
                   a.webhook_url IS NOT NULL AND a.webhook_disabled_at IS NULL AS hooked,
                   a.uses_contacts
            FROM agents a
            WHERE x.to_id IS NULL AND a.name = x.to_name AND a.unregistered_at IS NULL
            UNION ALL
            SELECT a.id, a.project, a.contact_policy, a.suspended_at IS NOT NULL,
                   a.webhook_url IS NOT NULL AND a.webhook_disabled_at IS NULL,
                   a.uses_contacts
            FROM agents a WHERE x.to_id IS NOT NULL AND a.id = x.to_id AND a.unregistered_at IS NULL
        ) recipient ON me.id IS NOT NULL),
    judged AS (
        SELECT rs.ord, rs.sender_id, rs.recipient_id, rs.replying,
               rs.answers_recipient OR coalesce(c.is_contact, false) AS known,
               CASE WHEN rs.recipient_id IS NULL THEN NULL
                    WHEN rs.suspended OR coalesce(c.is_blocked, false) THEN 'refused'
                    WHEN rs.contact_policy = 'open' OR rs.answers_recipient THEN NULL
                    WHEN rs.contact_policy = 'project'
                         AND (lower(rs.sender_project) = lower(rs.recipient_project)
                              OR coalesce(c.is_contact, false)) THEN NULL
                    WHEN rs.contact_policy = 'contacts' AND coalesce(c.is_contact, false) THEN NULL
                    ELSE 'refused' END AS refusal
        FROM resolved rs
        -- The flag inside the probe, where it is a one-time filter: in the
        -- join's condition it was checked after the probe, which ran for
        -- every copy (two buffers each).
        LEFT JOIN LATERAL (
            SELECT is_contact, is_blocked FROM contacts
            WHERE rs.recipient_id IS NOT NULL AND rs.uses_contacts
              AND agent_id = rs.recipient_id AND other_id = rs.sender_id
            OFFSET 0) c ON true),
"
    )];
    if quotas {
        ctes.push(format!(
            "
    -- This batch's senders' sends in the current hour, read once per
    -- sender (a group send's copies share one probe).
    hour AS MATERIALIZED (
        SELECT sc.sender_id, sc.sends FROM send_counts sc
        WHERE sc.sender_id = ANY (ARRAY(SELECT sender_id FROM judged
                                        WHERE recipient_id IS NOT NULL AND refusal IS NULL))
          AND sc.hour_start > now() - interval '1 hour'),
    -- The quotas, for the copies the policy let through (`quoted`; several
    -- copies of one sender in the batch count in order: `nth`, `nth_pair`,
    -- `nth_new`). A copy costs a probe for whether its pair is new and one
    -- for its recipient's oldest unread message (`span`: the backlog could
    -- hold at most as many messages as there are ids from there to the
    -- newest issued). Only a sender writing to someone new, or to an inbox
    -- whose backlog could be near a cap, pays for more: its counts run in
    -- functions (migration V25), set up only when called, where as
    -- sub-plans they were set up on every execution (bench/RESULTS.md).
    -- New recipients today are counted once per sender, at its first new
    -- pair of the batch, under the sender's lock while it is under the
    -- quota (V29): statements of one sender at once counted each in its
    -- own snapshot, and each let the quota through.
    decided AS MATERIALIZED (
        SELECT q.ord, q.sender_id, q.recipient_id, q.new_pair,
               CASE WHEN NOT q.quoted THEN q.refusal
                    WHEN {per_hour} > 0 AND coalesce((
                        SELECT h.sends FROM hour h WHERE h.sender_id = q.sender_id), 0) + q.nth > {per_hour}
                    THEN 'send_quota'
                    WHEN q.first_contact AND q.new_today + q.nth_new > {new_per_day}
                    THEN 'new_recipient_quota'
                    -- For the share, the backlog's bound counts this
                    -- batch's earlier copies of the pair: it holds for
                    -- copies of one statement too.
                    WHEN span.most >= nullif({unread_max}, 0)
                         OR span.most + q.nth_pair - 1 >= nullif({per_sender}, 0)
                    THEN phone_backlog_refusal(q.sender_id, q.recipient_id, q.known, q.nth_pair,
                                               span.most, {unread_max}, {per_sender})
               END AS refusal
        FROM (SELECT w.*,
                     max(CASE WHEN w.first_contact AND w.nth_new = 1
                              THEN phone_new_recipients_counted(w.sender_id, {new_per_day}) END)
                         OVER (PARTITION BY w.quoted, w.sender_id) AS new_today
              -- A reply's copies go to parties of a message someone
              -- else began: none is the sender's first contact (strangers
              -- who wrote to it must not use up its quota).
              FROM (SELECT p.*, {new_per_day} > 0 AND p.new_pair AND NOT p.replying AS first_contact,
                           row_number() OVER (PARTITION BY p.quoted, p.sender_id ORDER BY p.ord) AS nth,
                           row_number() OVER (PARTITION BY p.quoted, p.sender_id, p.recipient_id
                                              ORDER BY p.ord) AS nth_pair,
                           sum(({new_per_day} > 0 AND p.new_pair AND NOT p.replying)::int)
                               OVER (PARTITION BY p.quoted, p.sender_id ORDER BY p.ord) AS nth_new
                    -- OFFSET 0: `new_pair` is probed once per copy. Pulled
                    -- up into the window's expressions, it was probed three
                    -- times.
                    FROM (SELECT j.*, j.recipient_id IS NOT NULL AND j.refusal IS NULL AS quoted,
                                 j.recipient_id IS NOT NULL AND j.refusal IS NULL
                                 AND ({new_per_day} > 0 OR {unread_max} > 0) AND NOT EXISTS (
                                     SELECT 1 FROM correspondents x
                                     WHERE x.sender_id = j.sender_id AND x.recipient_id = j.recipient_id)
                                     AS new_pair
                          FROM judged j OFFSET 0) p) w) q
        LEFT JOIN LATERAL (
            -- 0 for an empty backlog.
            SELECT coalesce((SELECT last_value FROM messages_id_seq) + 1 - (
                       SELECT m.id FROM messages m WHERE {backlog}
                       ORDER BY {INBOX_ORDER} LIMIT 1), 0) AS most
            WHERE q.quoted AND ({unread_max} > 0 OR {per_sender} > 0)
            OFFSET 0) span ON true),
"
        ));
    } else {
        // No quota is on: every copy is as the policy judged it.
        ctes.push(
            "
    decided AS (SELECT ord, sender_id, recipient_id, refusal FROM judged),
"
            .to_owned(),
        );
    }
    ctes.push(
        "
    numbered AS (
        SELECT x.ord, nextval('messages_id_seq') AS id, x.sender_id, x.recipient_id
        FROM (SELECT ord, sender_id, recipient_id FROM decided
              WHERE recipient_id IS NOT NULL AND refusal IS NULL ORDER BY ord) x),
"
        .to_owned(),
    );
    if grouped {
        // Each copy's earlier one, stored by an earlier try with its key;
        // without keys, no copy has one.
        let earlier = if keyed {
            "(
                SELECT m.thread_id, m.group_id,
                       m.body = r.body AND m.subject IS NOT DISTINCT FROM r.subject
                           AND m.reply_to IS NOT DISTINCT FROM r.reply_to AS same
                FROM messages m
                WHERE x.idempotency_key IS NOT NULL AND m.sender_id = n.sender_id
                  AND m.idempotency_key IN (x.idempotency_key, x.other_key)
                  AND (m.idempotency_key = x.idempotency_key OR m.recipient_id = n.recipient_id)
                ORDER BY m.idempotency_key = x.idempotency_key DESC
                LIMIT 1)"
        } else {
            "(SELECT NULL::bigint AS thread_id, NULL::bigint AS group_id, NULL::bool AS same
              WHERE false)"
        };
        ctes.push(format!(
            "
    -- Each copy as it is to be stored, by `ord`: the result reads it
    -- from here, and asks `inserted` only which ids went in (a hashed
    -- look-up). Joined to `inserted` by id instead, two CTEs the planner
    -- guesses at one row each became a nested loop, every copy scanning
    -- every other: 16 ms of a 34 ms statement of 140 copies (group sends).
    --
    -- A retried group send whose first try stored some copies (the others
    -- refused then) stores the rest in the first try's group and thread:
    -- each copy with a key probes for its own earlier copy (the
    -- idempotency index; group sends only), and the earlier copies' values
    -- win over the ids of copies that now conflict and are never stored.
    -- The earlier copy may have been stored under the key's other form, by
    -- a try that went to one recipient where this one goes to several, or
    -- the other way round (`other_copy_key`): then only to the same
    -- recipient. Only the same message's (subject, body and reply_to alike): a key
    -- used again for another text is another message, whose copies form
    -- a group and thread of their own, named by a copy with no earlier
    -- copy (stored unless a concurrent send took its key first, which
    -- `domain::send` repairs), so that one group is one text (search
    -- shows it once by its group) and `also_to` names its recipients only.
    stored AS MATERIALIZED (
        SELECT g.ord, g.id, g.sender_id, g.recipient_id, g.sord, g.idempotency_key, g.thread_id,
               g.group_id, g.fresh,
               -- A group's first copy lists every recipient of the copies
               -- stored with it, in order (as `heal_groups` writes it): the
               -- search index holds its text once, with each recipient's
               -- lexeme (migration V18).
               CASE WHEN g.group_id = g.id
                    THEN array_agg(g.recipient_id) FILTER (WHERE g.fresh) OVER (
                             PARTITION BY g.sord ORDER BY g.recipient_id
                             ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
               END AS group_recipients
        FROM (
            SELECT n.ord, n.id, n.sender_id, n.recipient_id, x.sord, x.idempotency_key,
                   o.same IS NULL AS fresh,
                   coalesce(r.thread_id, min(o.thread_id) FILTER (WHERE o.same) OVER same_send,
                            min(n.id) FILTER (WHERE o.same IS NULL) OVER same_send,
                            min(n.id) OVER same_send) AS thread_id,
                   CASE WHEN x.copies > 1
                        THEN coalesce(min(o.group_id) FILTER (WHERE o.same) OVER same_send,
                                      min(n.id) FILTER (WHERE o.same IS NULL) OVER same_send,
                                      min(n.id) OVER same_send)
                   END AS group_id
            FROM numbered n
            JOIN scopy x ON x.ord = n.ord
            JOIN sreq r ON r.sord = x.sord
            LEFT JOIN LATERAL {earlier} o ON true
            WINDOW same_send AS (PARTITION BY x.sord)) g),
"
        ));
    } else {
        // One recipient per send: each copy is stored as it is, in a
        // thread of its own unless it answers one.
        ctes.push(
            "
    stored AS MATERIALIZED (
        SELECT n.ord, n.id, n.sender_id, n.recipient_id, x.sord,
               -- A retry's copy conflicts with its first try's and is not
               -- stored (the insert skips it when the batch has keys).
               x.idempotency_key, coalesce(r.thread_id, n.id) AS thread_id,
               NULL::bigint AS group_id, NULL::bigint[] AS group_recipients
        FROM numbered n
        JOIN scopy x ON x.ord = n.ord
        JOIN sreq r ON r.sord = x.sord),
"
            .to_owned(),
        );
    }
    // Without keys no insert can conflict: none is speculative (an
    // insert with ON CONFLICT writes and confirms each row apart). With
    // keys, a copy an earlier try stored, under either form of its key, is
    // not inserted again, nor one that a try in flight beside this one
    // (in this statement, or not committed yet) stores: the unique indexes
    // stop it, `messages_idempotency_idx` the same form of the key (for a
    // send to one, whatever its recipient) and
    // `messages_idempotency_copy_idx` either form to the same recipient
    // (migration V27). No conflict target, so that both do. A group's copy
    // whose earlier copy this statement found is left out beforehand
    // (`fresh`): it must not count among the recipients the group's
    // first copy lists.
    let on_conflict = match (keyed, grouped) {
        (false, _) => String::new(),
        (true, false) => KEYED_INSERT.to_owned(),
        (true, true) => format!("WHERE s.fresh\n        {KEYED_INSERT}"),
    };
    ctes.push(format!(
        "
    inserted AS (
        INSERT INTO messages (id, sender_id, recipient_id, subject, body, reply_to, thread_id,
                              idempotency_key, expires_at, group_id, group_recipients, words)
        SELECT s.id, s.sender_id, s.recipient_id, r.subject, r.body, r.reply_to, s.thread_id,
               s.idempotency_key, now() + make_interval(secs => r.expires_in), s.group_id,
               s.group_recipients,
               -- Parsed once, for the rows the search index holds.
               CASE WHEN s.group_id IS NULL OR s.group_id = s.id THEN {words} END
        FROM stored s
        JOIN sreq r ON r.sord = s.sord
        {on_conflict}
        RETURNING id, sender_id, recipient_id, reply_to),
"
    ));
    if quotas {
        ctes.push(format!(
            "
    hour_counted AS (
        INSERT INTO send_counts AS sc (sender_id, hour_start, sends)
        SELECT sender_id, now(), count(*)
        FROM (SELECT sender_id FROM inserted
              UNION ALL SELECT sender_id FROM decided WHERE refusal IS NOT NULL) x
        WHERE {per_hour} > 0 GROUP BY sender_id
        ON CONFLICT (sender_id) DO UPDATE SET
            sends = CASE WHEN sc.hour_start <= now() - interval '1 hour' THEN excluded.sends
                         ELSE sc.sends + excluded.sends END,
            hour_start = CASE WHEN sc.hour_start <= now() - interval '1 hour' THEN now()
                              ELSE sc.hour_start END),
    -- Only pairs `decided` found new: a known pair (most sends) costs no
    -- second probe of the primary key here.
    -- `by_reply`: the pair began with a reply, which the new-recipient
    -- quota does not count (V26).
    met AS (
        INSERT INTO correspondents (sender_id, recipient_id, by_reply)
        -- A hashed look-up (the sublink inside coalesce stays a sub-plan),
        -- not a semi-join of two CTEs, which the planner made a nested loop.
        SELECT i.sender_id, i.recipient_id, bool_and(i.reply_to IS NOT NULL) FROM inserted i
        WHERE coalesce((i.sender_id, i.recipient_id) IN (
                  SELECT d.sender_id, d.recipient_id FROM decided d WHERE d.new_pair), false)
        GROUP BY i.sender_id, i.recipient_id
        ON CONFLICT DO NOTHING),
"
        ));
    }
    ctes.push(format!(
        "
    refusals AS (
        INSERT INTO refused_sends AS x (sender_id, recipient_id, reason, hits, hour)
        SELECT sender_id, recipient_id, refusal, count(*),
               floor(extract(epoch FROM now()) / 3600)::bigint
        FROM decided WHERE refusal IS NOT NULL
        GROUP BY sender_id, recipient_id, refusal
        ON CONFLICT (sender_id, recipient_id, reason, hour) WHERE hour IS NOT NULL
        DO UPDATE SET hits = x.hits + excluded.hits, at = now()),
    hooked AS (
        INSERT INTO webhook_deliveries (agent_id, message_id, summary)
        SELECT i.recipient_id, i.id, (
                   SELECT count(*) FROM (
                       SELECT 1 FROM webhook_deliveries d
                       WHERE d.agent_id = i.recipient_id AND d.state = 'pending' LIMIT {backlog_max}) x) >= {backlog_max}
        FROM inserted i
        -- Evaluated once: a semi-join of the two CTEs scanned every
        -- recipient for every copy (1.4 ms per group-send statement).
        WHERE i.recipient_id = ANY (ARRAY(SELECT recipient_id FROM resolved WHERE hooked))
        ON CONFLICT (agent_id) WHERE summary AND state = 'pending' DO NOTHING
        RETURNING agent_id)"
    ));
    ctes.concat()
}

/// The end of a keyed insert. Its comment tells the shapes apart in
/// `pg_stat_statements`, the tests and `bench/statement_pgbench.py`.
pub const KEYED_INSERT: &str = "-- Keyed: a copy a unique index holds already is not stored again.
        ON CONFLICT DO NOTHING";

/// The callers of `SENDS`, for the presence write.
pub(super) const SENDERS: &str = "SELECT sender_id AS id, last_seen_at FROM resolved";

#[cfg(test)]
mod tests {
    use crate::store::fragments::{INBOX_ORDER, available_to};

    /// The quotas' functions (migration V25, which cannot change once
    /// deployed) judge a backlog by the same conditions as the statement.
    #[test]
    fn the_quota_functions_read_the_backlog_as_the_statement_does() {
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let migration = words(include_str!(
            "../../../migrations/V25__quota_rare_checks.sql"
        ));
        let backlog = words(&available_to("to_id"));
        assert_eq!(migration.matches(&backlog).count(), 3, "{backlog}");
        assert_eq!(
            migration
                .matches(&format!("ORDER BY {INBOX_ORDER} LIMIT"))
                .count(),
            2
        );
        // A VOLATILE function would see the statement's own writes.
        assert_eq!(migration.matches("STABLE AS $$").count(), 2);
    }
}
