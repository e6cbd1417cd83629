-- 0011: faithful import of pi / Prime Agent session files (issue 20, docs/tree.md "Faithful import").
-- imported_header: the file's header line as it was (id, cwd, provider, modelId, thinkingLevel,
-- parentSession ...), written back by an export; NULL for a session that was not imported.
ALTER TABLE sessions ADD COLUMN imported_header JSON;
-- imported: the row records a call another installation made (an imported assistant message's
-- usage). Shown by `usage`; never counted against a budget.
ALTER TABLE usage ADD COLUMN imported BOOLEAN DEFAULT false;
