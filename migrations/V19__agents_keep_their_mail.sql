-- Every copy of every send checked its sender and its recipient against
-- `agents` through two foreign keys: a lookup and a row lock (FOR KEY SHARE,
-- which writes the lock into the agent's row, and a MultiXact when two
-- transactions hold it) per key per row. A group send to 20 paid 40 of them,
-- a quarter of its insert (pgbench on the real schema; bench/RESULTS.md).
--
-- Nothing in phone deletes an agent (unregistering keeps the row, so that
-- its mail and the analytics keep their names), and every id a send stores
-- comes from `agents` in the same statement. What the keys still guarded
-- against is an operator's DELETE, renumbering or TRUNCATE of agents that
-- have mail: these triggers refuse that, with the keys' error code.
--
-- A DELETE racing a send: the keys made the send wait for the deleting
-- transaction (its row lock) and then fail. Here the trigger locks
-- `messages` against writes until the deleting transaction ends: a send
-- already running commits first and the check sees its message; a later
-- send waits, then finds its sender or recipient gone. Deleting agents
-- stops all sends while its transaction lasts; it is an operator's repair,
-- not phone's way (unregister, or `phone admin suspend`).
CREATE OR REPLACE FUNCTION agents_keep_their_mail() RETURNS trigger
LANGUAGE plpgsql
-- The schema the migration ran in, whatever the caller's search_path.
SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        -- After a TRUNCATE of agents (CASCADE reaches only tables with keys
        -- to it): refused unless messages was emptied in the same command.
        IF EXISTS (SELECT 1 FROM messages) THEN
            RAISE EXCEPTION 'agents cannot be truncated while messages refer to them'
                USING ERRCODE = 'foreign_key_violation',
                      HINT = 'Truncate messages in the same command, or suspend or unregister agents instead.';
        END IF;
        RETURN NULL;
    END IF;
    LOCK TABLE messages IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM messages WHERE sender_id = OLD.id)
       OR EXISTS (SELECT 1 FROM messages WHERE recipient_id = OLD.id) THEN
        RAISE EXCEPTION 'agent % (%) has mail and cannot be deleted or renumbered', OLD.id, OLD.name
            USING ERRCODE = 'foreign_key_violation',
                  HINT = 'Suspend it (phone admin suspend) or unregister it instead; its mail keeps its name.';
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$$;

DROP TRIGGER IF EXISTS agents_keep_their_mail_on_delete ON agents;
CREATE TRIGGER agents_keep_their_mail_on_delete BEFORE DELETE ON agents
    FOR EACH ROW EXECUTE FUNCTION agents_keep_their_mail();
DROP TRIGGER IF EXISTS agents_keep_their_mail_on_renumber ON agents;
CREATE TRIGGER agents_keep_their_mail_on_renumber BEFORE UPDATE OF id ON agents
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id) EXECUTE FUNCTION agents_keep_their_mail();
DROP TRIGGER IF EXISTS agents_keep_their_mail_on_truncate ON agents;
CREATE TRIGGER agents_keep_their_mail_on_truncate AFTER TRUNCATE ON agents
    FOR EACH STATEMENT EXECUTE FUNCTION agents_keep_their_mail();

ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_sender_id_fkey,
                     DROP CONSTRAINT IF EXISTS messages_recipient_id_fkey;
