-- 0003_maintenance: the completer's attempt count (B2) and the built-in job runner (B4).

-- How many times a completer has picked the key up. Past the completer's limit the
-- key is errored for a human instead of being retried forever (B2).
ALTER TABLE idempotency_keys ADD COLUMN completer_attempts integer NOT NULL DEFAULT 0;

-- The built-in job runner's queue (B4). The enqueuer moves staged jobs here in the
-- transaction that takes them out of idempotence_staged_jobs, so a job arrives once
-- per job_key (the unique constraint absorbs a repeat); the runner then executes it
-- at least once.
CREATE TABLE idempotence_jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_key     text        NOT NULL UNIQUE,
    scope       text        NOT NULL,
    key_id      bigint      NOT NULL,
    name        text        NOT NULL,
    args        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    -- ready: waiting or running (run_at is then the end of the runner's lease);
    -- done: ran to the end; dead: failed too often, left for a human.
    status      text        NOT NULL DEFAULT 'ready',
    attempts    integer     NOT NULL DEFAULT 0,
    run_at      timestamptz NOT NULL DEFAULT now(),
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CONSTRAINT idempotence_jobs_status CHECK (status IN ('ready', 'done', 'dead'))
);

-- The runner's view: jobs that may run, by when.
CREATE INDEX idempotence_jobs_ready_idx ON idempotence_jobs (run_at) WHERE status = 'ready';
