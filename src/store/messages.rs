//! Statements on the mailbox (`messages`, `inbox_waiters`) that run one call
//! at a time: reply targets, idempotent replays, lease / peek / history
//! polls, waiters, acknowledgements, outbox and threads. Sends and read
//! polls go through group commit (`batch`).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::fragments::{
    INBOX_ORDER, POLLED_FIELDS, SENDER_LOOKUP, available_to, caller_by_token, key_range,
    message_columns, message_columns_seen_by, presence_write,
};
use super::rows::{Message, Sent};
use super::{Client, StoreError};

/// What a poll did for one caller.
#[derive(Debug, Clone, Default)]
pub struct Polled {
    /// The caller, when its token (and claimed name) were accepted.
    pub me_id: Option<i64>,
    /// What the poll returned, in its order.
    pub messages: Vec<Message>,
    /// Unread messages still available after the poll (capped: see the
    /// poll).
    pub waiting: i64,
    /// What became of each acknowledgement the poll carried, in order;
    /// `None` where the message was locked by another transaction, and
    /// the statement left it undecided rather than wait.
    pub acks: Vec<Option<AckOutcome>>,
    /// The poll stopped at its byte budget while more mail waits.
    pub full: bool,
    /// A look at the history: older messages exist beyond this page.
    pub more: bool,
}

impl Polled {
    /// Adds a row of a poll's result: one per message, or one without a
    /// message when there was none; `me_id` and `waiting` on every row.
    pub(super) fn add_row(&mut self, row: &tokio_postgres::Row) {
        self.me_id = Some(row.get("me_id"));
        self.waiting = row.get("waiting");
        if row.get::<_, Option<i64>>("id").is_some() {
            self.messages.push(Message::from_row(row));
        }
    }

    /// Adds an acknowledgement's row: `state` and the row's `ack_n` (its
    /// place, from 1) and `ack_current`.
    pub(super) fn add_ack_row(&mut self, state: &str, row: &tokio_postgres::Row) {
        let Ok(at) = usize::try_from(row.get::<_, i64>("ack_n") - 1) else {
            return;
        };
        if self.acks.len() <= at {
            self.acks.resize(at + 1, None);
        }
        self.acks[at] = match state {
            "acknowledged" => Some(AckOutcome::Acknowledged),
            "not_found" => Some(AckOutcome::NotFound),
            "stale" => Some(AckOutcome::Stale {
                current: row.get("ack_current"),
            }),
            _ => None,
        };
    }
}

/// The caller (`me`) of a one-call statement, by token digest `$1` and
/// claimed name `$2`, and its presence write.
fn me_with_presence() -> String {
    format!(
        "me AS (SELECT id, name, last_seen_at FROM agents WHERE {}),
         touched AS ({})",
        caller_by_token("$1", "$2"),
        presence_write("SELECT id, last_seen_at FROM me")
    )
}

/// The parties of message `$3`, for caller `$1`/`$2`: one row per party
/// (its sender, its recipient, and for a copy of a group send every other
/// copy's recipient), or one row with NULL `party_id` when the caller is
/// accepted but did not send or receive the message; no row when the caller
/// is not accepted. Indexes: token, primary keys, the other copies by
/// `messages_group_idx`.
static REPLY_PARTIES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH me AS (SELECT id FROM agents WHERE {}),
              m AS (SELECT m.id, m.thread_id, m.sender_id, m.recipient_id, m.group_id
                    FROM me JOIN messages m
                      ON m.id = $3 AND (m.sender_id = me.id OR m.recipient_id = me.id))
         SELECT me.id AS me_id, m.thread_id, m.sender_id, m.recipient_id,
                p.id AS party_id, a.name AS party
         FROM me
         LEFT JOIN m ON true
         LEFT JOIN LATERAL (
             SELECT m.sender_id AS id
             UNION SELECT m.recipient_id
             UNION SELECT g.recipient_id FROM messages g
                   WHERE m.group_id IS NOT NULL AND g.group_id = m.group_id) p ON m.id IS NOT NULL
         LEFT JOIN agents a ON a.id = p.id
         ORDER BY p.id",
        caller_by_token("$1", "$2")
    )
});

