-- The whole current schema: the sum of migrations/ (a test proves it).

CREATE TABLE idempotency_keys (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    scope           text        NOT NULL,
    key             text        NOT NULL,
    request_method  text        NOT NULL,
    request_path    text        NOT NULL,
    fingerprint     text        NOT NULL,
    -- What the completer needs to re-run the flow (B2).
    request_params  jsonb       NOT NULL DEFAULT '{}'::jsonb,
    flow            text        NOT NULL,
    recovery_point  text        NOT NULL DEFAULT 'started',
    -- The fencing token (F1): bumped by every claim that takes the lock.
    lock_token      bigint      NOT NULL DEFAULT 1,
    locked_at       timestamptz,
    lock_timeout    interval    NOT NULL,
    response_status integer,
    response_headers jsonb,
    response_body   bytea,
    -- Set when the key ended in an indeterminate foreign failure (R6).
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_run_at     timestamptz,
    finished_at     timestamptz,
    expires_at      timestamptz,
    -- How many times a completer has picked the key up (B2).
    completer_attempts integer  NOT NULL DEFAULT 0,
    -- Duplicates wait for this key (P10): settling it sends a NOTIFY and clears this.
    waiters         boolean     NOT NULL DEFAULT false,
    -- The non-idempotent foreign call this key's worker began and has not recorded
    -- (R6): a claim that finds it set errors the key instead of calling again.
    calling         text,
    -- The scope leads every key so the table can be distributed by scope (DESIGN 8).
    PRIMARY KEY (scope, id),
    CONSTRAINT idempotency_keys_scope_key_unique UNIQUE (scope, key),
    CONSTRAINT idempotency_keys_key_length CHECK (char_length(key) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK (finished_at IS NULL OR response_status IS NOT NULL)
);

-- The sweeper's view: locked rows only (B1).
CREATE INDEX idempotency_keys_locked_idx
    ON idempotency_keys (locked_at) WHERE locked_at IS NOT NULL;

-- The completer's view: unlocked, unfinished rows (B2).
CREATE INDEX idempotency_keys_pending_idx
    ON idempotency_keys (last_run_at) WHERE finished_at IS NULL AND locked_at IS NULL;

-- The reaper's view: rows that will expire (B3).
CREATE INDEX idempotency_keys_expires_idx
    ON idempotency_keys (expires_at) WHERE expires_at IS NOT NULL;

-- Jobs staged by a phase, committed with it (R7).
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
