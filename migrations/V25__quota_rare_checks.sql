-- The quotas' rare counts, out of the mail statement (src/store/batch/send.rs,
-- `decided`). Every sub-plan of a statement is set up on each execution,
-- whether it runs or not: as sub-plans these counts cost every batch about 5%
-- (bench/RESULTS.md), though they run only for a sender writing to someone
-- new, or to an inbox whose backlog could be near a cap. A function is set up
-- only when it is called.
--
-- Both are STABLE, and must stay so: a STABLE function sees what the calling
-- statement sees. A VOLATILE one would take a snapshot of its own, which
-- includes the rows the statement itself has inserted or marked read so far.
-- Their conditions on `messages m` are the statement's own
-- (`fragments::available_to`, `INBOX_ORDER`; a test in send.rs compares them).

-- How many agents `from_id` wrote to for the first time in the last day, up
-- to `new_per_day` (the new-recipient quota): read once per sender that
-- writes to someone new in a batch.
CREATE FUNCTION phone_new_recipients_today(from_id bigint, new_per_day int)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM (
        SELECT 1 FROM correspondents x
        WHERE x.sender_id = from_id AND x.first_at > now() - interval '1 day'
        LIMIT new_per_day) y);
END
$$;

-- Whether one copy of a send from `from_id` to `to_id` is refused for the
-- recipient's backlog, and why: the share of one sender in one inbox
-- (`per_sender`; `nth_pair` copies of this pair so far in the batch, this one
-- included), or a full inbox (`unread_max`), which still takes mail from agents
-- its owner knows (`known`: a contact, or an answer to its own mail; or an
-- agent it wrote to) up to twice the cap. `most` is the most unread messages
-- the backlog could hold (ids from its oldest unread to the newest issued):
-- the statement calls this only when that could reach the inbox's cap, or,
-- with the batch's earlier copies of the pair, the sender's share. A quota of 0
-- is off.
CREATE FUNCTION phone_backlog_refusal(
    from_id bigint, to_id bigint, known boolean, nth_pair bigint, most bigint,
    unread_max int, per_sender int)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF per_sender > 0 AND most + nth_pair - 1 >= per_sender AND (
           SELECT count(*) FROM (
               SELECT 1 FROM messages m
               WHERE m.recipient_id = to_id AND m.read_at IS NULL AND m.dead_at IS NULL
         AND (m.leased_until IS NULL OR m.leased_until <= now())
         AND (m.expires_at IS NULL OR m.expires_at > now()) AND m.sender_id = from_id
               ORDER BY m.recipient_id, m.sender_id, m.id LIMIT per_sender) u) + nth_pair > per_sender THEN
        RETURN 'inbox_share';
    END IF;
    IF unread_max > 0 AND most >= unread_max AND (
           SELECT count(*) FROM (
               SELECT 1 FROM messages m WHERE m.recipient_id = to_id AND m.read_at IS NULL AND m.dead_at IS NULL
         AND (m.leased_until IS NULL OR m.leased_until <= now())
         AND (m.expires_at IS NULL OR m.expires_at > now())
               ORDER BY m.recipient_id, m.id LIMIT unread_max) u) >= unread_max
       AND (NOT (known OR EXISTS (
                SELECT 1 FROM correspondents x
                WHERE x.sender_id = to_id AND x.recipient_id = from_id))
            OR (most >= 2 * unread_max AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM messages m WHERE m.recipient_id = to_id AND m.read_at IS NULL AND m.dead_at IS NULL
         AND (m.leased_until IS NULL OR m.leased_until <= now())
         AND (m.expires_at IS NULL OR m.expires_at > now())
                    ORDER BY m.recipient_id, m.id LIMIT 2 * unread_max) u) >= 2 * unread_max)) THEN
        RETURN 'inbox_full';
    END IF;
    RETURN NULL;
END
$$;