/// The conversation a reply joins.
#[derive(Debug, Clone)]
pub struct ReplyTarget {
    pub me_id: i64,
    pub thread_id: i64,
    /// Who sent the message being answered.
    pub sender_id: i64,
    pub recipient_id: i64,
    /// Everyone the message went between (the caller included), by id and name.
    pub parties: Vec<(i64, String)>,
}

/// `None` when the credentials are not accepted; `Some(None)` when the
/// message is not one the caller sent or received.
pub async fn reply_target(
    db: &Client,
    token_hash: &[u8],
    claimed: Option<&str>,
    message_id: i64,
) -> Result<Option<Option<ReplyTarget>>, StoreError> {
    let stmt = db.prepare_cached(&REPLY_PARTIES).await?;
    let rows = db
        .query(&stmt, &[&token_hash, &claimed, &message_id])
        .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    if first.get::<_, Option<i64>>("party_id").is_none() {
        return Ok(Some(None));
    }
    Ok(Some(Some(ReplyTarget {
        me_id: first.get("me_id"),
        thread_id: first.get("thread_id"),
        sender_id: first.get("sender_id"),
        recipient_id: first.get("recipient_id"),
        parties: rows
            .iter()
            .map(|r| (r.get("party_id"), r.get("party")))
            .collect(),
    })))
}

/// The messages sender `$1` sent with the idempotency keys `$2`, one row
/// per key found (a key in either of its forms). Index:
/// `messages_idempotency_idx`.
const BY_IDEMPOTENCY_KEYS: &str =
    "SELECT m.id, m.idempotency_key, r.name AS recipient, m.subject, m.body,
            m.reply_to, m.thread_id, m.group_id, m.sent_at
     FROM messages m JOIN agents r ON r.id = m.recipient_id
     WHERE m.sender_id = $1 AND m.idempotency_key = ANY ($2::text[])";

/// What an earlier send with the same key stored.
#[derive(Debug, Clone)]
pub struct Earlier {
    pub id: i64,
    pub recipient: String,
    pub subject: Option<String>,
    pub body: String,
    pub reply_to: Option<i64>,
    pub thread_id: i64,
    pub group_id: Option<i64>,
    pub sent_at: DateTime<Utc>,
}

/// One copy's key as a retry looks it up: its own form, the form a try to
/// one recipient (or to several) would have stored (`other_copy_key`), and
/// its recipient, which a copy found by the other form must have.
pub struct CopyKey<'a> {
    pub key: String,
    pub other: String,
    pub recipient: &'a str,
}

