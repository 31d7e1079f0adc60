-- Webhooks that a receiver cannot turn into work for the database or for a
-- third party (docs/SECURITY.md, "Webhooks").
--
-- The destination of an agent's webhook as `host:port` (lowercase), so that
-- the attempts against one destination can be counted whichever agent
-- points at it.
ALTER TABLE agents ADD COLUMN webhook_host text;
UPDATE agents
SET webhook_host = lower(substring(webhook_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]+)'))
    || CASE WHEN substring(webhook_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://(?:\[[^]]*\]|[^/?#:]*)(:[0-9]+)') IS NULL
            THEN CASE WHEN webhook_url ILIKE 'http:%' THEN ':80' ELSE ':443' END
            ELSE '' END
WHERE webhook_url IS NOT NULL;
CREATE INDEX agents_webhook_host_idx ON agents (webhook_host) WHERE webhook_host IS NOT NULL;

-- A destination that failed (no answer in time, no connection, an error
-- status): its next attempt waits until `retry_at`, a pause that doubles
-- with each failure (at most an hour), and then it gets one attempt at a
-- time until one succeeds, which deletes the row. After failing for a day
-- the webhooks pointing at it are switched off.
CREATE TABLE webhook_hosts (
    host            text PRIMARY KEY,
    failures        integer NOT NULL,
    first_failed_at timestamptz NOT NULL,
    retry_at        timestamptz NOT NULL
);

-- `claimed_until`: an attempt is under way until then (the in-flight
-- deliveries of an agent, counted by every replica's claims). `summary`: a
-- "mail waits" delivery that stands for the messages beyond an agent's
-- capped backlog (at most one pending per agent).
ALTER TABLE webhook_deliveries
    ADD COLUMN claimed_until timestamptz,
    ADD COLUMN summary boolean NOT NULL DEFAULT false;
CREATE INDEX webhook_deliveries_agent_idx ON webhook_deliveries (agent_id) WHERE state = 'pending';
CREATE UNIQUE INDEX webhook_deliveries_summary_idx ON webhook_deliveries (agent_id)
    WHERE summary AND state = 'pending';
