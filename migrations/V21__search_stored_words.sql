-- The search index reads a message's words from `words` (V20), parsed once
-- at the send, instead of parsing subject and body itself. The index's
-- expression is computed for every new version of a row, and marking a
-- message read writes one (the unread indexes depend on `read_at`, so the
-- update is never HOT): every read of a message to one parsed its body
-- again, ~20 us for a short one, ~1 ms for a 5 kB report. Ranking reads the
-- stored words too, instead of parsing each candidate's opening.
--
-- Rows without stored words (mail from before V20, or stored by a replica
-- of an older build during the rollout) are parsed as before: the
-- expression falls back to the text.

-- As in V16 and V18: a concurrent build of this name that failed is built
-- again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('messages_search_words_idx')
                 AND NOT indisvalid) THEN
        DROP INDEX messages_search_words_idx;
    END IF;
END
$$;

-- The expression is `store::fragments::MESSAGE_SEARCH` and the predicate
-- `store::fragments::SEARCHED_ROWS`. On a large table build it
-- CONCURRENTLY beforehand (docs/DEPLOY.md).
CREATE INDEX IF NOT EXISTS messages_search_words_idx ON messages USING gin ((
    coalesce(words,
             setweight(to_tsvector('english'::regconfig, coalesce(subject, '')), 'A') ||
             setweight(to_tsvector('english'::regconfig, body), 'B')) ||
    array_to_tsvector(ARRAY['p ' || sender_id, 'p ' || sender_id || ' ' || (id >> 12)] ||
        CASE WHEN group_recipients IS NULL
             THEN ARRAY['p ' || recipient_id, 'p ' || recipient_id || ' ' || (id >> 12)]
             ELSE message_group_parties(group_recipients, id) END)))
    WITH (gin_pending_list_limit = 64)
    WHERE group_id IS NULL OR group_id = id;
ALTER INDEX messages_search_words_idx SET (gin_pending_list_limit = 64);
DROP INDEX IF EXISTS messages_search_text_idx;
