-- `message_group_parties` (V17), which the search index's expression calls
-- for a group's first copy, becomes PL/pgSQL: the index holds the same
-- lexemes for every list.
--
-- As an SQL function it was a query (`unnest` and `array_agg`) that
-- PostgreSQL cannot inline, so every statement that stored a group send
-- parsed and planned that query again, then ran it in an executor of its
-- own: a group send's insert paid for a small query of its own. PL/pgSQL
-- compiles a function once per connection and evaluates its loop as plain
-- expressions. pgbench on the real schema, one client, a 20-copy insert:
-- 1,333-1,374 against 1,552-1,651 transactions/s (bench/RESULTS.md).
--
-- The index stores what the function returns; that is unchanged (the same
-- lexemes; `array_to_tsvector` sorts them and drops duplicates), so the
-- index stays valid and is not rebuilt. An empty list gave NULL and now
-- gives an empty array: appended to the sender's lexemes, both add nothing.
CREATE OR REPLACE FUNCTION message_group_parties(recipients bigint[], id bigint)
RETURNS text[] LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    parties text[] := '{}';
    recipient bigint;
BEGIN
    FOREACH recipient IN ARRAY recipients LOOP
        parties := parties || ('p ' || recipient) || ('p ' || recipient || ' ' || (id >> 12));
    END LOOP;
    RETURN parties;
END
$$;
