//! Search of one's own mail: full text over subject and body of what the
//! caller sent or received, ranked, with filters and paging.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use super::fragments::{
    MESSAGE_SEARCH, MESSAGE_WORDS, SEARCHED_ROWS, SENDER_LOOKUP, caller_by_token,
    message_columns_searched_by, presence_write,
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
/// Only ever the caller's mail, three times over: the tsquery ANDs one of
/// the caller's own lexemes (`'p <id>'` or its windows, see migrations V13,
/// V16, V18 and V21), so `messages_search_words_idx` yields only its messages;
/// every match is checked to be sent or received by it; and the row shown
/// is the caller's own copy (see [`SHOWN`]).
///
/// A group send is one match: the index holds only its first copy, which
/// lists every recipient (V18). Its sender sees that copy, with the other
/// recipients in `also_to`; a recipient sees its own copy, with its own
/// read state.
///
/// The best of the newest [`SEARCH_CANDIDATES`] matches. They are asked
/// for in the caller's newest id windows (4,096 ids each), 1, then 2, 4, …
/// up to [`WINDOWS_MAX`], each step only when the ones before found too few
/// together, then in the whole mailbox. Each step asks only the windows the
/// one before did not (the 2nd, then the 3rd and 4th, …): the steps so far
/// hold every one of the caller's messages from the oldest window's start
/// on, so once they have enough matches the newest of all are among them,
/// and no window is walked twice (a rare word, which asks every step, paid
/// 15 windows for 8 when each step asked all of its own). A window's posting list holds
/// one agent's messages only: a step costs what the caller's mail in its
/// windows holds (the index walks those lists and probes the words' for
/// each entry), whatever the size of the mailbox, and doubling keeps all
/// the steps within twice the last. The whole mailbox is asked only for
/// words whose matches are few, and a GIN index intersects those cheaply.
/// Asked at once, a word in a fifth of a 100k mailbox fetched all its 27k
/// matches from the table (137 ms at p99 in `make bench`).
///
/// Only the candidates are ranked, each by the words its send stored
/// ([`MESSAGE_WORDS`]; mail from before migration V20 and very large
/// stored words: its subject and opening, parsed). The matches are CTEs of
/// their own without an order, so no plan can look for them by walking the
/// primary key backwards and parsing every body.
static SEARCH: LazyLock<String> = LazyLock::new(|| {
    let filters = format!(
        "(SELECT numnode(words) > 0 FROM q)
                    -- `IS TRUE` keeps the planner from ANDing the sender and
                    -- inbox indexes (a whole mailbox) into the GIN scan.
                    AND {SEARCHED_ROWS}
                    AND (m.sender_id = me.id OR m.recipient_id = me.id
                         OR me.id = ANY (m.group_recipients)) IS TRUE
                    -- The other party: to its sender, a recipient; to a
                    -- recipient, the sender.
                    AND ($4::text IS NULL OR EXISTS (
                            SELECT 1 FROM agents o
                            WHERE o.name = $4::text AND o.id <> me.id
                              AND CASE WHEN m.sender_id = me.id
                                       THEN o.id = m.recipient_id OR o.id = ANY (m.group_recipients)
                                       ELSE o.id = m.sender_id END))
                    AND ($5::bigint IS NULL OR m.thread_id = $5::bigint)
                    AND ($6::timestamptz IS NULL OR m.sent_at >= $6::timestamptz)"
    );
    let enough = SEARCH_CANDIDATES;
    let widths: Vec<i64> = std::iter::successors(Some(1), |w| Some(w * 2))
        .take_while(|w| *w <= WINDOWS_MAX)
        .collect();
    // Step k runs while the steps before it found too few together, and
    // (after the first) while the words are not rare enough to ask the
    // whole mailbox at once.
    let too_few_before = |k: usize| match k {
        0 => "true".to_owned(),
        k => format!(
            "(SELECT n FROM found{}) < {enough} AND NOT (SELECT yes FROM rare)",
            k - 1
        ),
    };
    let mut steps = String::new();
    let mut picked = Vec::new();
    let last_step = widths.len() - 1;
    for (k, width) in widths.iter().enumerate() {
        // The windows new to this step: its newest `width` less the
        // previous step's (half as many), so that no window is walked twice.
        let (oldest, newest) = (width - 1, width / 2);
        let earlier = match k {
            0 => String::new(),
            k => format!(" + (SELECT n FROM found{})", k - 1),
        };
        steps.push_str(&format!(
            "step{k} AS MATERIALIZED (
                 SELECT m.id FROM messages m, me
                 WHERE {gate}
                   AND {MESSAGE_SEARCH} @@ (
                       SELECT q.wanted && string_agg(format('''p %s %s''', me.id, w), ' | ')::tsquery
                       FROM q, me, last, generate_series(last.window - {oldest}, last.window - {newest}) w
                       GROUP BY q.wanted)
                   AND {filters}),
             found{k} AS ({FOUND}{earlier} AS n FROM step{k}),\n",
            gate = too_few_before(k),
        ));
        if k == 0 {
            steps.push_str(&RARE);
        }
        picked.push(format!(
            "SELECT id FROM step{k} WHERE (SELECT n FROM found{last_step}) >= {enough}"
        ));
    }
    format!(
        "WITH me AS (SELECT id, name, last_seen_at FROM agents WHERE {caller}),
              touched AS ({touch}),
              -- The id window of the caller's newest message: a probe of
              -- each of its indexes.
              last AS (
                  SELECT greatest(
                      (SELECT max(m.id) FROM messages m WHERE m.recipient_id = me.id),
                      (SELECT max(m.id) FROM messages m WHERE m.sender_id = me.id)) >> 12 AS window
                  FROM me),
              -- The words, and what the index is asked: the words and, with
              -- `with:`, the other party's lexeme (any agent that held the
              -- name), so that the index keeps the mail between the two
              -- (the per-row check remains).
              q0 AS (SELECT plainto_tsquery('english', $3) AS words,
                            CASE WHEN $4::text IS NULL THEN plainto_tsquery('english', $3)
                                 ELSE plainto_tsquery('english', $3) && (
                                     SELECT string_agg(format('''p %s''', o.id), ' | ')::tsquery
                                     FROM agents o WHERE o.name = $4::text AND o.id <> me.id)
                            END AS wanted
                     FROM me),
              q AS (SELECT words, wanted,
                           wanted && ('''p ' || me.id || '''')::tsquery AS mine
                    FROM q0, me),
              {steps}
              matched AS MATERIALIZED (
                  {picked}
                  UNION ALL
                  SELECT m.id FROM messages m, me
                  WHERE (SELECT n FROM found{last_step}) < {enough}
                    AND {MESSAGE_SEARCH} @@ (SELECT mine FROM q) AND {filters}),
              -- Each candidate ranked by its text and shown as the
              -- caller's copy, once: as a subquery, the page's filter on
              -- `shown` was pushed into the join and every look-up ran
              -- (and was costed) twice.
              candidates AS MATERIALIZED (
                  SELECT {SHOWN} AS shown, ts_rank({MESSAGE_WORDS}, q.words) AS rank
                  FROM messages m, q, me
                  WHERE m.id = ANY (ARRAY(
                      SELECT id FROM matched ORDER BY 1 DESC LIMIT {SEARCH_CANDIDATES}))),
              page AS MATERIALIZED (
                  SELECT shown, rank FROM candidates
                  WHERE shown IS NOT NULL
                  ORDER BY rank DESC, shown DESC
                  LIMIT $7 OFFSET $8),
              ranked AS MATERIALIZED (
                  SELECT m.*, p.rank FROM messages m JOIN page p ON p.shown = m.id
                  -- Ids as an array: a probe each (as a join alone, a plan
                  -- made on an empty table walked the primary key).
                  WHERE m.id = ANY (ARRAY(SELECT shown FROM page))),
              waiting AS ({waiting})
         SELECT me.id AS me_id, {columns}, waiting.n AS waiting
         FROM me CROSS JOIN waiting
         LEFT JOIN ranked m ON true
         {SENDER_LOOKUP}
         LEFT JOIN agents r ON r.id = m.recipient_id
         ORDER BY m.rank DESC, m.id DESC",
        caller = caller_by_token("$1", "$2"),
        touch = presence_write("SELECT id, last_seen_at FROM me"),
        picked = picked.join("\n                  UNION ALL\n                  "),
        columns = message_columns_searched_by("r.name", "me.id"),
        waiting = count_waiting("$9"),
    )
});

