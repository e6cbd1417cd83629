-- 0003: sandboxes that outlive the daemon (docs/spec.md §4, R2, R8). One row per live sandbox the
-- daemon started (die_with_parent off): written when it starts, deleted when it stops. A
-- restarted daemon adopts each row whose session is not terminal and removes the rest.
-- session_id is the session's id, or "pool" for an idle warm-pool sandbox (never adopted).
-- ref: local = the gateway's pid (it leads its own process group); docker = the container id.
-- token: the gateway's auth token. A secret, kept here on purpose: this file is 0600 in a 0700
-- directory and already holds every conversation; the token only opens a gateway bound to
-- the loopback (local) or a Unix socket in a private directory (docker).
-- state: "starting" (process/container up, no kernel yet: never adoptable) or "ready".

CREATE TABLE sandboxes (
    backend     VARCHAR NOT NULL,
    ref         VARCHAR NOT NULL,
    session_id  VARCHAR NOT NULL,
    url         VARCHAR NOT NULL,
    kernel_id   VARCHAR NOT NULL,
    token       VARCHAR NOT NULL,
    runtime_dir VARCHAR NOT NULL,
    state       VARCHAR NOT NULL,
    started_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL,
    PRIMARY KEY (backend, ref)
);
