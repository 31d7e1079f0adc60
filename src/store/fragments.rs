//! The SQL pieces that several statements share, each written once, here.
//! Every fragment names what it needs from the statement around it (the
//! table aliases it reads, the expressions it is given): its contract.
//! Statements compose them with `format!` once per process, never with
//! values: every value is a bound parameter.

/// An agent's presence (`last_seen_at`) is written at most this often, so a
/// busy agent costs no write per call.
pub const PRESENCE_INTERVAL_SECS: u32 = 60;

/// The registered, not suspended agent holding a token: a condition on
/// `agents` (its columns unqualified). `token` is an SQL expression for the SHA-256 digest
/// (bytea), `claimed` one for the name the caller claimed (text, NULL for
/// none): a claimed name must be the token's agent. Served by the unique
/// index on `token_hash`.
pub fn caller_by_token(token: &str, claimed: &str) -> String {
    format!(
        "token_hash = {token} AND unregistered_at IS NULL AND suspended_at IS NULL \
         AND ({claimed}::text IS NULL OR name = {claimed}::text)"
    )
}

/// Presence of a caller is stale: a condition on `agents` columns.
fn presence_stale() -> String {
    format!(
        "(last_seen_at IS NULL OR last_seen_at < now() - interval '{PRESENCE_INTERVAL_SECS} seconds')"
    )
}

/// The presence write, a statement of its own (for a `WITH` clause):
/// `callers` is a query selecting the `id` and `last_seen_at` of verified
/// callers. Only stale callers become keys, so a fresh one costs no index
/// lookup; the staleness test is repeated on the locked row, so concurrent
/// calls of one agent write it once.
pub fn presence_write(callers: &str) -> String {
    let stale = presence_stale();
    format!(
        "UPDATE agents SET last_seen_at = now()
         WHERE id = ANY (ARRAY(SELECT id FROM ({callers}) c WHERE {stale})) AND {stale}"
    )
}

/// Messages an inbox may hand out now (unread, not dead, not leased, not
/// expired): a condition on `messages m`, for the recipient whose id `recipient` (an
/// SQL expression) gives. An equality
/// here, not a key range: the partial unread index (`messages_unread_idx`)
/// is the cheapest path whatever the statistics say (the backlog test
/// checks it), and with a key range the poll at 10M messages of history
/// touched 55-68 pages instead of 41 and took twice as long end to end
/// (`make bench` growth, A/B alternated twice).
pub fn available_to(recipient: &str) -> String {
    format!(
        "m.recipient_id = {recipient} AND m.read_at IS NULL AND m.dead_at IS NULL
         AND (m.leased_until IS NULL OR m.leased_until <= now())
         AND (m.expires_at IS NULL OR m.expires_at > now())"
    )
}

/// A message's words and parties as `messages_search_words_idx` indexes
/// them (migration V21, character for character): a tsvector of `messages
/// m`. Its words are those stored at its send (`words`, [`stored_words`]),
/// or for a row without them (mail from before V20) its text parsed, as
/// before. Each party twice: `'p <id>'`, and `'p <id> <message id >> 12>'`
/// (its mail by id window; `mail_search`). A group send's first copy
/// carries every copy's recipient (`group_recipients`), and only it is
/// indexed ([`SEARCHED_ROWS`]): its text is parsed and indexed once, not
/// once per recipient.
pub const MESSAGE_SEARCH: &str = "(
    coalesce(m.words,
             setweight(to_tsvector('english'::regconfig, coalesce(m.subject, '')), 'A') ||
             setweight(to_tsvector('english'::regconfig, m.body), 'B')) ||
    array_to_tsvector(ARRAY['p ' || m.sender_id, 'p ' || m.sender_id || ' ' || (m.id >> 12)] ||
        CASE WHEN m.group_recipients IS NULL
             THEN ARRAY['p ' || m.recipient_id, 'p ' || m.recipient_id || ' ' || (m.id >> 12)]
             ELSE message_group_parties(m.group_recipients, m.id) END))";

