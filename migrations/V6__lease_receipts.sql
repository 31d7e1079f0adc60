-- Leases with receipts, and messages that stop coming back.
--
-- A lease hands a message out for its delivery number `delivery_count`; a
-- receipt names that number, so an acknowledgement from a worker whose
-- lease ended and whose message went to another worker is refused.
-- After `max_deliveries` leases without an acknowledgement a message is
-- dead: it no longer comes back to any poll, and shows as dead to its
-- sender and in its recipient's history. Nothing is deleted.
ALTER TABLE messages ADD COLUMN dead_at timestamptz;

-- Analysts see which messages died (a new last column; grants are kept).
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
       m.dead_at
FROM messages m
JOIN agents s ON s.id = m.sender_id
JOIN agents r ON r.id = m.recipient_id;