/// For each of `keys`, what `sender_id` stored with it, if anything.
pub async fn by_idempotency_keys(
    db: &Client,
    sender_id: i64,
    keys: &[CopyKey<'_>],
) -> Result<Vec<Option<Earlier>>, StoreError> {
    let stmt = db.prepare_cached(BY_IDEMPOTENCY_KEYS).await?;
    let wanted: Vec<&str> = keys
        .iter()
        .flat_map(|k| [k.key.as_str(), k.other.as_str()])
        .collect();
    let rows = db.query(&stmt, &[&sender_id, &wanted]).await?;
    fn key_of(row: &tokio_postgres::Row) -> &str {
        row.get("idempotency_key")
    }
    Ok(keys
        .iter()
        .map(|k| {
            // This recipient's copy under either form, else whatever holds
            // the key (another recipient's: a conflict).
            let to_recipient =
                |r: &&tokio_postgres::Row| r.get::<_, &str>("recipient") == k.recipient;
            rows.iter()
                .filter(to_recipient)
                .find(|r| key_of(r) == k.key)
                .or_else(|| {
                    rows.iter()
                        .filter(to_recipient)
                        .find(|r| key_of(r) == k.other)
                })
                .or_else(|| rows.iter().find(|r| key_of(r) == k.key))
                .map(|r| Earlier {
                    id: r.get("id"),
                    recipient: r.get("recipient"),
                    subject: r.get("subject"),
                    body: r.get("body"),
                    reply_to: r.get("reply_to"),
                    thread_id: r.get("thread_id"),
                    group_id: r.get("group_id"),
                    sent_at: r.get("sent_at"),
                })
        })
        .collect())
}

/// A probe copy of a key, kept out of the unread indexes, whose insert
/// waits while a concurrent send's copy holding the key (in either form:
/// `messages_idempotency_idx`, `messages_idempotency_copy_idx`) is not yet
/// committed, and is not inserted if that copy was (or one was already).
const PROBE_COPY: &str = "
    INSERT INTO messages (sender_id, recipient_id, body, thread_id, idempotency_key, read_at)
    SELECT $1, r.id, '', 0, $2, now() FROM agents r WHERE r.name = $3
    ON CONFLICT DO NOTHING";

/// Waits for a copy of `key` that a concurrent send of `sender_id` is
/// storing now, which no snapshot shows before it commits (a retry refused
/// at the hourly quota while its first try, which was not, is still in
/// flight must answer with that try's copy, not "not sent"). The probe is
/// rolled back. A try between its statement's start and its insert is not
/// waited for.
pub async fn wait_for_a_copy_in_flight(
    db: &Client,
    sender_id: i64,
    key: &CopyKey<'_>,
) -> Result<(), StoreError> {
    db.rolled_back(async |db| {
        let stmt = db.prepare_cached(PROBE_COPY).await?;
        db.execute(&stmt, &[&sender_id, &key.key, &key.recipient])
            .await?;
        Ok(())
    })
    .await
}

/// Puts copies `ids` of a group send by `sender_id` into thread
/// `thread_id` and group `group_id`, unless they are there already: those
/// of the copies an earlier try of it stored (a retry racing that try,
/// through another replica, cannot see its uncommitted copies and gives
/// the copies it stores a group of its own), or its own lowest stored
/// copy's (`domain::send`). Then [`heal_groups`] for that group and the
/// groups the copies left, in the same transaction. With no `ids`, the
/// heal alone.
///
/// One join of a group at a time (a transaction's advisory lock on it,
/// taken first): the heal lists the group's members as its statement's
/// snapshot shows them, and two retries joining one group at once each
/// listed the members without the other's copy; the later write won, and
/// search lost a recipient (a helper's attack: 16 of 40 rounds with 5
/// parallel retries).
///
/// Last, a thread that no message names (`mend_threads`). A deadlock with
/// another repair or a send is tried again (twice): a group left split
/// stays split until a retry of the send.
pub async fn join_group(
    db: &Client,
    sender_id: i64,
    ids: &[i64],
    thread_id: i64,
    group_id: i64,
    members_max: usize,
) -> Result<bool, StoreError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match join_group_once(db, sender_id, ids, thread_id, group_id, members_max).await {
            Err(e) if e.is_conflict() && attempts < 3 => {
                tracing::debug!(error = %e, group_id, "a group's repair conflicted; trying again");
            }
            done => return done,
        }
    }
}

async fn join_group_once(
    db: &Client,
    sender_id: i64,
    ids: &[i64],
    thread_id: i64,
    group_id: i64,
    members_max: usize,
) -> Result<bool, StoreError> {
    db.transaction(async |db| {
        let lock = db.prepare_cached(LOCK_GROUP).await?;
        db.execute(&lock, &[&group_id]).await?;
        // Counted under the group's lock: retries that add recipients one
        // after another (or at once) cannot take it past the limit. The
        // copies may be in it already (the send statement put them in the
        // group of the earlier copies it found): then they leave it.
        let count = db.prepare_cached(GROUP_WITH).await?;
        let members: i64 = db
            .query_one(&count, &[&group_id, &ids])
            .await?
            .get(0);
        if !ids.is_empty() && members > i64::try_from(members_max).unwrap_or(i64::MAX) {
            let leave = db.prepare_cached(LEAVE_GROUP).await?;
            let row = db.query_one(&leave, &[&sender_id, &ids]).await?;
            let mut groups = vec![group_id];
            groups.extend(row.get::<_, Option<i64>>(0));
            heal_groups(db, &groups).await?;
            return Ok(false);
        }
        let stmt = db
            .prepare_cached(
                "WITH moved AS (
                     UPDATE messages m SET thread_id = $3, group_id = $4
                     FROM (SELECT id, group_id FROM messages
                           WHERE sender_id = $1 AND id = ANY ($2::bigint[]) FOR UPDATE) old
                     WHERE m.id = old.id AND m.id = ANY ($2::bigint[])
                       AND (m.thread_id, m.group_id) IS DISTINCT FROM ($3, $4)
                     RETURNING old.group_id)
                 SELECT ARRAY(SELECT DISTINCT group_id FROM moved WHERE group_id IS NOT NULL) AS left",
            )
            .await?;
        let row = db
            .query_one(&stmt, &[&sender_id, &ids, &thread_id, &group_id])
            .await?;
        let mut groups: Vec<i64> = row.get("left");
        groups.push(group_id);
        heal_groups(db, &groups).await?;
        let mend = db.prepare_cached(MEND_THREADS).await?;
        db.execute(&mend, &[&groups, &thread_id]).await?;
        Ok(true)
    })
    .await
}

