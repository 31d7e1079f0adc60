-- Search of one's own mail, newest matches first without reading all of
-- them (store::mail_search). A word in a fifth of a 100k mailbox made the
-- GIN index hand out 27k matches, every one fetched from the table, to
-- rank the newest few: 137 ms at p99 (bench/RESULTS.md, teams phase).
--
-- Besides each party ('p <agent id>'), a message now carries its parties
-- by id window: 'p <agent id> <id / 4096>', a posting list of at most 4,096
-- of one agent's messages. A search asks its words in the caller's newest
-- 1, 2, 4 and 8 windows (short lists), and the whole mailbox only when
-- fewer than 100 match there. Same results, in a few milliseconds.
--
-- The expression is `store::fragments::MESSAGE_SEARCH`, character for
-- character. On a large table build it CONCURRENTLY beforehand under this
-- name (docs/DEPLOY.md); otherwise writes to messages wait while it is
-- built here.

-- A build of that name that failed or was cancelled leaves an INVALID
-- index, which no query uses: build it again rather than take it for done
-- (and then drop the one search still uses).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('messages_search_window_idx')
                 AND NOT indisvalid) THEN
        DROP INDEX messages_search_window_idx;
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS messages_search_window_idx ON messages USING gin ((
    setweight(to_tsvector('english'::regconfig, coalesce(subject, '')), 'A') ||
    setweight(to_tsvector('english'::regconfig, body), 'B') ||
    array_to_tsvector(ARRAY['p ' || sender_id, 'p ' || recipient_id,
                            'p ' || sender_id || ' ' || (id >> 12),
                            'p ' || recipient_id || ' ' || (id >> 12)])))
    WITH (gin_pending_list_limit = 64);
-- New entries wait in a pending list that every search reads whole, up to
-- 4 MB by default: with 8,000 rows in it, searches of 3 ms took 21-30 ms
-- (a search asks the index up to five times). At 64 kB it holds a few
-- hundred rows, and single-row inserts ran as fast (pgbench, 8 clients:
-- 7,369 and 7,709 tps against 5,390 and 6,726 at 4 MB; fastupdate off was
-- slower, 6,442 and 6,606). Also for an index built beforehand.
ALTER INDEX messages_search_window_idx SET (gin_pending_list_limit = 64);
DROP INDEX IF EXISTS messages_search_idx;
