-- Mail for teams: several recipients in one send, search of one's own mail,
-- mail that expires, and retention (README, "Send"; docs/ANALYTICS.md).

-- A send past its `expires_at` is no longer delivered (polls, leases,
-- webhooks and wake-ups skip it: `fragments::available_to`); it stays in the
-- table, `expired` to its sender and in its recipient's history. NULL: it
-- never expires (every message before this migration).
ALTER TABLE messages ADD COLUMN expires_at timestamptz;

-- The copies of one send to several recipients share `group_id`, the id of
-- the first copy stored (NULL for a send to one): "reply all" finds the
-- other recipients through it, within the thread (messages_thread_cover_idx).
ALTER TABLE messages ADD COLUMN group_id bigint;

-- Search of one's own mail: subject and body (English stemming), plus one
-- lexeme per party ('p <agent id>', with a space, which no text parses
-- into), so that the GIN index itself keeps a query to the caller's mail:
-- the caller's lexeme is ANDed to every query, and the index intersects
-- the posting lists instead of ranking everyone's matches. An index on the
-- expression rather than a stored column: a stored tsvector widened every
-- row, and with wider rows the generic plans of polls walked the primary
-- key through another inbox's backlog instead of the unread index (test
-- one_inbox_with_a_huge_backlog_leaves_the_others_on_their_indexes). The
-- expression is `store::fragments::MESSAGE_SEARCH`, character for
-- character (a query uses the index only when it names the same one).
CREATE INDEX IF NOT EXISTS messages_search_idx ON messages USING gin ((
    setweight(to_tsvector('english'::regconfig, coalesce(subject, '')), 'A') ||
    setweight(to_tsvector('english'::regconfig, body), 'B') ||
    array_to_tsvector(ARRAY['p ' || sender_id, 'p ' || recipient_id])));

-- Retention (PHONE_RETENTION_DAYS) deletes old messages; a reply to one
-- keeps its thread and loses only its `reply_to`. The index finds the
-- replies of a deleted message without reading the table (only replies
-- have an entry).
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_reply_to_fkey;
ALTER TABLE messages ADD CONSTRAINT messages_reply_to_fkey
    FOREIGN KEY (reply_to) REFERENCES messages (id) ON DELETE SET NULL;
CREATE INDEX IF NOT EXISTS messages_reply_to_idx ON messages (reply_to) WHERE reply_to IS NOT NULL;

-- Analysts see lifetimes and group sends (new last columns; grants are kept).
CREATE OR REPLACE VIEW analytics.messages AS
SELECT m.id,
       'msg_' || m.id                          AS message,
       m.sent_at,
       (m.sent_at AT TIME ZONE 'UTC')::date    AS day,
       s.name                                  AS sender,
       s.project                               AS sender_project,
       r.name                                  AS recipient,
       r.project                               AS recipient_project,
       m.reply_to,
       m.thread_id,
       m.reply_to IS NOT NULL                  AS is_reply,
       m.read_at,
       m.read_at - m.sent_at                   AS time_to_read,
       m.acked_at,
       m.delivery_count,
       octet_length(m.body)                    AS body_bytes,
       m.dead_at,
       m.dead_reason,
       m.expires_at,
       m.group_id
FROM messages m
JOIN agents s ON s.id = m.sender_id
JOIN agents r ON r.id = m.recipient_id;