/// Copies `$2` of sender `$1` as a message of their own: a group named
/// after the lowest of them, none for one. The new group, if any.
const LEAVE_GROUP: &str = "
    WITH own AS (
        SELECT CASE WHEN cardinality($2::bigint[]) > 1
                    THEN (SELECT min(x) FROM unnest($2::bigint[]) x) END AS group_id),
    left_group AS (
        UPDATE messages m SET group_id = own.group_id FROM own
        WHERE m.sender_id = $1 AND m.id = ANY ($2::bigint[])
          AND m.group_id IS DISTINCT FROM own.group_id)
    SELECT group_id FROM own";

/// How many copies group `$1` would hold with copies `$2` in it.
const GROUP_WITH: &str = "
    SELECT count(*) FROM messages
    WHERE group_id = $1 OR id = ANY ($2::bigint[]) OR id = $1";

/// The threads of groups `$1` and thread `$2` that no message has the id
/// of move to their lowest message. A group send's thread is named after
/// its first copy as the statement planned it; when a racing try's key
/// kept that copy out, and no repair moved the others (its own failed, or
/// it moved them into a thread named the same way by another try), the
/// thread named no message, and `phone_thread` found none (a helper's
/// attack: 8 such threads in 400 rounds of 14 racing tries).
/// `messages_thread_cover_idx`, `messages_group_idx`.
const MEND_THREADS: &str = "
    UPDATE messages m SET thread_id = t.first
    FROM (SELECT d.thread_id AS gone,
                 (SELECT min(x.id) FROM messages x WHERE x.thread_id = d.thread_id) AS first
          FROM (SELECT thread_id FROM messages WHERE group_id = ANY ($1::bigint[])
                UNION SELECT $2::bigint) d
          WHERE NOT EXISTS (SELECT 1 FROM messages e WHERE e.id = d.thread_id)) t
    WHERE m.thread_id = t.gone AND t.first IS NOT NULL";

/// The thread each of messages `ids` is in now, by id.
pub async fn threads_of(
    db: &Client,
    ids: &[i64],
) -> Result<std::collections::HashMap<i64, i64>, StoreError> {
    let stmt = db
        .prepare_cached("SELECT id, thread_id FROM messages WHERE id = ANY ($1::bigint[])")
        .await?;
    let rows = db.query(&stmt, &[&ids]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Serialises the joins of group `$1` (see [`join_group`]).
const LOCK_GROUP: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('phone:group:' || $1::bigint, 0))";

/// Makes each of `groups` (group ids) what the search index expects
/// (migration V18): named after a stored copy (its own first copy if it
/// still exists, else its lowest copy), that copy listing the recipients
/// of every copy in the group and storing its words (migration V20), the
/// others neither. From the copies
/// themselves, so whatever left a group otherwise (a repair that never
/// ran, a poll that took the first copy in the statement that was to list
/// a retry's copy, retention deleting the first copy) is mended. Rows
/// already right are not written. `messages_group_idx`, then primary key.
pub async fn heal_groups(db: &Client, groups: &[i64]) -> Result<(), StoreError> {
    if groups.is_empty() {
        return Ok(());
    }
    let stmt = db.prepare_cached(&HEAL_GROUPS).await?;
    db.execute(&stmt, &[&groups]).await?;
    Ok(())
}

/// [`heal_groups`]' statement, built once: `$1` the group ids.
static HEAL_GROUPS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH members AS MATERIALIZED (
             SELECT id, recipient_id, group_id AS old FROM messages
             WHERE group_id = ANY ($1::bigint[])),
         firsts AS MATERIALIZED (
             SELECT old, CASE WHEN bool_or(id = old) THEN old ELSE min(id) END AS first,
                    array_agg(DISTINCT recipient_id ORDER BY recipient_id) AS recipients
             FROM members GROUP BY old),
         wanted AS MATERIALIZED (
             SELECT x.id, f.first,
                    CASE WHEN x.id = f.first THEN f.recipients END AS recipients
             FROM members x JOIN firsts f ON f.old = x.old)
         UPDATE messages m SET group_id = w.first, group_recipients = w.recipients,
                               words = CASE WHEN w.id = w.first THEN coalesce(m.words, {words}) END
         FROM wanted w
         WHERE m.id = ANY (ARRAY(SELECT id FROM wanted)) AND m.id = w.id
           AND ((m.group_id, m.group_recipients) IS DISTINCT FROM (w.first, w.recipients)
                OR (m.words IS NULL) = (w.id = w.first))",
        words = super::fragments::stored_words("m.subject", "m.body"),
    )
});

