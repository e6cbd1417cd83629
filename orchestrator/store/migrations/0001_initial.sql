-- 0001: the first schema (docs/design.md, "State and storage"). Applied inside one transaction by
-- orchestrator/store/migrate.py, which then records version 1 in schema_version.
-- Timestamps are UTC without a zone; the store converts at its boundary.

CREATE TABLE schema_version (
    version    INTEGER NOT NULL,
    applied_at TIMESTAMP NOT NULL
);

CREATE TABLE sessions (
    id            VARCHAR PRIMARY KEY,
    root_id       VARCHAR NOT NULL,
    parent_id     VARCHAR,
    name          VARCHAR,
    depth         INTEGER NOT NULL,
    cwd           VARCHAR NOT NULL,
    model         VARCHAR NOT NULL,
    backend       VARCHAR NOT NULL,
    sandbox_ref   VARCHAR,
    status        VARCHAR NOT NULL,
    leaf_event_id VARCHAR,
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL
);

-- Append-only record of truth. seq is per session (1, 2, 3 ...); parent_event_id links the
-- conversation tree (NULL for a root entry).
CREATE TABLE events (
    session_id      VARCHAR NOT NULL,
    seq             BIGINT NOT NULL,
    id              VARCHAR PRIMARY KEY,
    parent_event_id VARCHAR,
    type            VARCHAR NOT NULL,
    ts              TIMESTAMP NOT NULL,
    payload         JSON NOT NULL
);

CREATE INDEX events_session_seq ON events (session_id, seq);

-- One row per model call, written in the same transaction as its "usage" event.
-- cost_usd is NULL when the price is unknown; cost_known says so explicitly, so an unknown
-- price is never summed as 0.
CREATE TABLE usage (
    event_id    VARCHAR NOT NULL,
    session_id  VARCHAR NOT NULL,
    root_id     VARCHAR NOT NULL,
    provider    VARCHAR NOT NULL,
    model       VARCHAR NOT NULL,
    input       BIGINT NOT NULL,
    output      BIGINT NOT NULL,
    cache_read  BIGINT NOT NULL,
    cache_write BIGINT NOT NULL,
    cost_usd    DOUBLE,
    cost_known  BOOLEAN NOT NULL,
    latency_ms  DOUBLE NOT NULL,
    ts          TIMESTAMP NOT NULL
);
