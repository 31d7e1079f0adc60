-- Console sessions (/console): a browser signed in as an agent, or as an
-- operator. Stored here so that any replica accepts any session (a load
-- balancer may send each page elsewhere). The cookie carries a random
-- secret; only its SHA-256 is kept, as with tokens.
CREATE TABLE console_sessions (
    secret_hash  bytea PRIMARY KEY CHECK (octet_length(secret_hash) = 32),
    -- The agent signed in, and the digest of the token it signed in with:
    -- rotating the token (or unregistering) ends its sessions. NULL for an
    -- operator session.
    agent_id     bigint REFERENCES agents (id) ON DELETE CASCADE,
    token_hash   bytea CHECK (octet_length(token_hash) = 32),
    -- An operator session: the digest of PHONE_CONSOLE_ADMIN_TOKEN it
    -- signed in with, so that changing that token ends them.
    operator_hash bytea CHECK (octet_length(operator_hash) = 32),
    -- Sent back in every form (CSRF): bound to the session.
    csrf         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    CHECK ((agent_id IS NULL) = (token_hash IS NULL)),
    CHECK ((agent_id IS NULL) <> (operator_hash IS NULL))
);
-- Pruning expired sessions (store/prune.rs).
CREATE INDEX console_sessions_expires_idx ON console_sessions (expires_at);
