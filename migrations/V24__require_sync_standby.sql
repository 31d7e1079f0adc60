-- PHONE_REQUIRE_SYNC_STANDBY (src/store/pool/standby.rs): the mail statement's
-- transaction calls this just before COMMIT. It refuses when this server's
-- commit would not wait for a synchronous standby to flush it: no standby is
-- named (pg_auto_failover's wait_primary and single states, a primary left
-- alone), or this session's commits do not wait for a standby's flush
-- (synchronous_commit other than on or remote_apply). The transaction is
-- rolled back whole: nothing was stored, nothing marked read. Passing it does
-- not prove the commit waited: the server checks the standbys' positions
-- after COMMIT.
CREATE FUNCTION phone_require_sync_standby() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF current_setting('synchronous_standby_names') = ''
       OR current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        RAISE EXCEPTION 'no synchronous standby: this commit would not wait for one'
            USING ERRCODE = 'PHSBY',
                  HINT = 'phone is run with PHONE_REQUIRE_SYNC_STANDBY=true';
    END IF;
END
$$;
