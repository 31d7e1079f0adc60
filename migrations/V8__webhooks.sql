-- Webhooks: an agent that runs as a service is woken by a signed POST when
-- mail arrives (Standard Webhooks). The secret signs; it is the agent's
-- to verify with, shown once when set or rotated.
ALTER TABLE agents
    ADD COLUMN webhook_url text,
    ADD COLUMN webhook_secret text,
    -- Set when the destination answered 410 Gone: no more deliveries until
    -- the agent sets a URL again.
    ADD COLUMN webhook_disabled_at timestamptz;

-- One delivery per message for a recipient with a webhook, queued in the
-- send's own transaction; claimed by any replica (SKIP LOCKED), retried
-- with backoff for up to 24 h. `next_at` of a claimed delivery is its claim's
-- end: if the replica dies mid-delivery, another takes it over then.
CREATE TABLE webhook_deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    agent_id      bigint NOT NULL,
    message_id    bigint NOT NULL,
    state         text NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'delivered', 'failed', 'gone')),
    attempts      integer NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL DEFAULT now(),
    last_status   integer,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_at) WHERE state = 'pending';