/// A poll that takes nothing (polls that take mail are batched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// The oldest available messages, changing nothing.
    Peek,
    /// The most recent messages, read or not, newest first, older than
    /// `before` (a message id) when given; changes nothing.
    History { before: Option<i64> },
}

/// The unread count of a listing: at most `limit` (an SQL expression: the
/// cap, or limit + cap) of the caller's available messages, in index order. A CTE of its own, joined
/// once: as a sub-select of the listing's columns it was counted again for
/// every message listed (20 counts of a 4,000-message backlog: 92 of a
/// search's 104 ms).
pub(super) fn count_waiting(limit: &str) -> String {
    format!(
        "SELECT count(*) AS n FROM me CROSS JOIN LATERAL (
             SELECT 1 FROM messages m WHERE {}
             ORDER BY {INBOX_ORDER} LIMIT {limit}) w",
        available_to("me.id")
    )
}

/// The statements of [`Look`]. `$1` token digest, `$2` claimed name, `$3`
/// limit, `$4` count cap; history: `$5` the id the page goes back from
/// (NULL: the newest). One row per
/// message (or one without), each with `me_id` and `waiting`. Indexes:
/// `messages_unread_idx` (available mail), `messages_inbox_cover_idx`
/// (history, as a key range).
fn look_sql(look: Look) -> String {
    let me = me_with_presence();
    let columns = message_columns("me.name");
    let available = available_to("me.id");
    match look {
        Look::History { .. } => format!(
            "WITH {me},
                  waiting AS ({waiting})
             SELECT me.id AS me_id, {columns}, waiting.n AS waiting
             FROM me CROSS JOIN waiting
             LEFT JOIN LATERAL (
                 SELECT {POLLED_FIELDS} FROM messages m
                 WHERE {inbox}
                 ORDER BY m.recipient_id DESC, m.id DESC
                 LIMIT $3) m ON true
             {SENDER_LOOKUP}
             ORDER BY m.id DESC",
            inbox = key_range("recipient_id", "me.id", "NULL::bigint", "$5::bigint"),
            waiting = count_waiting("$4")
        ),
        Look::Peek => format!(
            "WITH {me},
                  picked AS (
                      SELECT {POLLED_FIELDS} FROM me CROSS JOIN LATERAL (
                          SELECT * FROM messages m WHERE {available}
                          ORDER BY {INBOX_ORDER} LIMIT $3) m),
                  waiting AS ({waiting})
             SELECT me.id AS me_id, {columns}, waiting.n AS waiting
             FROM me CROSS JOIN waiting
             LEFT JOIN picked m ON true
             {SENDER_LOOKUP}
             ORDER BY m.id",
            waiting = count_waiting("$3 + $4")
        ),
    }
}

static LOOK_SQL: LazyLock<[String; 2]> = LazyLock::new(|| {
    [
        look_sql(Look::Peek),
        look_sql(Look::History { before: None }),
    ]
});

/// One poll of `look` for the caller `token_hash`/`claimed`: at most `limit`
/// messages; `waiting` counts up to `cap` beyond them.
pub async fn look(
    db: &Client,
    look: Look,
    token_hash: &[u8],
    claimed: Option<&str>,
    limit: i64,
    cap: i64,
) -> Result<Polled, StoreError> {
    let rows = match look {
        Look::Peek => {
            let stmt = db.prepare_cached(&LOOK_SQL[0]).await?;
            db.query(&stmt, &[&token_hash, &claimed, &limit, &cap])
                .await?
        }
        Look::History { before } => {
            let stmt = db.prepare_cached(&LOOK_SQL[1]).await?;
            db.query(&stmt, &[&token_hash, &claimed, &limit, &cap, &before])
                .await?
        }
    };
    let mut polled = Polled::default();
    for row in &rows {
        polled.add_row(row);
    }
    Ok(polled)
}

