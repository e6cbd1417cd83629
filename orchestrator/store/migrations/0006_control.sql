-- 0006: long-horizon controls (docs/spec.md §7, issue 8, docs/control.md): autonomous runs, goals,
-- schedules (heartbeats) with their claimed dispatches, evaluation results.

-- One row per session in autonomous mode. policy: AutonomousPolicy as JSON (gates, limits,
-- gate timeout). Counters survive a daemon restart (the reference kept them in memory).
-- gate_state: JSON {command: {attempts, last_exit, failed_hash}}. stop_reason: NULL while it
-- runs, then one of control/autonomous.py STOP_REASONS.
CREATE TABLE autonomy (
    session_id         VARCHAR PRIMARY KEY,
    policy             JSON NOT NULL,
    enabled            BOOLEAN NOT NULL,
    turns_used         INTEGER NOT NULL,
    tokens_used        BIGINT NOT NULL,
    continuations_used INTEGER NOT NULL,
    started_at         TIMESTAMP NOT NULL,
    gate_state         JSON NOT NULL,
    stop_reason        VARCHAR,
    stop_detail        VARCHAR,
    stopped_at         TIMESTAMP,
    updated_at         TIMESTAMP NOT NULL
);

-- Goals: at most one non-final goal per session (active, paused or budget_limited).
-- status: active | paused | budget_limited | complete | cleared | error.
CREATE TABLE goals (
    id            VARCHAR PRIMARY KEY,
    session_id    VARCHAR NOT NULL,
    objective     VARCHAR NOT NULL,
    token_budget  BIGINT,
    tokens_used   BIGINT NOT NULL,
    status        VARCHAR NOT NULL,
    continuations INTEGER NOT NULL,
    last_reason   VARCHAR,
    created_at    TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL,
    completed_at  TIMESTAMP
);
CREATE INDEX goals_session ON goals (session_id, created_at);

-- Schedules and heartbeats. spec: the canonical text of control/timespec.py, re-parsed with
-- created_at as "now". source: user (prime-agent schedule) | heartbeat (/heartbeat) |
-- rlm_heartbeat (the kernel's rlm_heartbeat). delivery: steer | follow_up.
-- status: active | paused | completed | cancelled.
CREATE TABLE schedules (
    id          VARCHAR PRIMARY KEY,
    session_id  VARCHAR NOT NULL,
    source      VARCHAR NOT NULL,
    label       VARCHAR,
    spec        VARCHAR NOT NULL,
    prompt      VARCHAR NOT NULL,
    delivery    VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    next_run_at TIMESTAMP,
    last_run_at TIMESTAMP,
    run_count   INTEGER NOT NULL,
    last_error  VARCHAR,
    created_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL
);
CREATE INDEX schedules_due ON schedules (status, next_run_at);

-- A due tick is claimed (a row here, the schedule's next_run_at advanced, one transaction)
-- before it is delivered; a claim a crash left is marked interrupted, never replayed.
-- status: claimed | delivered | deferred | interrupted | failed.
CREATE TABLE dispatches (
    id            VARCHAR PRIMARY KEY,
    schedule_id   VARCHAR NOT NULL,
    session_id    VARCHAR NOT NULL,
    scheduled_for TIMESTAMP NOT NULL,
    claimed_at    TIMESTAMP NOT NULL,
    status        VARCHAR NOT NULL,
    delivered_at  TIMESTAMP,
    detail        VARCHAR
);
CREATE INDEX dispatches_schedule ON dispatches (schedule_id, claimed_at);

-- One row per `prime-agent run --config F`: what it was asked (config JSON), how it stopped,
-- what it cost across the whole tree.
CREATE TABLE eval_results (
    id            VARCHAR PRIMARY KEY,
    config_path   VARCHAR,
    config        JSON NOT NULL,
    session_id    VARCHAR NOT NULL,
    stop_reason   VARCHAR NOT NULL,
    exit_code     INTEGER NOT NULL,
    gates         JSON NOT NULL,
    sessions      INTEGER NOT NULL,
    tokens_input  BIGINT NOT NULL,
    tokens_output BIGINT NOT NULL,
    cost_usd      DOUBLE,
    cost_known    BOOLEAN NOT NULL,
    started_at    TIMESTAMP NOT NULL,
    finished_at   TIMESTAMP NOT NULL,
    wall_s        DOUBLE NOT NULL
);
