-- 0010: sweeps (issue 19, docs/sweeps.md): benchmark grids, resumable by cell.

-- One row per sweep, by name. spec: the sweep file as data (defaults filled in), digest its
-- hash. state: running | done | incomplete | cancelled | budget (docs/sweeps.md).
-- runner_pid: the process of this host that runs it now (NULL when none does).
CREATE TABLE sweeps (
    name        VARCHAR PRIMARY KEY,
    spec        JSON NOT NULL,
    digest      VARCHAR NOT NULL,
    state       VARCHAR NOT NULL,
    runner_pid  INTEGER,
    created_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL
);

-- One row per cell (task × model × variant × seed), keyed by its fingerprint
-- (orchestrator/sweeps/grid.py). state: pending | running | scored | errored. The outcome
-- columns are the latest finished trial's; trials counts every trial started.
CREATE TABLE sweep_cells (
    sweep          VARCHAR NOT NULL,
    fingerprint    VARCHAR NOT NULL,
    suite          VARCHAR NOT NULL,
    task_id        VARCHAR NOT NULL,
    model          VARCHAR NOT NULL,
    variant        VARCHAR NOT NULL,
    seed           BIGINT NOT NULL,
    context_tokens INTEGER,
    state          VARCHAR NOT NULL,
    score          DOUBLE,
    answer         VARCHAR,
    tokens         BIGINT,
    cost_usd       DOUBLE,
    cost_known     BOOLEAN,
    wall_s         DOUBLE,
    stop_reason    VARCHAR,
    error_class    VARCHAR,
    truncated      BOOLEAN,
    session_id     VARCHAR,
    trials         INTEGER NOT NULL,
    position       INTEGER NOT NULL,
    updated_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (sweep, fingerprint)
);

-- One row per trial (an attempt at a cell: one root session). state: running | scored |
-- errored | abandoned (its runner died before it finished; it never counts).
CREATE TABLE sweep_trials (
    id            VARCHAR PRIMARY KEY,
    sweep         VARCHAR NOT NULL,
    fingerprint   VARCHAR NOT NULL,
    session_id    VARCHAR NOT NULL,
    state         VARCHAR NOT NULL,
    score         DOUBLE,
    answer        VARCHAR,
    tokens_input  BIGINT,
    tokens_output BIGINT,
    cost_usd      DOUBLE,
    cost_known    BOOLEAN,
    wall_s        DOUBLE,
    stop_reason   VARCHAR,
    error_class   VARCHAR,
    error         VARCHAR,
    truncated     BOOLEAN,
    started_at    TIMESTAMP NOT NULL,
    finished_at   TIMESTAMP
);
CREATE INDEX sweep_trials_cell ON sweep_trials (sweep, fingerprint);
