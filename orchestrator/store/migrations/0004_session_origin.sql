-- 0004: where a session came from (issue 6, docs/tree.md). A fork or clone names the session
-- it was copied from and the event it was copied up to (that session's ids); NULL for every
-- other session, imported ones included. Informational only: the copy owns its events.
ALTER TABLE sessions ADD COLUMN forked_from VARCHAR;
ALTER TABLE sessions ADD COLUMN forked_at VARCHAR;
