-- 0008: global harness writes from a sandbox are proposals (issue 15, docs/harness.md,
-- "Proposals"). A kernel (or a refinement the agent started) that creates, updates or deletes
-- a global entry gets one row here instead of a version: nothing reaches any system prompt
-- until the user accepts it (`prime-agent harness accept ID`, `/harness accept ID`), and the
-- accepted write is then an ordinary harness_versions row (its source the proposer's).
--
-- owner: the owner the write targets ("global"). proposer: the root session id of the tree
-- that proposed it (the pending-proposal bound counts per proposer). action / kind /
-- entry_id: the write. fields: JSON {title?, content?, path?, reference?, arguments?,
-- metadata?} (absent = keep, as an update says). base_version: the head's version when it
-- was proposed (NULL = no entry): accepting writes against exactly that version, so a
-- proposal never lands on a state the user did not see. source: agent | refine.
-- status: pending -> accepted | rejected. decided_by: "user". result_version: the version
-- the acceptance wrote.
CREATE TABLE harness_proposals (
    id             VARCHAR PRIMARY KEY,
    owner          VARCHAR NOT NULL,
    proposer       VARCHAR NOT NULL,
    action         VARCHAR NOT NULL,
    kind           VARCHAR NOT NULL,
    entry_id       VARCHAR NOT NULL,
    fields         JSON NOT NULL,
    base_version   INTEGER,
    source         VARCHAR NOT NULL,
    reason         VARCHAR NOT NULL,
    session_id     VARCHAR NOT NULL,
    refinement_id  VARCHAR,
    status         VARCHAR NOT NULL,
    created_at     TIMESTAMP NOT NULL,
    decided_at     TIMESTAMP,
    decided_by     VARCHAR,
    decision_note  VARCHAR,
    result_version INTEGER
);
CREATE INDEX harness_proposals_status ON harness_proposals (status, created_at);
