-- The whole current schema: the sum of migrations/ (a test proves it).
-- Times are REAL seconds since the Unix epoch, always written by SQLite's own clock
-- (see the `now` expression in queries.sql); JSON columns hold text.

CREATE TABLE idempotency_keys (
    -- AUTOINCREMENT: an id is never reused after a delete, because derived keys
    -- (R4) are built from it and must never name two different requests.
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    scope            TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    request_method   TEXT    NOT NULL,
    request_path     TEXT    NOT NULL,
    fingerprint      TEXT    NOT NULL,
    request_params   TEXT    NOT NULL DEFAULT '{}',
    flow             TEXT    NOT NULL,
    recovery_point   TEXT    NOT NULL DEFAULT 'started',
    lock_token       INTEGER NOT NULL DEFAULT 1,
    locked_at        REAL,
    lock_timeout     REAL    NOT NULL,
    response_status  INTEGER,
    response_headers TEXT,
    response_body    BLOB,
    error            TEXT,
    created_at       REAL    NOT NULL,
    last_run_at      REAL,
    finished_at      REAL,
    expires_at       REAL,
    completer_attempts INTEGER NOT NULL DEFAULT 0,
    calling          TEXT,
    CONSTRAINT idempotency_keys_scope_key_unique UNIQUE (scope, key),
    CONSTRAINT idempotency_keys_key_length CHECK (length(key) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK (finished_at IS NULL OR response_status IS NOT NULL)
);

CREATE INDEX idempotency_keys_locked_idx
    ON idempotency_keys (locked_at) WHERE locked_at IS NOT NULL;

CREATE INDEX idempotency_keys_pending_idx
    ON idempotency_keys (last_run_at) WHERE finished_at IS NULL AND locked_at IS NULL;

CREATE INDEX idempotency_keys_expires_idx
    ON idempotency_keys (expires_at) WHERE expires_at IS NOT NULL;

-- Jobs staged by a phase, committed with it (R7).
CREATE TABLE idempotence_staged_jobs (
    id          INTEGER PRIMARY KEY,
    job_key     TEXT    NOT NULL UNIQUE,
    scope       TEXT    NOT NULL,
    key_id      INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    args        TEXT    NOT NULL DEFAULT '{}',
    created_at  REAL    NOT NULL
);

-- The built-in job runner's queue (B4).
CREATE TABLE idempotence_jobs (
    id          INTEGER PRIMARY KEY,
    job_key     TEXT    NOT NULL UNIQUE,
    scope       TEXT    NOT NULL,
    key_id      INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    args        TEXT    NOT NULL DEFAULT '{}',
    status      TEXT    NOT NULL DEFAULT 'ready',
    attempts    INTEGER NOT NULL DEFAULT 0,
    run_at      REAL    NOT NULL,
    last_error  TEXT,
    created_at  REAL    NOT NULL,
    finished_at REAL,
    CONSTRAINT idempotence_jobs_status CHECK (status IN ('ready', 'done', 'dead'))
);

CREATE INDEX idempotence_jobs_ready_idx ON idempotence_jobs (run_at) WHERE status = 'ready';
