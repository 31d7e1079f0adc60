-- Analytics: read-only views over the message history, in their own schema,
-- for analysts (docs/ANALYTICS.md). No view exposes a message body, a
-- subject or a token. Days are UTC days.

CREATE SCHEMA analytics;
COMMENT ON SCHEMA analytics IS
    'Read-only views over the phone message history (no bodies, subjects or tokens). See docs/ANALYTICS.md.';

-- Indexes. Messages are never deleted, so analytics must stay fast as the
-- history grows (measured at 10M messages: docs/ANALYTICS.md). The views
-- below are answered by index-only scans of narrow indexes instead of reads
-- of the table, whose rows carry the bodies:
--
-- * the UTC day of each message, with sender, recipient, time and reply:
--   date ranges on the views become index range scans, and the daily views
--   read nothing else;
-- * three indexes the mailbox already had, widened (same keys, so the same
--   plans for the tools) with the columns the per-agent and per-thread views
--   need: by sender, by recipient, by thread.
--
-- Every message write already updates every index (a read sets read_at,
-- which the unread index depends on), so widening adds bytes, not writes;
-- the day index is the one new index (cost measured in docs/ANALYTICS.md).
--
-- On a large existing database, build these first with CREATE INDEX
-- CONCURRENTLY (same names) and drop the three old ones concurrently; this
-- migration then finds them and only creates the views.
CREATE INDEX IF NOT EXISTS messages_day_idx
    ON messages (((sent_at AT TIME ZONE 'UTC')::date), sender_id, recipient_id)
    INCLUDE (sent_at, reply_to);
CREATE INDEX IF NOT EXISTS messages_sender_cover_idx
    ON messages (sender_id, id) INCLUDE (recipient_id, sent_at, reply_to);
DROP INDEX IF EXISTS messages_sender_idx;
CREATE INDEX IF NOT EXISTS messages_inbox_cover_idx
    ON messages (recipient_id, id) INCLUDE (sent_at, read_at);
DROP INDEX IF EXISTS messages_inbox_idx;
CREATE INDEX IF NOT EXISTS messages_thread_cover_idx
    ON messages (thread_id, id) INCLUDE (sender_id, recipient_id, sent_at, read_at);
DROP INDEX IF EXISTS messages_thread_idx;

-- Every message, without its body or subject. The base for ad-hoc questions:
-- filters on sent_at, day, sender or recipient reach the indexes.
CREATE VIEW analytics.messages AS
SELECT m.id,
       'msg_' || m.id                          AS message,
       m.sent_at,
       (m.sent_at AT TIME ZONE 'UTC')::date    AS day,
       s.name                                  AS sender,
       s.project                               AS sender_project,
       r.name                                  AS recipient,
       r.project                               AS recipient_project,
       m.reply_to,
       m.thread_id,
       m.reply_to IS NOT NULL                  AS is_reply,
       m.read_at,
       m.read_at - m.sent_at                   AS time_to_read,
       m.acked_at,
       m.delivery_count,
       octet_length(m.body)                    AS body_bytes
FROM messages m
JOIN agents s ON s.id = m.sender_id
JOIN agents r ON r.id = m.recipient_id;
COMMENT ON VIEW analytics.messages IS
    'One row per message: who, when, thread, read/acknowledged times, body size. No body or subject.';

-- Messages per UTC day.
CREATE VIEW analytics.daily_messages AS
SELECT (m.sent_at AT TIME ZONE 'UTC')::date                 AS day,
       count(*)                                             AS messages,
       count(*) FILTER (WHERE m.reply_to IS NULL)           AS new_threads,
       count(*) FILTER (WHERE m.reply_to IS NOT NULL)       AS replies,
       count(DISTINCT m.sender_id)                          AS active_senders,
       count(DISTINCT m.recipient_id)                       AS active_recipients
FROM messages m
GROUP BY 1;
COMMENT ON VIEW analytics.daily_messages IS
    'Messages per UTC day: total, new threads, replies, distinct senders and recipients.';

-- Messages per UTC day and project: sent by the project's agents, received
-- by them, and how many stayed within the project. An agent's project is
-- its current one.
CREATE VIEW analytics.project_daily_messages AS
SELECT p.day,
       x.project,
       coalesce(sum(p.n) FILTER (WHERE x.side = 'from'), 0)::bigint                          AS sent,
       coalesce(sum(p.n) FILTER (WHERE x.side = 'to'), 0)::bigint                            AS received,
       coalesce(sum(p.n) FILTER (WHERE x.side = 'from' AND s.project = r.project), 0)::bigint AS within_project
FROM (SELECT (sent_at AT TIME ZONE 'UTC')::date AS day, sender_id, recipient_id, count(*) AS n
      FROM messages
      GROUP BY 1, 2, 3) p
JOIN agents s ON s.id = p.sender_id
JOIN agents r ON r.id = p.recipient_id
CROSS JOIN LATERAL (VALUES ('from', s.project), ('to', r.project)) AS x (side, project)
GROUP BY p.day, x.project;
COMMENT ON VIEW analytics.project_daily_messages IS
    'Messages per UTC day and project: sent, received, and sent within the project.';

-- Per agent: what it sent, received and read, how fast it reads, and how
-- fast it answers.
CREATE VIEW analytics.agent_activity AS
SELECT a.name                        AS agent,
       a.project,
       a.registered_at,
       a.last_seen_at,
       a.unregistered_at,
       s.sent,
       s.replies_sent,
       r.received,
       r.read,
       r.received - r.read           AS unread,
       r.median_time_to_read,
       rp.answered,
       rp.median_time_to_reply,
       s.last_sent_at,
       r.last_received_at
