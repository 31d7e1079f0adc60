-- A send pays only for what its recipient uses (issue 27): the send
-- statement probes `contacts` only for recipients that ever marked an
-- agent (allow or block). An agent's first mark sets the flag in the same
-- statement that writes the row, so no snapshot sees a row without it. It
-- stays set when the rows go (a later mark may bring them back, and
-- clearing it would race with that mark); an agent that once had contacts
-- pays one probe per send it receives, as every agent did before.
--
-- V14, not V13: issue 28 adds V13 (migrations/V13__teams_search_expiry.sql
-- there); this one is independent of it and must be applied after it.
ALTER TABLE agents ADD COLUMN uses_contacts boolean NOT NULL DEFAULT false;
UPDATE agents SET uses_contacts = true WHERE id IN (SELECT agent_id FROM contacts);
