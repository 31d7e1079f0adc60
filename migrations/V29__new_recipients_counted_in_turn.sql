-- The new-recipient quota (PHONE_NEW_RECIPIENT_QUOTA_PER_DAY) was counted in
-- each mail statement's own snapshot: statements of one sender running at
-- once (two replicas, or a replica's second statement beside a slow one)
-- each saw the others' first contacts as not yet made, and each let its own
-- quota through. An outsider's burst with 60 KB bodies stored 220-500 first
-- messages against the daily 100.
--
-- The mail statement (src/store/batch/send.rs, `decided`) calls this once
-- per sender with first contacts in it. Under the quota, it takes the
-- sender's lock (held to the statement's commit) and counts again: a
-- VOLATILE function's query takes a snapshot of its own, which sees the
-- first contacts of the statement that held the lock before. Over the
-- quota (the count only grows within a day) it returns at once and takes
-- no lock, so a sender refused all day holds no one up. The statement's own
-- writes come after `decided` (its inserts read it in full, in order), so
-- the count never sees them. The hot path (mail to agents a sender knows)
-- never calls it.
--
-- The lock is waited for at most a second: a statement holding it may
-- itself wait (on a row another transaction holds), and the others' calls
-- in a batch waiting for it must not wait as long. Past the second, or
-- in a deadlock with another batch's senders, the count of the statement's
-- own snapshot stands, as before this version.
-- The count itself is V26's `phone_new_recipients_today`: STABLE, it reads
-- the snapshot of the query that calls it, here each a new one.
CREATE FUNCTION phone_new_recipients_counted(from_id bigint, new_per_day int)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    made bigint := phone_new_recipients_today(from_id, new_per_day);
    waited text := current_setting('lock_timeout');
BEGIN
    IF made >= new_per_day THEN
        RETURN made;
    END IF;
    PERFORM set_config('lock_timeout', '1s', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended('phone:new-recipients:' || from_id, 0));
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
        PERFORM set_config('lock_timeout', waited, true);
        RETURN made;
    END;
    PERFORM set_config('lock_timeout', waited, true);
    RETURN phone_new_recipients_today(from_id, new_per_day);
END
$$;
