//! Search of one's own mail: full text over subject and body of what the
//! caller sent or received, ranked, with filters and paging.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::fragments::{
    MESSAGE_SEARCH, SENDER_LOOKUP, caller_by_token, message_columns_seen_by, presence_write,
};
use super::messages::{Polled, count_waiting};
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
/// Only ever the caller's mail, twice over: the tsquery ANDs one of the
/// caller's own lexemes (`'p <id>'` or its windows, see migrations V13 and
/// V16), so `messages_search_window_idx` yields only its messages, and every
/// row is checked to be sent or received by it.
///
/// The best of the newest [`SEARCH_CANDIDATES`] matches, found in two
/// steps. `recent`: the matches within the id windows (4,096 ids each) that
/// hold the caller's newest [`RECENT_WINDOW`] messages, at most
/// [`RECENT_WINDOWS`] of them: short posting lists, whatever the mailbox's
/// size. When they hold enough matches, the newest overall are among them
/// (the windows hold every one of the caller's messages from the oldest
/// window's start on). Otherwise the whole mailbox is asked (`matched`'s
/// second part, not run at all in the first case); its matches are then
/// few. Without the first step a word in a fifth of a 100k mailbox fetched
/// all its 27k matches from the table (137 ms at p99 in `make bench`).
///
/// Ranking reads each candidate's text again (the index is on an
/// expression), so only the candidates are ranked. The matches are CTEs of
/// their own without an order, so no plan can look for them by walking the
/// primary key backwards and parsing every body.
static SEARCH: LazyLock<String> = LazyLock::new(|| {
    let filters = "(m.sender_id = me.id OR m.recipient_id = me.id) IS TRUE
                    AND ($4::text IS NULL OR EXISTS (
                            SELECT 1 FROM agents o
                            WHERE o.name = $4::text AND o.id IN (m.sender_id, m.recipient_id)
                              AND o.id <> me.id))
                    AND ($5::bigint IS NULL OR m.thread_id = $5::bigint)
                    AND ($6::timestamptz IS NULL OR m.sent_at >= $6::timestamptz)";
    format!(
        "WITH me AS (SELECT id, name, last_seen_at FROM agents WHERE {caller}),
              touched AS ({touch}),
              newest AS (
                  SELECT id FROM (
                      (SELECT m.id FROM messages m
                       WHERE m.recipient_id = (SELECT id FROM me)
                       ORDER BY m.recipient_id DESC, m.id DESC LIMIT {RECENT_WINDOW})
                      UNION ALL
                      (SELECT m.id FROM messages m
                       WHERE m.sender_id = (SELECT id FROM me)
                       ORDER BY m.sender_id DESC, m.id DESC LIMIT {RECENT_WINDOW})) n
                  ORDER BY id DESC LIMIT {RECENT_WINDOW}),
              q AS (SELECT plainto_tsquery('english', $3) AS words,
                           plainto_tsquery('english', $3) && ('''p ' || me.id || '''')::tsquery AS mine,
                           plainto_tsquery('english', $3) && (
                               SELECT string_agg(format('''p %s %s''', me.id, w), ' | ')::tsquery
                               FROM (SELECT max(id) >> 12 AS last, min(id) >> 12 AS first FROM newest) s,
                                    generate_series(greatest(s.first, s.last - {windows_before}), s.last) w
                           ) AS recent
                    FROM me),
              -- `IS TRUE` in the filters keeps the planner from ANDing the
              -- sender and inbox indexes (a whole mailbox) into the GIN scan.
              recent AS MATERIALIZED (
                  SELECT m.id FROM messages m, me
                  WHERE {MESSAGE_SEARCH} @@ (SELECT recent FROM q)
                    AND (SELECT numnode(words) > 0 FROM q)
                    AND {filters}),
              matched AS MATERIALIZED (
                  SELECT id FROM recent
                  WHERE (SELECT count(*) FROM recent) >= {SEARCH_CANDIDATES}
                  UNION ALL
                  SELECT m.id FROM messages m, me
                  WHERE (SELECT count(*) FROM recent) < {SEARCH_CANDIDATES}
                    AND {MESSAGE_SEARCH} @@ (SELECT mine FROM q)
                    AND (SELECT numnode(words) > 0 FROM q)
                    AND {filters}),
              ranked AS MATERIALIZED (
                  SELECT m.*, ts_rank({MESSAGE_SEARCH}, q.words) AS rank
                  FROM messages m, q
                  WHERE m.id = ANY (ARRAY(
                      SELECT id FROM matched ORDER BY id DESC LIMIT {SEARCH_CANDIDATES}))
                  ORDER BY rank DESC, m.id DESC
                  LIMIT $7 OFFSET $8),
              waiting AS ({waiting})
         SELECT me.id AS me_id, {columns}, waiting.n AS waiting
         FROM me CROSS JOIN waiting
         LEFT JOIN ranked m ON true
         {SENDER_LOOKUP}
         LEFT JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.rank DESC, m.id DESC",
        caller = caller_by_token("$1", "$2"),
        touch = presence_write("SELECT id, last_seen_at FROM me"),
        columns = message_columns_seen_by("r.name", "me.id"),
        waiting = count_waiting("$9"),
        windows_before = RECENT_WINDOWS - 1,
    )
});

/// The caller's newest messages whose id windows a search asks first.
const RECENT_WINDOW: i64 = 4_000;
/// At most this many id windows (4,096 ids each) in that first step: an
/// agent whose newest messages span more (a small share of all the mail)
/// has its newest windows asked, a few short lists still.
const RECENT_WINDOWS: i64 = 32;

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
