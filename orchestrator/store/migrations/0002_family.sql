-- 0002: subagent families (issue 3). A child's short id as the model sees it, and the token
-- budget reserved for the session at spawn (NULL = no budget of its own).
ALTER TABLE sessions ADD COLUMN rlm_child_id VARCHAR;
ALTER TABLE sessions ADD COLUMN budget_tokens BIGINT;
