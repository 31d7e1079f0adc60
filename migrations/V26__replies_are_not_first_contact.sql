-- The new-recipient quota (PHONE_NEW_RECIPIENT_QUOTA_PER_DAY) counts the
-- agents a sender wrote to first. A reply goes to parties of a message
-- someone else began, so it is not a first contact: counted, 100 strangers
-- who each wrote one message used up the quota of the agent that answered
-- them, and it could write to no one new for a day. The mail statement
-- (src/store/batch/send.rs, `decided` and `met`) no longer counts a reply's
-- copies, and marks a pair that began with a reply, which this count leaves
-- out. The column has a constant default: adding it rewrites nothing.
ALTER TABLE correspondents ADD COLUMN by_reply boolean NOT NULL DEFAULT false;

-- As in V25, STABLE (see there), with pairs begun by a reply left out.
CREATE OR REPLACE FUNCTION phone_new_recipients_today(from_id bigint, new_per_day int)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM (
        SELECT 1 FROM correspondents x
        WHERE x.sender_id = from_id AND x.first_at > now() - interval '1 day'
          AND NOT x.by_reply
        LIMIT new_per_day) y);
END
$$;
