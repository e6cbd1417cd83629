-- 0005: the Continual Harness (docs/spec.md §6, issue 7, docs/harness.md).
--
-- harness_versions is append-only: every create, update and delete of an entry is one row, a
-- delete being a tombstone (deleted = TRUE, the last content kept). harness_entries is the head
-- of each entry: a copy of its newest version, so prompt assembly and lists read one row per
-- entry. Both are written in one transaction; the head's version is what a writer compares
-- its expected version with (a stale write is refused, never merged).
--
-- owner: "global" for the user's global entries, else the root session id of the session tree
-- the local entries belong to. scope is derivable from owner and kept for readable queries.
-- kind: prompt | memory | skill | subagent. source: agent | refine | user.
-- reference / arguments / metadata: JSON objects (skills: the callable and its contract).
-- session_id: the session whose request made the version (NULL for the user's CLI).
-- refinement_id: the refinement (or rollback) that made it, else NULL.

CREATE TABLE harness_versions (
    owner         VARCHAR NOT NULL,
    scope         VARCHAR NOT NULL,
    kind          VARCHAR NOT NULL,
    entry_id      VARCHAR NOT NULL,
    version       INTEGER NOT NULL,
    title         VARCHAR NOT NULL,
    content       VARCHAR NOT NULL,
    path          VARCHAR NOT NULL,
    reference     JSON NOT NULL,
    arguments     JSON NOT NULL,
    metadata      JSON NOT NULL,
    deleted       BOOLEAN NOT NULL,
    source        VARCHAR NOT NULL,
    reason        VARCHAR NOT NULL,
    session_id    VARCHAR,
    refinement_id VARCHAR,
    created_at    TIMESTAMP NOT NULL,
    PRIMARY KEY (owner, kind, entry_id, version)
);

CREATE TABLE harness_entries (
    owner         VARCHAR NOT NULL,
    scope         VARCHAR NOT NULL,
    kind          VARCHAR NOT NULL,
    entry_id      VARCHAR NOT NULL,
    version       INTEGER NOT NULL,
    title         VARCHAR NOT NULL,
    content       VARCHAR NOT NULL,
    path          VARCHAR NOT NULL,
    reference     JSON NOT NULL,
    arguments     JSON NOT NULL,
    metadata      JSON NOT NULL,
    deleted       BOOLEAN NOT NULL,
    source        VARCHAR NOT NULL,
    reason        VARCHAR NOT NULL,
    session_id    VARCHAR,
    refinement_id VARCHAR,
    created_at    TIMESTAMP NOT NULL, -- of version 1
    updated_at    TIMESTAMP NOT NULL, -- of the newest version
    PRIMARY KEY (owner, kind, entry_id)
);
CREATE INDEX harness_entries_owner_kind ON harness_entries (owner, kind, updated_at);

-- One row per /refine (or rollback). status: planning -> planned -> applied | failed |
-- discarded. edits: JSON list, each {action, kind, id, title?, content?, path?, reference?,
-- arguments?, metadata?, reason, baseline_version (planning time, NULL = absent),
-- applied (bool), error?, before_version?, after_version?}. rollback_of: the refinement this
-- one undoes. turn_index: the session's completed-turn count when it was applied (the outcome
-- compares the N turns before with the N after). outcome: JSON, written once N turns passed.
CREATE TABLE refinements (
    id               VARCHAR PRIMARY KEY,
    session_id       VARCHAR NOT NULL,
    owner            VARCHAR NOT NULL,
    scope            VARCHAR NOT NULL,
    trigger          VARCHAR NOT NULL,
    instructions     VARCHAR,
    status           VARCHAR NOT NULL,
    summary          VARCHAR,
    rationale        VARCHAR,
    expected_outcome VARCHAR,
    edits            JSON NOT NULL,
    rollback_of      VARCHAR,
    error            VARCHAR,
    turn_index       INTEGER,
    outcome          JSON,
    created_at       TIMESTAMP NOT NULL,
    planned_at       TIMESTAMP,
    applied_at       TIMESTAMP,
    outcome_at       TIMESTAMP
);
CREATE INDEX refinements_session ON refinements (session_id, created_at);

-- Refine can be switched off per session (issue 7 "Safety"); children inherit the flag.
ALTER TABLE sessions ADD COLUMN refine_enabled BOOLEAN DEFAULT TRUE;