/// `rare`: whether the first step found too few and one of the words has
/// so few entries in the whole index ([`RARE_ENTRIES`], from the
/// statistics ANALYZE keeps of the index: a word it does not list is
/// rarer than any it lists) that the whole mailbox costs less than the
/// further steps. Each step's index scan costs what the rarest word's
/// entries cost to check against the others, whatever its windows: a
/// reference with a common word, ~1 ms a step on the bench's 1.5M
/// messages, so four steps that find nothing before the whole mailbox
/// were most of such a search. Read only when the first step found too
/// few: the CTE's first clause, which keeps a common word's search (the
/// steps' gates may evaluate `rare` first) from reading the statistics.
/// Without statistics (a table never analysed, an index built since the
/// last ANALYZE), or when this role may not see them (`pg_stats` shows an
/// index's to its owner only), not rare: the steps run, as before.
static RARE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "rare AS (
             SELECT (SELECT n FROM found0) < {SEARCH_CANDIDATES} AND coalesce((
                 SELECT bool_or(coalesce(s.freqs[array_position(s.elems, l.lexeme)], s.least)
                                * s.entries <= {RARE_ENTRIES})
                 FROM (SELECT x.most_common_elems::text::text[] AS elems,
                              x.most_common_elem_freqs AS freqs,
                              -- After the elements' frequencies: the least, then the most.
                              x.most_common_elem_freqs[array_length(x.most_common_elems, 1) + 1] AS least,
                              c.reltuples AS entries
                       FROM pg_class c
                       JOIN pg_namespace n ON n.oid = c.relnamespace
                       JOIN pg_stats x ON x.schemaname = n.nspname AND x.tablename = c.relname
                       WHERE c.oid = to_regclass('messages_search_words_idx')
                         AND x.most_common_elems IS NOT NULL) s
                 CROSS JOIN unnest(tsvector_to_array(to_tsvector('english', $3::text))) AS l(lexeme)
                 WHERE s.entries > 0), false) AS yes),\n"
    )
});