/// The words a send stores in `words` for a row the search index holds
/// (migration V20): its subject (weight A) and whole body (B), parsed once.
/// The index reads them (a poll marking the message read writes a new
/// version of the row, whose index entry would otherwise parse the body
/// again), and so does ranking. `subject` and `body` are SQL expressions.
pub fn stored_words(subject: &str, body: &str) -> String {
    format!(
        "setweight(to_tsvector('english'::regconfig, coalesce({subject}, '')), 'A') ||
             setweight(to_tsvector('english'::regconfig, {body}), 'B')"
    )
}

/// The rows `messages_search_words_idx` holds (its predicate, character
/// for character, so that a query naming it may use the index): mail to
/// one, and the first copy of each group send.
pub const SEARCHED_ROWS: &str = "(m.group_id IS NULL OR m.group_id = m.id)";

/// A message's words as ranking reads them, weighted (subject above body):
/// those stored at its send, subject and whole body, up to
/// [`RANK_WORDS_MAX_BYTES`] as stored. Bigger stored words (a body of many
/// distinct words: 64 KiB of them store ~77 kB, which a sender could put
/// in a hundred messages a search then ranks), and a row without them
/// (mail from before V20), are ranked by the subject and the body's
/// opening, its first [`RANK_OPENING_CHARS`] characters, parsed: parsed
/// whole, a hundred 5 kB reports cost a search 40-50 ms, and 50 kB bodies
/// over half a second of the database's time. `pg_column_size` reads the
/// stored size without reading the words.
pub const MESSAGE_WORDS: &str = "coalesce(
    CASE WHEN pg_column_size(m.words) <= 4096 THEN m.words END,
    setweight(to_tsvector('english'::regconfig, coalesce(m.subject, '')), 'A') ||
    setweight(to_tsvector('english'::regconfig, left(m.body, 300)), 'B'))";

/// The most bytes of stored words ranking reads (in [`MESSAGE_WORDS`]): a
/// 5 kB report's store in ~0.9 kB.
pub const RANK_WORDS_MAX_BYTES: usize = 4096;

/// The characters of a body that ranking reads (in [`MESSAGE_WORDS`]).
pub const RANK_OPENING_CHARS: usize = 300;

/// The order an inbox is read in (`messages m`). The unread counts order by
/// it too, so that no plan counts with a sequential scan (a generic plan
/// did, with statistics dominated by one inbox's backlog).
pub const INBOX_ORDER: &str = "m.recipient_id, m.id";

/// One agent's messages as a key range of an index on `(column, id)` of
/// `messages m`, to be read in `(column, id)` order; `agent` is an SQL
/// expression for the agent's id. Written as `column = agent`, the planner
/// treats the first key as constant, so the primary key alone also delivers
/// that order: a generic plan then walked it through everyone's mail, once
/// one inbox held most of the messages (54 ms per poll instead of 0.9; test
/// `one_inbox_with_a_huge_backlog_leaves_the_others_on_their_indexes`). A
/// row comparison makes no such equivalence: only the `(column, id)`
/// indexes deliver the order. `after` / `before` bound the ids (exclusive,
/// SQL expressions that may be NULL for no bound), for cursors.
pub fn key_range(column: &str, agent: &str, after: &str, before: &str) -> String {
    format!(
        "(m.{column}, m.id) > ({agent}, coalesce({after}, 0))
         AND (m.{column}, m.id) < ({agent}, coalesce({before}, {}))",
        i64::MAX
    )
}

/// The message fields a poll reads from `messages m` (or returns from an
/// `UPDATE messages m`).
pub const POLLED_FIELDS: &str = "m.id, m.sender_id, m.subject, m.body, m.reply_to, m.thread_id,
     m.sent_at, m.read_at, m.delivery_count, m.leased_until, m.dead_at, m.dead_reason, m.expires_at,
     m.group_id";

/// `dead_at` as answers show it: mail whose lifetime ended is expired, not
/// dead (the sweep of migration V30 marks it dead only to take it out of
/// the unread index). Shown as dead, it read as a failed delivery ("never
/// acknowledged", an acknowledged one too), and beside mail a block
/// withdrew (no `dead_at` to its sender) it told the sender who blocked it.
const DEAD_AT: &str = "CASE WHEN m.dead_reason = 'expired' THEN NULL ELSE m.dead_at END";

/// What a listing returns per message, as `rows::message` reads it, from
/// `messages m` (or a relation with [`POLLED_FIELDS`]), the sender `s`
/// (name, project) and the recipient's name as `recipient_name` (an SQL
/// expression).
pub fn message_columns(recipient_name: &str) -> String {
    columns(
        recipient_name,
        &format!("{DEAD_AT} AS dead_at"),
        &also_to("true"),
    )
}

