-- An idempotency key is stored on a send to one as it is, and on each copy
-- of a send to several with the recipient's name after a unit separator
-- (src/store/batch/send.rs, `copy_key`). The mail statement looks for a
-- copy stored under the key's other form to the same recipient, but a
-- statement cannot see a copy that a try in flight beside it (the same
-- batch, another replica) has not committed: two tries of one send, one to
-- "a" and one to ["a", "b"], both stored a copy for a. This index makes the
-- second wait for the first and store nothing: one copy per sender, key (in
-- either form) and recipient. The mail statement's insert names no
-- conflict target, so that this index and `messages_idempotency_idx` both
-- stop a copy.
--
-- Copies stored twice that way before this version: the later keeps its
-- message and loses its key (a retry of the key finds the earlier copy).
-- Sends wait from here to the end (the build below would make them wait
-- anyway), so that none stores another such copy in between.
LOCK TABLE messages IN SHARE MODE;
UPDATE messages m SET idempotency_key = NULL
FROM (SELECT id FROM (
          SELECT id, row_number() OVER (
                     PARTITION BY sender_id, recipient_id, split_part(idempotency_key, chr(31), 1)
                     ORDER BY id) AS nth
          FROM messages WHERE idempotency_key IS NOT NULL) x
      WHERE nth > 1) twice
WHERE m.id = twice.id;

-- Built CONCURRENTLY beforehand under this name on a large table
-- (docs/DEPLOY.md); a build that failed or was cancelled leaves an INVALID
-- index, which stops nothing: build it again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('messages_idempotency_copy_idx')
                 AND NOT indisvalid) THEN
        DROP INDEX messages_idempotency_copy_idx;
    END IF;
END
$$;

CREATE UNIQUE INDEX IF NOT EXISTS messages_idempotency_copy_idx
    ON messages (sender_id, recipient_id, split_part(idempotency_key, chr(31), 1))
    WHERE idempotency_key IS NOT NULL;
