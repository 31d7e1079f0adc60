-- The quotas' rare checks, out of the mail statement (src/store/batch/send.rs,
-- `decided`). Every sub-plan of a statement is set up on each execution,
-- whether it runs or not: as sub-plans these counts cost every batch about 5%
-- (bench/RESULTS.md), though they run only for a sender writing to someone
-- new, or to an inbox whose backlog could be near a cap. A function is set up
-- only when it is called.
--
-- What one copy of a send is refused for, or NULL: `first_contact`, the
-- sender writes to this recipient for the first time (the new-recipient quota
-- `new_per_day`; `nth_new` first contacts of this sender so far in the batch,
-- this one included); `most`, the most unread messages the recipient's inbox
-- could hold (ids from its oldest unread to the newest issued); the share of
-- one sender in one inbox (`per_sender`; `nth_pair` copies of this pair so far
-- in the batch, this one included); a full inbox (`unread_max`), which still
-- takes mail from agents its owner knows (`known`: a contact, or an answer to
-- its own mail; or an agent it wrote to) up to twice the cap. A quota of 0 is
-- off. The same checks as before this migration, in the same order. STABLE:
-- it sees what the calling statement sees.
CREATE FUNCTION phone_quota_refusal(
    from_id bigint, to_id bigint, known boolean, first_contact boolean, nth_new bigint,
    nth_pair bigint, most bigint, new_per_day int, unread_max int, per_sender int)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF first_contact AND new_per_day > 0 AND (
           SELECT count(*) FROM (
               SELECT 1 FROM correspondents x
               WHERE x.sender_id = from_id AND x.first_at > now() - interval '1 day'
               LIMIT new_per_day) y) + nth_new > new_per_day THEN
        RETURN 'new_recipient_quota';
    END IF;
    -- A young backlog (pollers keeping up) is not counted.
    IF most IS NULL OR most < least(nullif(unread_max, 0), nullif(per_sender, 0)) THEN
        RETURN NULL;
    END IF;
    IF per_sender > 0 AND most >= per_sender AND (
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
               SELECT 1 FROM messages m
               WHERE m.recipient_id = to_id AND m.read_at IS NULL AND m.dead_at IS NULL
                 AND (m.leased_until IS NULL OR m.leased_until <= now())
                 AND (m.expires_at IS NULL OR m.expires_at > now())
               ORDER BY m.recipient_id, m.id LIMIT unread_max) u) >= unread_max
       AND (NOT (known OR EXISTS (
                SELECT 1 FROM correspondents x
                WHERE x.sender_id = to_id AND x.recipient_id = from_id))
            OR (most >= 2 * unread_max AND (
                SELECT count(*) FROM (
                    SELECT 1 FROM messages m
                    WHERE m.recipient_id = to_id AND m.read_at IS NULL AND m.dead_at IS NULL
                      AND (m.leased_until IS NULL OR m.leased_until <= now())
                      AND (m.expires_at IS NULL OR m.expires_at > now())
                    ORDER BY m.recipient_id, m.id LIMIT 2 * unread_max) u) >= 2 * unread_max)) THEN
        RETURN 'inbox_full';
    END IF;
    RETURN NULL;
END
$$;
