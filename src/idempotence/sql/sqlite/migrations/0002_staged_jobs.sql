-- 0002_staged_jobs: jobs staged by a phase, committed with it (R7).

CREATE TABLE idempotence_staged_jobs (
    id          INTEGER PRIMARY KEY,
    job_key     TEXT    NOT NULL UNIQUE,
    scope       TEXT    NOT NULL,
    key_id      INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    args        TEXT    NOT NULL DEFAULT '{}',
    created_at  REAL    NOT NULL
);
