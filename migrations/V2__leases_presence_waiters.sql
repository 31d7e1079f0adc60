-- Unregistering: the row stays (history keeps pointing at it) but the name
-- is unique only among agents still registered, so it can be released.
ALTER TABLE agents ADD COLUMN unregistered_at timestamptz;
ALTER TABLE agents DROP CONSTRAINT agents_name_key;
CREATE UNIQUE INDEX agents_active_name_idx ON agents (name) WHERE unregistered_at IS NULL;
CREATE INDEX agents_name_idx ON agents (name);

-- Leases (at-least-once delivery) and receipts.
ALTER TABLE messages
    ADD COLUMN leased_until   timestamptz,
    ADD COLUMN delivery_count integer NOT NULL DEFAULT 0,
    ADD COLUMN acked_at       timestamptz;

-- Agents waiting in a long poll (phone_inbox wait_seconds). A send notifies
-- only when its recipient has a row here, so sends to agents nobody waits
-- for pay no NOTIFY. Unlogged: losing it in a crash only delays a wake-up
-- until the waiter's own timeout.
CREATE UNLOGGED TABLE inbox_waiters (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id   bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX inbox_waiters_agent_idx ON inbox_waiters (agent_id);
