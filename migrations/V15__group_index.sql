-- The copies of a group send by their `group_id` (the first copy's id): who
-- else a copy went to (`also_to`) and who "reply all" reaches. Through the
-- thread index instead, every later message of a long reply-all thread was
-- read for every copy shown. Partial: mail to one adds no entry.
CREATE INDEX IF NOT EXISTS messages_group_idx ON messages (group_id) WHERE group_id IS NOT NULL;
