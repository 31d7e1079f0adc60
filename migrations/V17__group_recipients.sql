-- A group send's text is indexed once, on its first copy (migration V18,
-- which says why). This one adds what that index reads, in a migration of
-- its own: ALTER TABLE locks out readers too, until its transaction
-- commits, so it commits before V18's passes over the table and its index
-- build, which let polls and searches through.
--
-- The first copy of a group (`id = group_id`) lists every copy's
-- recipient; NULL on every other row.
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

