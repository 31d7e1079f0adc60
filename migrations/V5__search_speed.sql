-- Directory search at a million agents (Phone::search, build_search_sql in
-- src/domain/agents.rs).
--
-- A GIN scan enumerates every match of a word before it returns the first
-- row: at 1M agents a word in one description of ten is ~100,000 matches and
-- 20-60 ms in the index alone, however few results are wanted. Search ranks
-- a bounded set of candidates anyway, so it takes them from a fixed sample of
-- the directory when the sample has enough: every 256th agent by id, else
-- every 32nd, else all of them (agents_search_idx, from V1). These partial
-- indexes hold only their sample, so a common word costs 1/256 (or 1/32) of
-- the scan, and a rare word, which falls through to the full index, has few
-- matches. They hold registered agents only, as search wants. The sample
-- rates are constants in the search code (SEARCH_SAMPLES): change both.
--
-- The indexes of names and project names (the weight-A and -B parts of
-- agents.search): the few agents *named* after a word are candidates of their
-- own, so they are not lost among the many that mention it; the project's
-- words let a project filter intersect in the index.
--
-- On a large existing database these builds block writes to agents for a
-- while (about 15 s at 1M agents): build them first with CREATE INDEX
-- CONCURRENTLY (same names and definitions); this migration then finds them.
CREATE INDEX IF NOT EXISTS agents_search_1in256_idx ON agents USING gin (search)
    WHERE id % 256 = 0 AND unregistered_at IS NULL;
CREATE INDEX IF NOT EXISTS agents_search_1in32_idx ON agents USING gin (search)
    WHERE id % 32 = 0 AND unregistered_at IS NULL;
CREATE INDEX IF NOT EXISTS agents_names_idx
    ON agents USING gin (to_tsvector('english', translate(name || ' ' || project, '._-', '   ')))
    WHERE unregistered_at IS NULL;
CREATE INDEX IF NOT EXISTS agents_names_1in256_idx
    ON agents USING gin (to_tsvector('english', translate(name || ' ' || project, '._-', '   ')))
    WHERE id % 256 = 0 AND unregistered_at IS NULL;
CREATE INDEX IF NOT EXISTS agents_names_1in32_idx
    ON agents USING gin (to_tsvector('english', translate(name || ' ' || project, '._-', '   ')))
    WHERE id % 32 = 0 AND unregistered_at IS NULL;
