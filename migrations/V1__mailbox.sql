-- The address book and the mailbox. Messages are never deleted: the history
-- is kept whole for analytics (see README, "Analyse the history").

CREATE TABLE agents (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Lowercased ASCII on the way in (AgentName), so UNIQUE is case-insensitive.
    name          text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9._-]{1,64}$'),
    description   text NOT NULL,
    project       text NOT NULL,
    -- SHA-256 of the bearer token; the token itself is never stored.
    token_hash    bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    registered_at timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz,
    -- Names and projects split into words too ("email-bot" -> email, bot).
    search        tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', translate(name, '._-', '   ')), 'A') ||
        setweight(to_tsvector('english', translate(project, '._-', '   ')), 'B') ||
        setweight(to_tsvector('english', description), 'C')
    ) STORED
);

CREATE INDEX agents_search_idx ON agents USING gin (search);
CREATE INDEX agents_project_idx ON agents (lower(project), name);

CREATE SEQUENCE messages_id_seq AS bigint;

CREATE TABLE messages (
    id              bigint PRIMARY KEY DEFAULT nextval('messages_id_seq'),
    sender_id       bigint NOT NULL REFERENCES agents (id),
    recipient_id    bigint NOT NULL REFERENCES agents (id),
    subject         text,
    body            text NOT NULL,
    reply_to        bigint REFERENCES messages (id),
    -- The id of the first message of the conversation (its own id for a new one).
    thread_id       bigint NOT NULL,
    idempotency_key text,
    sent_at         timestamptz NOT NULL DEFAULT now(),
    read_at         timestamptz
);
ALTER SEQUENCE messages_id_seq OWNED BY messages.id;

-- A poll touches only the unread part of one inbox, so its cost does not grow
-- with the read history.
CREATE INDEX messages_unread_idx ON messages (recipient_id, id) WHERE read_at IS NULL;
-- include_read: the most recent messages of one inbox.
CREATE INDEX messages_inbox_idx ON messages (recipient_id, id);
CREATE INDEX messages_sender_idx ON messages (sender_id, id);
CREATE INDEX messages_thread_idx ON messages (thread_id, id);
CREATE UNIQUE INDEX messages_idempotency_idx ON messages (sender_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
