//! Search of one's own mail: full text over subject and body of what the
//! caller sent or received, ranked, with filters and paging.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::fragments::{
    INBOX_ORDER, MESSAGE_SEARCH, SENDER_LOOKUP, available_to, caller_by_token,
    message_columns_seen_by, presence_write,
};
use super::messages::Polled;
use super::{Client, StoreError};

/// One search: the words (any text: `plainto_tsquery` parses no operator),
/// and the filters.
#[derive(Debug, Clone)]
pub struct MailQuery<'a> {
    pub words: &'a str,
    /// Only mail with this agent (by name; every agent that held it).
    pub with: Option<&'a str>,
    pub thread_id: Option<i64>,
    pub since: Option<DateTime<Utc>>,
    pub limit: i64,
    pub offset: i64,
}

/// `$1` token digest, `$2` claimed name, `$3` words, `$4` the other party's
/// name (NULL: any), `$5` thread (NULL: any), `$6` sent at or after (NULL:
/// any), `$7` rows, `$8` rows skipped, `$9` cap of the unread count. One row
/// per message, best first (or one without a message), each with `me_id`
/// and the caller's unread count as `waiting`.
///
/// Only ever the caller's mail, twice over: the tsquery ANDs the caller's
/// own lexeme (`'p <id>'`, see migration V13), so `messages_search_idx`
/// yields only its messages, and every row is checked to be sent or
/// received by it.
///
/// Ranking reads each candidate's text again (the index is on an
/// expression), so only the newest [`SEARCH_CANDIDATES`] matches are ranked:
/// a word in thousands of one's messages costs a bitmap of them and the
/// ranking of a bounded few, not thousands of `to_tsvector` calls. The
/// matches are a CTE of their own without an order, so no plan can look for
/// them by walking the primary key backwards and parsing every body.
static SEARCH: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH me AS (SELECT id, name, last_seen_at FROM agents WHERE {caller}),
              touched AS ({touch}),
              q AS (SELECT plainto_tsquery('english', $3) AS words,
                           plainto_tsquery('english', $3) && ('''p ' || me.id || '''')::tsquery AS mine
                    FROM me),
              matched AS MATERIALIZED (
                  SELECT m.id FROM messages m, me
                  WHERE {MESSAGE_SEARCH} @@ (SELECT mine FROM q)
                    AND (SELECT numnode(words) > 0 FROM q)
                    -- `IS TRUE` keeps the planner from ANDing the sender and
                    -- inbox indexes (a whole mailbox) into the GIN scan.
                    AND (m.sender_id = me.id OR m.recipient_id = me.id) IS TRUE
                    AND ($4::text IS NULL OR EXISTS (
                            SELECT 1 FROM agents o
                            WHERE o.name = $4::text AND o.id IN (m.sender_id, m.recipient_id)
                              AND o.id <> me.id))
                    AND ($5::bigint IS NULL OR m.thread_id = $5::bigint)
                    AND ($6::timestamptz IS NULL OR m.sent_at >= $6::timestamptz)),
              ranked AS MATERIALIZED (
                  SELECT m.*, ts_rank({MESSAGE_SEARCH}, q.words) AS rank
                  FROM messages m, q
                  WHERE m.id = ANY (ARRAY(
                      SELECT id FROM matched ORDER BY id DESC LIMIT {SEARCH_CANDIDATES}))
                  ORDER BY rank DESC, m.id DESC
                  LIMIT $7 OFFSET $8)
         SELECT me.id AS me_id, {columns},
                (SELECT count(*) FROM (
                     SELECT 1 FROM messages m WHERE {available}
                     ORDER BY {INBOX_ORDER} LIMIT $9) w) AS waiting
         FROM me
         LEFT JOIN ranked m ON true
         {SENDER_LOOKUP}
         LEFT JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.rank DESC, m.id DESC",
        caller = caller_by_token("$1", "$2"),
        touch = presence_write("SELECT id, last_seen_at FROM me"),
        columns = message_columns_seen_by("r.name", "me.id"),
        available = available_to("me.id"),
    )
});

/// Matches ranked per search, newest first: a search finds the best of
/// one's newest 200 messages with all its words. Ranking parses each body
/// again: 500 took ~8 ms of a 21 ms search for a word in 5,485 of a 20,000
/// message mailbox (EXPLAIN ANALYZE on the bench's teams database).
pub const SEARCH_CANDIDATES: i64 = 200;

/// `None` in `me_id` when the credentials are not accepted.
pub async fn search(
    db: &Client,
    token_hash: &[u8],
    claimed: Option<&str>,
    query: &MailQuery<'_>,
    cap: i64,
) -> Result<Polled, StoreError> {
    let stmt = db.prepare_cached(&SEARCH).await?;
    let rows = db
        .query(
            &stmt,
            &[
                &token_hash,
                &claimed,
                &query.words,
                &query.with,
                &query.thread_id,
                &query.since,
                &query.limit,
                &query.offset,
                &cap,
            ],
        )
        .await?;
    let mut found = Polled::default();
    for row in &rows {
        found.add_row(row);
    }
    Ok(found)
}