/// Puts messages a poll took back as they were, when their caller could not
/// be handed them: `$1` recipient, `$2` ids, and what the poll left in each
/// (`$3` read_at, `$4` leased_until, `$5` delivery_count). A message that
/// changed since (acknowledged, taken again) is left alone. Returns the ids
/// put back. Primary key.
const GIVE_BACK: &str = "UPDATE messages m
     SET read_at = NULL, leased_until = NULL, delivery_count = m.delivery_count - 1
     FROM unnest($2::bigint[], $3::timestamptz[], $4::timestamptz[], $5::int[])
          AS g(id, read_at, leased_until, delivery_count)
     WHERE m.id = g.id AND m.recipient_id = $1 AND m.acked_at IS NULL
       AND m.read_at IS NOT DISTINCT FROM g.read_at
       AND m.leased_until IS NOT DISTINCT FROM g.leased_until
       AND m.delivery_count = g.delivery_count
     RETURNING m.id";

/// Gives back what `polled` took (see [`GIVE_BACK`]); the ids put back.
pub async fn give_back(db: &Client, polled: &Polled) -> Result<Vec<i64>, StoreError> {
    let Some(recipient) = polled.me_id else {
        return Ok(Vec::new());
    };
    let ids: Vec<i64> = polled.messages.iter().map(|m| m.id).collect();
    let read_at: Vec<Option<DateTime<Utc>>> = polled.messages.iter().map(|m| m.read_at).collect();
    let leased: Vec<Option<DateTime<Utc>>> =
        polled.messages.iter().map(|m| m.leased_until).collect();
    let count: Vec<i32> = polled.messages.iter().map(|m| m.delivery_count).collect();
    db.acknowledged(async |db| {
        let stmt = db.prepare_cached(GIVE_BACK).await?;
        Ok(db
            .query(&stmt, &[&recipient, &ids, &read_at, &leased, &count])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    })
    .await
}

/// [`give_back`] on a pooled connection, retried with backoff (0.1 s
/// doubling to 5 s) until it lands: a busy pool or a database that blinked
/// must not leave read-mode mail marked read for a caller that never got
/// it. Logs ids only, so that an operator can find what stayed read if the
/// process ends first (`include_read` shows it to its recipient too).
/// Whether any message went back.
pub async fn give_back_until_landed(pool: &super::Pool, polled: &Polled) -> bool {
    let taken: Vec<i64> = polled.messages.iter().map(|m| m.id).collect();
    let mut delay = std::time::Duration::from_millis(100);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let outcome = async { give_back(&pool.get().await?, polled).await }.await;
        match outcome {
            Ok(back) => {
                tracing::info!(
                    recipient = polled.me_id,
                    put_back = back.len(),
                    taken = taken.len(),
                    attempt,
                    "a poll's caller left before its answer; its messages are unread again"
                );
                return !back.is_empty();
            }
            Err(e) if pool.is_closed() => {
                tracing::error!(
                    error = %e,
                    recipient = polled.me_id,
                    ids = ?taken,
                    "a poll's caller left and the pool closed before its messages were put back; they stay read"
                );
                return false;
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    recipient = polled.me_id,
                    attempt,
                    retry_in_ms = delay.as_millis() as u64,
                    "could not put a poll's messages back yet; retrying"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
}

/// A long poll's row, so that sends to `$1` notify (see `batch::send`);
/// also clears that agent's expired rows. `$2` seconds to live.
///
/// The id is random rather than the table's identity: the identity's
/// sequence belongs to an unlogged table, so it is unlogged too, and on a
/// standby promoted by a failover PostgreSQL 15 cannot read it ("bad magic
/// number in sequence", SQLSTATE XX000: every long poll failed as an
/// internal error; tests/failover.rs). Rows live seconds; two of 2^52
/// values colliding among them is not a concern.
const ADD_WAITER: &str = "WITH expired AS (
         DELETE FROM inbox_waiters WHERE agent_id = $1 AND expires_at < now())
     INSERT INTO inbox_waiters (id, agent_id, expires_at) OVERRIDING SYSTEM VALUE
     VALUES ((random() * 9.2e18)::bigint, $1, now() + make_interval(secs => $2)) RETURNING id";

pub async fn add_waiter(db: &Client, agent_id: i64, ttl_secs: f64) -> Result<i64, StoreError> {
    let stmt = db.prepare_cached(ADD_WAITER).await?;
    Ok(db.query_one(&stmt, &[&agent_id, &ttl_secs]).await?.get(0))
}

const REMOVE_WAITER: &str = "DELETE FROM inbox_waiters WHERE id = $1";

pub async fn remove_waiter(db: &Client, waiter_id: i64) -> Result<(), StoreError> {
    let stmt = db.prepare_cached(REMOVE_WAITER).await?;
    db.execute(&stmt, &[&waiter_id]).await.map(drop)
}

/// Acknowledges messages addressed to the caller, verified inside the
/// statement (`$1` token digest, `$2` claimed name; with its presence
/// write), as sends and polls are: one round trip, where verifying first
/// took a statement of its own. `$3` ids and `$4` the delivery each
/// acknowledgement is for (a receipt's; NULL for a plain id, which
/// acknowledges whatever delivery is current). One row per request (in
/// order): whether it is acknowledged now (also before), and the
/// message's delivery when it is not (`current`, NULL when no such
/// message); no row when the credentials were not accepted. Primary key.
static ACK: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH {},
              req AS (
                  SELECT * FROM unnest($3::bigint[], $4::int[]) WITH ORDINALITY AS r(id, delivery, ord)),
              -- Acknowledged rows too (unchanged): an acknowledgement that
              -- waited for a concurrent one of the same message finds it
              -- acknowledged only here, on the row's latest version; the
              -- select below reads the message as it was before that one
              -- committed, and took its receipt for a stale one.
              acked AS (
                  UPDATE messages m
                  SET acked_at = coalesce(m.acked_at, now()), read_at = coalesce(m.read_at, now()),
                      leased_until = NULL
                  FROM req r, me
                  WHERE m.id = r.id AND m.recipient_id = me.id
                    AND (r.delivery IS NULL OR m.delivery_count = r.delivery)
                  RETURNING m.id, m.delivery_count AS delivery)
         -- Acknowledged by this receipt's delivery: the receipt of an
         -- earlier one is stale, also once the later one is acknowledged
         -- (the worker whose lease ended must not act on it again).
         SELECT r.ord, m.id IS NOT NULL AS found,
                (EXISTS (SELECT 1 FROM acked a
                         WHERE a.id = r.id AND (r.delivery IS NULL OR a.delivery = r.delivery))
                 OR (m.acked_at IS NOT NULL
                     AND (r.delivery IS NULL OR m.delivery_count = r.delivery))) AS acknowledged,
                m.delivery_count AS current
         FROM me CROSS JOIN req r
         LEFT JOIN messages m ON m.id = r.id AND m.recipient_id = me.id
         ORDER BY r.ord",
        me_with_presence()
    )
});