FROM agents a
CROSS JOIN LATERAL (
    SELECT count(*) AS sent, count(m.reply_to) AS replies_sent, max(m.sent_at) AS last_sent_at
    FROM messages m WHERE m.sender_id = a.id) s
CROSS JOIN LATERAL (
    SELECT count(*)                                                           AS received,
           count(m.read_at)                                                   AS read,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY m.read_at - m.sent_at) AS median_time_to_read,
           max(m.sent_at)                                                     AS last_received_at
    FROM messages m WHERE m.recipient_id = a.id) r
-- Time to reply: from a message's arrival to this agent's first reply to it.
CROSS JOIN LATERAL (
    SELECT count(*) AS answered,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY d.delay) AS median_time_to_reply
    FROM (SELECT min(re.sent_at) - o.sent_at AS delay
          FROM messages re
          JOIN messages o ON o.id = re.reply_to
          WHERE re.sender_id = a.id AND o.recipient_id = a.id
          GROUP BY o.id, o.sent_at) d) rp;
COMMENT ON VIEW analytics.agent_activity IS
    'Per agent: sent, replies sent, received, read, unread, median time to read, messages answered, '
    'median time to reply (arrival to first reply), last activity.';

-- Conversations: one row per thread (a message and the chain of replies
-- that followed it), from the thread index alone.
CREATE VIEW analytics.reply_chains AS
SELECT 'msg_' || t.thread_id              AS thread,
       t.thread_id,
       s.name                             AS started_by,
       r.name                             AS started_with,
       s.project,
       t.started_at,
       t.last_message_at,
       t.last_message_at - t.started_at   AS duration,
       t.messages,
       t.messages - 1                     AS replies,
       t.unread
FROM (SELECT thread_id,
             min(sent_at)                                      AS started_at,
             max(sent_at)                                      AS last_message_at,
             count(*)                                          AS messages,
             count(*) FILTER (WHERE read_at IS NULL)           AS unread,
             min(sender_id) FILTER (WHERE id = thread_id)      AS started_by_id,
             min(recipient_id) FILTER (WHERE id = thread_id)   AS started_with_id
      FROM messages
      GROUP BY thread_id) t
JOIN agents s ON s.id = t.started_by_id
JOIN agents r ON r.id = t.started_with_id;
COMMENT ON VIEW analytics.reply_chains IS
    'One row per thread: who started it with whom (and the starter''s project), when, how long it ran, '
    'messages, replies, unread messages. thread_id grows with time: filter on it for recent threads.';

-- Thread lengths: how many conversations got how many replies.
CREATE VIEW analytics.reply_chain_lengths AS
SELECT messages - 1 AS replies, count(*) AS threads,
       round(100.0 * count(*) / sum(count(*)) OVER (), 1) AS percent
FROM (SELECT thread_id, count(*) AS messages FROM messages GROUP BY thread_id) t
GROUP BY messages
ORDER BY messages;
COMMENT ON VIEW analytics.reply_chain_lengths IS 'How many threads got 0, 1, 2, ... replies.';

-- What waits unread, per recipient.
CREATE VIEW analytics.unread_backlog AS
SELECT a.name                           AS agent,
       a.project,
       b.unread,
       b.leased,
       b.oldest_unread_at,
       now() - b.oldest_unread_at       AS oldest_unread_age,
       a.last_seen_at,
       a.unregistered_at
FROM agents a
CROSS JOIN LATERAL (
    SELECT count(*)                                      AS unread,
           count(*) FILTER (WHERE m.leased_until > now()) AS leased,
           min(m.sent_at)                                AS oldest_unread_at
    FROM messages m
    WHERE m.recipient_id = a.id AND m.read_at IS NULL) b
WHERE b.unread > 0;
COMMENT ON VIEW analytics.unread_backlog IS
    'Per agent with unread mail: how many, how many are leased right now, the oldest and its age.';

-- Who writes to whom the most (one pass over the sender index).
CREATE VIEW analytics.busiest_pairs AS
SELECT s.name            AS sender,
       s.project         AS sender_project,
       r.name            AS recipient,
       r.project         AS recipient_project,
       p.messages,
       p.first_sent_at,
       p.last_sent_at
FROM (SELECT sender_id, recipient_id, count(*) AS messages,
             min(sent_at) AS first_sent_at, max(sent_at) AS last_sent_at
      FROM messages
      GROUP BY sender_id, recipient_id) p
JOIN agents s ON s.id = p.sender_id
JOIN agents r ON r.id = p.recipient_id
ORDER BY p.messages DESC, s.name, r.name;
COMMENT ON VIEW analytics.busiest_pairs IS
    'Sender -> recipient pairs by number of messages, busiest first, with first and last message times.';

-- A read-only role for analysts: it may read the analytics schema and
-- nothing else (it has no privilege on the tables in public). Created
-- without a password and NOLOGIN; grant it to a login role:
--   CREATE ROLE alice LOGIN PASSWORD '…' IN ROLE phone_analyst;
-- Roles are cluster-wide and every database of the cluster runs this
-- migration (tests create many at once): creation tolerates a role that
-- exists or is being created concurrently, and a migration user without
-- CREATEROLE (then create the role by hand, docs/ANALYTICS.md).
DO $$
BEGIN
    CREATE ROLE phone_analyst NOLOGIN;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
    WHEN insufficient_privilege THEN
        RAISE NOTICE 'phone_analyst not created (no CREATEROLE privilege); see docs/ANALYTICS.md';
END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'phone_analyst') THEN
        GRANT USAGE ON SCHEMA analytics TO phone_analyst;
        GRANT SELECT ON ALL TABLES IN SCHEMA analytics TO phone_analyst;
        ALTER DEFAULT PRIVILEGES IN SCHEMA analytics GRANT SELECT ON TABLES TO phone_analyst;
    END IF;
END
$$;
