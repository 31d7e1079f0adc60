-- Mail past its lifetime (`expires_in`) stayed unread for ever, and the
-- unread index (`messages_unread_idx`, on `read_at IS NULL` only) kept it:
-- every poll of the inbox, every send to it (the backlog's bound) and the
-- share's count walked past each such row. An outsider's attack: one
-- stranger sent 30,000 one-second messages to an inbox whose agent was away
-- (the share and the inbox cap count live mail only, so nothing stopped
-- it); a poll of that inbox then took 15 ms, at 550,000 rows 230 ms, and
-- each batch holding such a call made everyone else's calls wait. Mail a
-- block withdrew, and mail dead after its deliveries, stayed in it too.
--
-- Now each replica marks mail past its lifetime dead (`dead_reason`
-- 'expired', `dead_at` its expiry; src/store/prune.rs, every few seconds),
-- and the unread index holds live mail only: unread and not dead.
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_dead_reason_check;
ALTER TABLE messages ADD CONSTRAINT messages_dead_reason_check
    CHECK (dead_reason IN ('deliveries', 'blocked', 'expired')) NOT VALID;

-- On a large existing database build these first with CREATE INDEX
-- CONCURRENTLY (same names and definitions, docs/DEPLOY.md); this migration
-- then finds them.
CREATE INDEX IF NOT EXISTS messages_unread_live_idx ON messages (recipient_id, id)
    WHERE read_at IS NULL AND dead_at IS NULL;
DROP INDEX IF EXISTS messages_unread_idx;
ALTER INDEX messages_unread_live_idx RENAME TO messages_unread_idx;

-- Live mail with a lifetime, by its end: what the sweep marks.
CREATE INDEX IF NOT EXISTS messages_expiring_idx ON messages (expires_at)
    WHERE read_at IS NULL AND dead_at IS NULL AND expires_at IS NOT NULL;
