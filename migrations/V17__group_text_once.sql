-- A group send's text is indexed once, on its first copy, not once per
-- recipient. Twenty copies of one text each parsed the body and added its
-- words to the search index: of the raw insert of a group send to 20,
-- PostgreSQL spent 5.4-5.8x a single row's time with that index and
-- 4.0-4.2x without (bench/RESULTS.md). The first copy of a group (`id =
-- group_id`) now lists every copy's recipient; the index holds its words
-- and a party lexeme for its sender and each listed recipient, and holds
-- nothing of the other copies. Search maps a match on a first copy to the
-- caller's own copy (`store::mail_search`). NULL on every other row.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS group_recipients bigint[];

-- A recipient's party lexemes, 'p <id>' and 'p <id> <id window>' (V16),
-- for each recipient listed on a group's first copy. A function of its
-- arguments only (the index needs IMMUTABLE; `array_to_string` is not).
CREATE OR REPLACE FUNCTION message_group_parties(recipients bigint[], id bigint)
RETURNS text[] LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT array_agg(lexeme)
    FROM unnest(recipients) AS r(recipient),
         LATERAL (VALUES ('p ' || r.recipient), ('p ' || r.recipient || ' ' || (id >> 12))) AS l(lexeme)
$$;

-- Before this migration every copy was indexed, and a group whose first
-- copy was never stored (a send that raced another using its idempotency
-- key for another text) was found through its other copies: such a group
-- is named after its lowest stored copy instead, as `domain::send` now
-- names it.
UPDATE messages m SET group_id = p.first
FROM (SELECT c.group_id, min(c.id) AS first
      FROM messages c
      WHERE c.group_id IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.id = c.group_id)
      GROUP BY c.group_id) p
WHERE m.group_id = p.group_id;

-- Each group's first copy lists its recipients.
UPDATE messages l SET group_recipients = g.recipients
FROM (SELECT group_id, array_agg(recipient_id ORDER BY id) AS recipients
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