/// [`message_columns`] for the hot poll, without the list of a group
/// send's other recipients: as a sub-plan in the batch statement it cost
/// mail to one 0.88x of the pairs' sends at c=16 (`make bench`, `before`;
/// without it 0.99x), so the caller asks [`super::messages::fill_also_to`]
/// for it, only when a copy of a group send is among what it took.
pub fn polled_message_columns(recipient_name: &str) -> String {
    columns(
        recipient_name,
        &format!("{DEAD_AT} AS dead_at"),
        "NULL::text[] AS also_to",
    )
}

/// [`message_columns`] as the agent whose id `viewer` (an SQL expression)
/// gives sees them: mail its recipient's block withdrew does not show as
/// dead to its sender (a block is not revealed), and only a recipient is
/// told who else a group send went to (its sender sees every copy).
pub fn message_columns_seen_by(recipient_name: &str, viewer: &str) -> String {
    columns(
        recipient_name,
        &dead_at_seen_by(viewer),
        &also_to(&format!("m.recipient_id = {viewer}")),
    )
}

/// Mail its recipient's block withdrew does not show as dead to its sender.
fn dead_at_seen_by(viewer: &str) -> String {
    format!(
        "CASE WHEN m.dead_reason = 'blocked' AND m.sender_id = {viewer} THEN NULL
              ELSE {DEAD_AT} END AS dead_at"
    )
}

/// [`message_columns_seen_by`] for a search, which shows a group send its
/// caller made once (see `mail_search`): its sender is told who else it
/// went to as well (every row a search returns is the caller's own).
pub fn message_columns_searched_by(recipient_name: &str, viewer: &str) -> String {
    columns(recipient_name, &dead_at_seen_by(viewer), &also_to("true"))
}

/// The other recipients of a copy of a group send, oldest copy first
/// (NULL for a send to one, so mail to one pays a test of `group_id`):
/// `messages_group_idx`, each name by primary key.
pub(super) fn also_to(shown_when: &str) -> String {
    format!(
        "CASE WHEN m.group_id IS NOT NULL AND {shown_when} THEN ARRAY(
             SELECT (SELECT a.name FROM agents a WHERE a.id = g.recipient_id)
             FROM messages g
             WHERE g.group_id = m.group_id AND g.id <> m.id
             ORDER BY g.id) END AS also_to"
    )
}

fn columns(recipient_name: &str, dead_at: &str, also_to: &str) -> String {
    format!(
        "m.id, s.name AS sender, s.project AS sender_project, {recipient_name} AS recipient,
     m.subject, m.body, m.reply_to, m.thread_id, m.sent_at, m.read_at, m.delivery_count,
     m.leased_until, {dead_at}, m.expires_at, m.group_id, {also_to}"
    )
}

/// Each message's sender as `s`, by primary key, for a relation `m` with a
/// `sender_id`. OFFSET 0 keeps this a lookup per message: as a plain join,
/// the generic plan at 10M messages of history hashed the whole agents
/// table to name one sender.
pub const SENDER_LOOKUP: &str = "LEFT JOIN LATERAL (
         SELECT a.name, a.project FROM agents a WHERE a.id = m.sender_id OFFSET 0) s ON true";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_presence_interval_is_the_one_constant() {
        let write = presence_write("SELECT id, last_seen_at FROM me");
        assert_eq!(write.matches("interval '60 seconds'").count(), 2);
        assert!(caller_by_token("$1", "$2").contains("name = $2::text"));
    }

    #[test]
    fn the_index_reads_the_words_a_send_stores() {
        let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat(MESSAGE_SEARCH).contains(&flat(&format!(
            "coalesce(m.words, {})",
            stored_words("m.subject", "m.body")
        ))));
    }

    #[test]
    fn ranking_reads_the_opening_it_names() {
        assert!(MESSAGE_WORDS.contains(&format!("left(m.body, {RANK_OPENING_CHARS})")));
        assert!(MESSAGE_WORDS.contains(&format!(
            "pg_column_size(m.words) <= {RANK_WORDS_MAX_BYTES}"
        )));
    }
}