/// Index entries a word may have at most, by the statistics, to be asked
/// of the whole mailbox after the first step (see [`RARE`]): the whole
/// mailbox then checks about this many entries and reads at most as many
/// rows. Statistics lag: a word that became common in one mailbox since
/// the last ANALYZE is fetched whole there. A word the statistics do not
/// list counts as often as the least they list: on a large table of
/// varied text that may be more than this, and such a word then takes
/// the steps, as before.
const RARE_ENTRIES: i64 = 2_000;

/// The caller's own copy of a match, by id. Mail to one: the match. A
/// group send the caller made: its first copy (the match), or with
/// `with:` the copy to that agent (`messages_group_idx`). A group send to
/// the caller among others: the caller's copy in that group, NULL when it
/// has none (a recipient listed on the first copy whose own copy was never
/// stored: its idempotency key was another send's).
///
/// Each look-up is a set whose least id is taken, not the first in id
/// order: a plan made on an empty table walked the primary key for that.
const SHOWN: &str = "CASE WHEN m.group_id IS NULL THEN m.id
                          WHEN m.sender_id = me.id THEN coalesce((
                              SELECT min(c.id) FROM (
                                  SELECT c.id FROM messages c
                                  WHERE $4::text IS NOT NULL AND c.group_id = m.group_id
                                    AND c.recipient_id IN (SELECT o.id FROM agents o WHERE o.name = $4::text)
                                  OFFSET 0) c), m.id)
                          WHEN m.recipient_id = me.id THEN m.id
                          ELSE (SELECT min(c.id) FROM (
                                    SELECT c.id FROM messages c
                                    WHERE c.group_id = m.group_id AND c.recipient_id = me.id
                                    OFFSET 0) c) END";

/// A step's matches (`n`): one per message, a group send's first copy
/// standing for all of its copies.
const FOUND: &str = "SELECT count(*)";

/// The most id windows (4,096 ids each) a search asks before the whole
/// mailbox: 1, 2, 4, then 8 (32,768 ids). Further doubling cost a rare word
/// more than the whole mailbox does (its posting list is short; a step's
/// cost grows with its windows): on the bench's 100k mailbox, a mix of
/// common words 3.5-4.0 ms per search against 5.7 ms with one step of 8
/// after the first, and references 2.9 ms against 7.5 ms when doubling up
/// to 64. An agent with a small share of the mail has a small mailbox,
/// which the last step asks cheaply.
const WINDOWS_MAX: i64 = 8;

/// Matches ranked per search, newest first: a search finds the best of
/// one's newest 100 matches. Ranking reads each one's words, and each step
/// of the search must find this many before the next is spared.
pub const SEARCH_CANDIDATES: i64 = 100;

/// The search runs on its generic plan, in a transaction of its own.
/// PostgreSQL otherwise compares it with the plans it makes for the first
/// five calls, whose costs know the values: the generic plan looked dearer,
/// and every search was planned again (~3 ms of the database's time each,
/// as much as running it; seen in the teams phase of `make bench`, where
/// the statement counted as many plans as calls). Three more round trips
/// on the same connection cost a fraction of that. Except with `thread:`,
/// whose custom plans walk the thread's index: the generic plan checks it
/// per row, tens of milliseconds for a word common in a large mailbox.
/// (Reading the parameters through sub-selects, which no plan folds, did
/// not stop the re-planning.)
const GENERIC_PLAN: &str = "SET LOCAL plan_cache_mode = force_generic_plan";

/// `None` in `me_id` when the credentials are not accepted.
pub async fn search(
    db: &Client,
    token_hash: &[u8],
    claimed: Option<&str>,
    query: &MailQuery<'_>,
    cap: i64,
) -> Result<Polled, StoreError> {
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
        &token_hash,
        &claimed,
        &query.words,
        &query.with,
        &query.thread_id,
        &query.since,
        &query.limit,
        &query.offset,
        &cap,
    ];
    let rows = if query.thread_id.is_some() {
        let stmt = db.prepare_cached(&SEARCH).await?;
        db.query(&stmt, &params).await?
    } else {
        // Its only write is the caller's presence: a read, which goes on
        // while the sync-standby guard refuses changes.
        db.read_transaction(async |db| {
            let generic = db.prepare_cached(GENERIC_PLAN).await?;
            db.execute(&generic, &[]).await?;
            let stmt = db.prepare_cached(&SEARCH).await?;
            db.query(&stmt, &params).await
        })
        .await?
    };
    let mut found = Polled::default();
    for row in &rows {
        found.add_row(row);
    }
    Ok(found)
}
