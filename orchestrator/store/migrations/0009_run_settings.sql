-- 0009: the settings a session's run chose over its daemon's config.toml (issue 18: an
-- evaluation config run through the user's daemon). A JSON document validated by
-- orchestrator/session_specs.py's StoredRunSettings: compaction, model-call retries, the depth
-- limit; never a key. NULL: the session uses the config of the daemon that runs it.
ALTER TABLE sessions ADD COLUMN run_settings JSON;
