-- 0007: a session's model endpoint and sandbox policy belong to the session (issue 15,
-- docs/models.md, docs/store.md). JSON documents validated by orchestrator/store/session_specs.py:
-- model_spec = StoredModel (provider, model, api_base, the NAME of the key's variable -- never
-- the key --, context window, prices, tool protocol); sandbox_policy = StoredSandboxPolicy
-- (backend, image, workspace mode, network, limits). NULL for rows written before 0007: such
-- a session is resolved once from its selector when it is next loaded, and the result stored.
ALTER TABLE sessions ADD COLUMN model_spec JSON;
ALTER TABLE sessions ADD COLUMN sandbox_policy JSON;
