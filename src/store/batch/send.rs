//! The sends' part of the mail statement: verify each caller, resolve each
//! recipient, insert; and the wake-up check for recipients waiting in a
//! long poll.

use chrono::{DateTime, Utc};

use crate::store::fragments::caller_by_token;
use crate::store::wakeup::CHANNEL;

/// One send, resolved as far as the request alone allows. Not `Debug`: it
/// holds a token digest and a message body, which logs must never show.
#[derive(Clone)]
pub struct QueuedSend {
    pub token: [u8; 32],
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
pub struct SendOutcome {
    /// The sender, when its token (and claimed name) were accepted.
    pub me_id: Option<i64>,
    /// The stored message; `None` when the recipient is unknown or the
    /// idempotency key was already used.
    pub stored: Option<Stored>,
}

#[derive(Debug, Clone)]
pub struct Stored {
    pub id: i64,
    pub thread_id: i64,
    pub sent_at: DateTime<Utc>,
}

impl SendOutcome {
    pub(super) const NOT_ACCEPTED: Self = Self {
        me_id: None,
        stored: None,
    };

    /// From a row of the sends' part of the mail statement's result.
    pub(super) fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            me_id: row.get("me_id"),
            stored: row.get::<_, Option<i64>>("id").map(|id| Stored {
                id,
                thread_id: row.get("thread_id"),
                sent_at: row.get("sent_at"),
            }),
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
/// poll looked. Index: `inbox_waiters_agent_idx`.
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
/// `$1` token digests, `$2` claimed names, `$3` recipient names, `$4`
/// subjects, `$5` bodies, `$6` reply_to, `$7` threads, `$8` idempotency
/// keys, `$9` recipient ids (replies). `resolved` has the sender
/// (`sender_id`, `last_seen_at`) and recipient of each; `inserted` what was
/// stored. Each lookup is a LATERAL subquery with OFFSET 0, so it stays one
/// index probe per send whatever the planner thinks of the array's size.
pub(super) fn sends() -> String {
    let caller = caller_by_token("r.token", "r.claimed");
    format!(
        "
    sreq AS (
        SELECT * FROM unnest((SELECT $1::bytea[]), (SELECT $2::text[]), (SELECT $3::text[]),
                             (SELECT $4::text[]), (SELECT $5::text[]), (SELECT $6::bigint[]),
                             (SELECT $7::bigint[]), (SELECT $8::text[]), (SELECT $9::bigint[]))
            WITH ORDINALITY AS r(token, claimed, to_name, subject, body, reply_to, thread_id,
                                 idempotency_key, to_id, ord)),
    resolved AS (
        SELECT r.ord, me.id AS sender_id, me.last_seen_at, recipient.id AS recipient_id
        FROM sreq r
        LEFT JOIN LATERAL (
            SELECT id, last_seen_at FROM agents
            WHERE {caller}
            OFFSET 0) me ON true
        LEFT JOIN LATERAL (
            SELECT a.id FROM agents a
            WHERE r.to_id IS NULL AND a.name = r.to_name AND a.unregistered_at IS NULL
            UNION ALL
            SELECT a.id FROM agents a WHERE a.id = r.to_id AND a.unregistered_at IS NULL
        ) recipient ON me.id IS NOT NULL),
    numbered AS (
        SELECT x.ord, nextval('messages_id_seq') AS id, x.sender_id, x.recipient_id
        FROM (SELECT ord, sender_id, recipient_id FROM resolved
              WHERE recipient_id IS NOT NULL ORDER BY ord) x),
    inserted AS (
        INSERT INTO messages (id, sender_id, recipient_id, subject, body, reply_to, thread_id, idempotency_key)
        SELECT n.id, n.sender_id, n.recipient_id, r.subject, r.body, r.reply_to,
               coalesce(r.thread_id, n.id), r.idempotency_key
        FROM numbered n JOIN sreq r ON r.ord = n.ord
        ON CONFLICT (sender_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, thread_id, sent_at, recipient_id)"
    )
}

/// The callers of `SENDS`, for the presence write.
pub(super) const SENDERS: &str = "SELECT sender_id AS id, last_seen_at FROM resolved";
