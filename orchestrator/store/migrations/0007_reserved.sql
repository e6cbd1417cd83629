-- 0007: a placeholder in this branch only. Migration 0007 belongs to another change of
-- issue 15 (per-session endpoint and sandbox policy); this branch's own migration is 0008,
-- and the numbers must run without gaps. Delete this file when the real 0007 is merged.
SELECT 1;
