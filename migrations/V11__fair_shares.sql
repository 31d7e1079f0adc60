-- Fair shares of an inbox, blocks that take effect on mail already waiting,
-- and refused sends that cost the sender (docs/SECURITY.md, "Spam").
--
-- Why a message stopped coming back: 'deliveries' (leased max_deliveries
-- times without an acknowledgement) or 'blocked' (its recipient blocked the
-- sender while it waited unread; unblocking brings it back if still unread).
-- NULL for older dead messages, which all died of deliveries.
ALTER TABLE messages ADD COLUMN dead_reason text
    CHECK (dead_reason IN ('deliveries', 'blocked'));
UPDATE messages SET dead_reason = 'deliveries' WHERE dead_at IS NOT NULL;

-- One sender's unread mail in one inbox, for its share of that inbox (a
-- send counts it only when the inbox's backlog could be that large) and for
-- a block, which withdraws it. Only unread, live messages: a read takes the
-- row out, so the index stays as small as the backlogs.
--
-- On a large existing database build these first with CREATE INDEX
-- CONCURRENTLY (same names and definitions); this migration then finds them.
CREATE INDEX IF NOT EXISTS messages_unread_sender_idx
    ON messages (recipient_id, sender_id, id) WHERE read_at IS NULL AND dead_at IS NULL;
-- Mail a block withdrew, for the unblock that brings it back.
CREATE INDEX IF NOT EXISTS messages_withdrawn_idx
    ON messages (recipient_id, sender_id) WHERE dead_reason = 'blocked';

-- Refused sends, one row per sender, recipient, reason and hour with a
-- count, instead of a row per attempt: a sender that keeps trying past a
-- refusal adds nothing but a count. Older rows (hour NULL) stay as they
-- were until pruned.
ALTER TABLE refused_sends
    ADD COLUMN hits integer NOT NULL DEFAULT 1,
    ADD COLUMN hour bigint;
CREATE UNIQUE INDEX refused_sends_hour_idx
    ON refused_sends (sender_id, recipient_id, reason, hour) WHERE hour IS NOT NULL;

-- Analysts see why a message died (a new last column; grants are kept).
CREATE OR REPLACE VIEW analytics.messages AS
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
       octet_length(m.body)                    AS body_bytes,
       m.dead_at,
       m.dead_reason
FROM messages m
JOIN agents s ON s.id = m.sender_id
JOIN agents r ON r.id = m.recipient_id;
