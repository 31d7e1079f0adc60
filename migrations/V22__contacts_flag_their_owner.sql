-- A send probes `contacts` only for a recipient whose `uses_contacts` flag
-- is set (V14). phone's own mark sets the flag in the statement that writes
-- the row, but a row written any other way left it false: a replica older
-- than V14 during a rolling deploy, an operator's INSERT or a restore. Every
-- send then skipped the probe, and that agent's blocks and allow list were
-- ignored. The database now keeps the flag with the rows, whoever writes
-- them (the flag is never cleared, as in V14).
CREATE OR REPLACE FUNCTION contacts_flag_their_owner() RETURNS trigger
LANGUAGE plpgsql
-- The schema the migration ran in, whatever the caller's search_path.
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE agents SET uses_contacts = true
    WHERE id = NEW.agent_id AND NOT uses_contacts;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS contacts_flag_their_owner ON contacts;
CREATE TRIGGER contacts_flag_their_owner
    AFTER INSERT OR UPDATE ON contacts
    FOR EACH ROW EXECUTE FUNCTION contacts_flag_their_owner();

-- Rows written without the flag since V14.
UPDATE agents SET uses_contacts = true
WHERE NOT uses_contacts AND id IN (SELECT agent_id FROM contacts);
