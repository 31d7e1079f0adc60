-- Search of one's own mail, newest matches first without reading all of
-- them (store::mail_search). A word in a fifth of a 100k mailbox made the
-- GIN index hand out 27k matches, every one fetched from the table, to
-- rank the newest 200: 137 ms at p99 (bench/RESULTS.md, teams phase).
--
-- Besides each party ('p <agent id>'), a message now carries its parties
-- by id window: 'p <agent id> <id / 4096>', a posting list of at most 4,096
-- of one agent's messages. A search first asks for its words within the
-- windows of the caller's newest 4,000 messages (a few short lists); only
-- when fewer than 200 match there does it ask the whole mailbox, where the
-- matches are few by then. Same results, in a few milliseconds.
--
-- The expression is `store::fragments::MESSAGE_SEARCH`, character for
-- character. Build it CONCURRENTLY beforehand under this name on a large
-- table (this migration then finds it); writes to messages wait while it
-- is built here.
CREATE INDEX IF NOT EXISTS messages_search_window_idx ON messages USING gin ((
    setweight(to_tsvector('english'::regconfig, coalesce(subject, '')), 'A') ||
    setweight(to_tsvector('english'::regconfig, body), 'B') ||
    array_to_tsvector(ARRAY['p ' || sender_id, 'p ' || recipient_id,
                            'p ' || sender_id || ' ' || (id >> 12),
                            'p ' || recipient_id || ' ' || (id >> 12)])));
DROP INDEX IF EXISTS messages_search_idx;
