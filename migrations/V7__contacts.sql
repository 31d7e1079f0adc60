-- Contact policies, blocks, quotas and an operator's controls.
--
-- contact_policy: who may start a conversation with the agent: open (anyone),
-- project (agents of its project, and its contacts), contacts (its contacts
-- only), closed (no one). Whatever the policy, an agent may answer a message
-- the recipient sent it, unless the recipient blocked it.
ALTER TABLE agents
    ADD COLUMN contact_policy text NOT NULL DEFAULT 'open'
        CHECK (contact_policy IN ('open', 'project', 'contacts', 'closed')),
    -- false: not shown by phone_search (still reachable by its exact name).
    ADD COLUMN listed boolean NOT NULL DEFAULT true,
    -- Set by an operator (`phone admin suspend`): its token stops working,
    -- it leaves the directory, mail to it is refused; its history stays.
    ADD COLUMN suspended_at timestamptz;

-- What one agent decided about another: a contact (may write under the
-- project and contacts policies) and/or blocked (may never write; a block
-- wins over everything). A row with neither is deleted.
CREATE TABLE contacts (
    agent_id   bigint NOT NULL REFERENCES agents (id),
    other_id   bigint NOT NULL REFERENCES agents (id),
    is_contact boolean NOT NULL DEFAULT false,
    is_blocked boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (agent_id, other_id)
);

-- Every pair that has corresponded, first message first: what makes a
-- recipient "new" for the quota on first messages.
CREATE TABLE correspondents (
    sender_id    bigint NOT NULL,
    recipient_id bigint NOT NULL,
    first_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sender_id, recipient_id)
);
CREATE INDEX correspondents_recent_idx ON correspondents (sender_id, first_at);
-- Existing history counts: nobody's old correspondents are new to them.
INSERT INTO correspondents (sender_id, recipient_id, first_at)
SELECT sender_id, recipient_id, min(sent_at) FROM messages GROUP BY sender_id, recipient_id
ON CONFLICT DO NOTHING;

-- Sends per sender in the current hour, shared by every replica.
-- Unlogged: after a crash the counters start again at zero.
CREATE UNLOGGED TABLE send_counts (
    sender_id  bigint PRIMARY KEY,
    hour_start timestamptz NOT NULL,
    sends      integer NOT NULL
);

-- Sends the policies or quotas refused, for `phone admin refused`. Kept a
-- week (pruned as new ones come).
CREATE TABLE refused_sends (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sender_id    bigint NOT NULL,
    recipient_id bigint,
    reason       text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX refused_sends_at_idx ON refused_sends (at);
