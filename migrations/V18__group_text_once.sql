-- A group send's text is indexed once, on its first copy, not once per
-- recipient. Twenty copies of one text each parsed the body and added its
-- words to the search index: of the raw insert of a group send to 20,
-- PostgreSQL spent 5.4-5.8x a single row's time with that index and
-- 4.0-4.2x without (bench/RESULTS.md). The first copy of a group (`id =
-- group_id`) lists every copy's recipient (`group_recipients`, V17); the
-- index holds its words and a party lexeme for its sender and each listed
-- recipient, and holds nothing of the other copies. Search maps a match on
-- a first copy to the caller's own copy (`store::mail_search`).

-- Before this migration every copy was indexed, and two kinds of group
-- were found through their other copies. Builds before 5b44ec6 put the
-- copies of a key used again for another text into the first send's
-- group: one group held two texts, and only the first copy's words would
-- be indexed. And a group whose first copy was never stored (a send that
-- raced another using its key for another text) has no first copy. Each
-- text of a group becomes a group of its own, named after its lowest
-- copy, as `domain::send` and `store::messages::heal_groups` now name
-- them (threads are kept).
UPDATE messages m SET group_id = t.first
FROM (SELECT id, min(id) OVER (
                 PARTITION BY group_id, subject IS NULL,
                              md5(coalesce(subject, '') || E'\x1f' || body), reply_to) AS first
      FROM messages WHERE group_id IS NOT NULL) t
WHERE m.id = t.id AND m.group_id <> t.first;

-- Each group's first copy lists its recipients.
UPDATE messages l SET group_recipients = g.recipients
FROM (SELECT group_id, array_agg(DISTINCT recipient_id ORDER BY recipient_id) AS recipients
      FROM messages WHERE group_id IS NOT NULL GROUP BY group_id) g
WHERE l.id = g.group_id AND l.group_recipients IS DISTINCT FROM g.recipients;

-- As in V16: a concurrent build of this name that failed is built again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('messages_search_text_idx')
                 AND NOT indisvalid) THEN
        DROP INDEX messages_search_text_idx;
    END IF;
END
$$;

-- The expression is `store::fragments::MESSAGE_SEARCH` and the predicate
-- `store::fragments::SEARCHED_ROWS`, character for character. On a large
-- table build it CONCURRENTLY beforehand (docs/DEPLOY.md).
CREATE INDEX IF NOT EXISTS messages_search_text_idx ON messages USING gin ((
    setweight(to_tsvector('english'::regconfig, coalesce(subject, '')), 'A') ||
    setweight(to_tsvector('english'::regconfig, body), 'B') ||
    array_to_tsvector(ARRAY['p ' || sender_id, 'p ' || sender_id || ' ' || (id >> 12)] ||
        CASE WHEN group_recipients IS NULL
             THEN ARRAY['p ' || recipient_id, 'p ' || recipient_id || ' ' || (id >> 12)]
             ELSE message_group_parties(group_recipients, id) END)))
    WITH (gin_pending_list_limit = 64)
    WHERE group_id IS NULL OR group_id = id;
ALTER INDEX messages_search_text_idx SET (gin_pending_list_limit = 64);
DROP INDEX IF EXISTS messages_search_window_idx;