/// What became of one acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Acknowledged now, or before.
    Acknowledged,
    /// The receipt's delivery is not the message's current one: it was
    /// handed out again since (`current` is that delivery's number).
    Stale { current: i32 },
    /// No message with this id is addressed to the caller.
    NotFound,
}

/// `wanted` (not empty): (message id, the delivery a receipt names, if
/// any), for the caller `token_hash`/`claimed`; `None` when the
/// credentials were not accepted.
pub async fn ack(
    db: &Client,
    token_hash: &[u8],
    claimed: Option<&str>,
    wanted: &[(i64, Option<i32>)],
) -> Result<Option<Vec<AckOutcome>>, StoreError> {
    let ids: Vec<i64> = wanted.iter().map(|w| w.0).collect();
    let deliveries: Vec<Option<i32>> = wanted.iter().map(|w| w.1).collect();
    let rows = db
        .acknowledged(async |db| {
            let stmt = db.prepare_cached(&ACK).await?;
            db.query(&stmt, &[&token_hash, &claimed, &ids, &deliveries])
                .await
        })
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .map(|r| {
                if !r.get::<_, bool>("found") {
                    AckOutcome::NotFound
                } else if r.get::<_, bool>("acknowledged") {
                    AckOutcome::Acknowledged
                } else {
                    AckOutcome::Stale {
                        current: r.get("current"),
                    }
                }
            })
            .collect(),
    ))
}

