-- An agent keeps at most 20 console sessions (src/store/console.rs,
-- `CREATE`): a sign-in beyond ends its oldest. Without a cap one stranger,
-- registered once, signed in ~87 times a second, each sign-in a row kept
-- for the session's hours (an outsider's attack). This index finds an
-- agent's sessions, newest first, and serves the foreign key's cascade.
CREATE INDEX console_sessions_agent_idx ON console_sessions (agent_id, created_at)
    WHERE agent_id IS NOT NULL;
