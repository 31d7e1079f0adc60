-- A searchable message's words, parsed once when it is sent (migration
-- V21 says why), in a migration of its own: ALTER TABLE keeps readers out
-- until its transaction commits, so it commits before V21's index build.
--
-- Set on the rows the search index holds (mail to one, and each group's
-- first copy) by the send, and by the mending of a group whose first copy
-- changed (store::messages::heal_groups); NULL on every other row and on
-- mail stored before this migration, for which the index and ranking
-- parse the text as before.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS words tsvector;