/// What `$1` sent, newest first, before message id `$2` (NULL: from the
/// newest), `$3` rows. A key range of `messages_sender_cover_idx`.
static OUTBOX: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT m.id, r.name AS recipient, m.subject, m.body, m.reply_to, m.thread_id,
                m.sent_at, m.read_at, m.acked_at, m.delivery_count,
                CASE WHEN m.acked_at IS NOT NULL THEN 'acknowledged'
                     WHEN m.read_at IS NOT NULL THEN 'read'
                     -- Mail a block withdrew looks waiting to its sender,
                     -- as a refusal reads like a policy's: a block is not revealed.
                     WHEN m.dead_reason = 'expired' THEN 'expired'
                     WHEN m.dead_at IS NOT NULL AND m.dead_reason IS DISTINCT FROM 'blocked' THEN 'dead'
                     WHEN m.expires_at <= now() THEN 'expired'
                     WHEN m.leased_until > now() THEN 'leased'
                     ELSE 'waiting' END AS state
         FROM (SELECT * FROM messages m
               WHERE {}
               ORDER BY m.sender_id DESC, m.id DESC
               LIMIT $3) m
         JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.id DESC",
        key_range("sender_id", "$1::bigint", "NULL::bigint", "$2::bigint")
    )
});

pub async fn outbox(
    db: &Client,
    sender_id: i64,
    before: Option<i64>,
    fetch: i64,
) -> Result<Vec<Sent>, StoreError> {
    let stmt = db.prepare_cached(&OUTBOX).await?;
    let rows = db.query(&stmt, &[&sender_id, &before, &fetch]).await?;
    Ok(rows.iter().map(Sent::from_row).collect())
}

/// The thread of message `$1`, when `$2` sent or received it. Primary key.
const THREAD_OF: &str =
    "SELECT thread_id FROM messages WHERE id = $1 AND (sender_id = $2 OR recipient_id = $2)";

pub async fn thread_of(
    db: &Client,
    message_id: i64,
    participant: i64,
) -> Result<Option<i64>, StoreError> {
    let stmt = db.prepare_cached(THREAD_OF).await?;
    Ok(db
        .query_opt(&stmt, &[&message_id, &participant])
        .await?
        .map(|r| r.get(0)))
}

/// Thread `$1`'s messages that `$2` sent or received, oldest first, after
/// message id `$3` (NULL: from the first), `$4` rows. A key range of
/// `messages_thread_cover_idx`.
static THREAD: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}
         FROM (SELECT * FROM messages m
               WHERE {}
                 AND (m.sender_id = $2 OR m.recipient_id = $2)
               ORDER BY m.thread_id, m.id
               LIMIT $4) m
         JOIN agents s ON s.id = m.sender_id
         JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.id",
        message_columns_seen_by("r.name", "$2"),
        key_range("thread_id", "$1::bigint", "$3::bigint", "NULL::bigint")
    )
});

pub async fn thread(
    db: &Client,
    thread_id: i64,
    participant: i64,
    after: Option<i64>,
    fetch: i64,
) -> Result<Vec<Message>, StoreError> {
    let stmt = db.prepare_cached(&THREAD).await?;
    let rows = db
        .query(&stmt, &[&thread_id, &participant, &after, &fetch])
        .await?;
    Ok(rows.iter().map(Message::from_row).collect())
}

/// `$1` message ids, `$2` their groups: the other recipients of each copy
/// of a group send, as the listings name them (`fragments::also_to`).
static ALSO_TO: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT m.id, {} FROM unnest($1::bigint[], $2::bigint[]) AS m(id, group_id)",
        super::fragments::also_to("true")
    )
});

/// Fills in `also_to` of the copies of group sends among `messages` (what
/// the hot poll leaves out). One statement, and none without such a copy.
pub async fn fill_also_to(db: &Client, messages: &mut [Message]) -> Result<(), StoreError> {
    let copies: Vec<&Message> = messages.iter().filter(|m| m.group_id.is_some()).collect();
    if copies.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = copies.iter().map(|m| m.id).collect();
    let groups: Vec<Option<i64>> = copies.iter().map(|m| m.group_id).collect();
    let stmt = db.prepare_cached(&ALSO_TO).await?;
    let rows = db.query(&stmt, &[&ids, &groups]).await?;
    for row in rows {
        let id: i64 = row.get("id");
        if let Some(m) = messages.iter_mut().find(|m| m.id == id) {
            m.also_to = super::rows::others(row.get("also_to"));
        }
    }
    Ok(())
}
