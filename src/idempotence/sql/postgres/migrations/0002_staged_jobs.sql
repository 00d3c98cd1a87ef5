-- 0002_staged_jobs: jobs staged by a phase, committed with it (R7).

CREATE TABLE idempotence_staged_jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The runner deduplicates deliveries by this key: deterministic from the key row,
    -- the phase and the job's place in it, so a job is the same job on every delivery.
    job_key     text        NOT NULL UNIQUE,
    scope       text        NOT NULL,
    key_id      bigint      NOT NULL,
    name        text        NOT NULL,
    args        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
