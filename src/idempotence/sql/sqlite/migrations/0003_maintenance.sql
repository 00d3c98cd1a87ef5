-- 0003_maintenance: the completer's attempt count (B2) and the built-in job runner (B4).

ALTER TABLE idempotency_keys ADD COLUMN completer_attempts INTEGER NOT NULL DEFAULT 0;

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
