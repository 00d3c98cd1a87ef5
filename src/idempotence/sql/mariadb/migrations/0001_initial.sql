-- The MariaDB schema's first version: everything the other dialects reached in five.
-- Times are DATETIME(6) in UTC, from the server's UTC_TIMESTAMP(6) (never NOW(6),
-- which follows the session's time zone); durations are BIGINT microseconds.
-- Every text column compares byte for byte with no trailing-space padding
-- (utf8mb4_nopad_bin): keys are case-sensitive, and 'k' and 'k ' are two keys.

CREATE TABLE idempotency_keys (
    id              BIGINT        NOT NULL AUTO_INCREMENT,
    scope           VARCHAR(255)  NOT NULL,
    `key`           VARCHAR(255)  NOT NULL,
    request_method  VARCHAR(255)  NOT NULL,
    request_path    TEXT          NOT NULL,
    fingerprint     VARCHAR(255)  NOT NULL,
    -- What the completer needs to re-run the flow (B2): JSON text.
    request_params  LONGTEXT      NOT NULL DEFAULT '{}',
    flow            VARCHAR(255)  NOT NULL,
    recovery_point  VARCHAR(255)  NOT NULL DEFAULT 'started',
    -- The fencing token (F1): bumped by every claim that takes the lock.
    lock_token      BIGINT        NOT NULL DEFAULT 1,
    locked_at       DATETIME(6)   NULL,
    lock_timeout    BIGINT        NOT NULL,
    response_status INT           NULL,
    response_headers LONGTEXT     NULL,
    response_body   LONGBLOB      NULL,
    -- Set when the key ended in an indeterminate foreign failure (R6).
    error           TEXT          NULL,
    created_at      DATETIME(6)   NOT NULL DEFAULT UTC_TIMESTAMP(6),
    last_run_at     DATETIME(6)   NULL,
    finished_at     DATETIME(6)   NULL,
    expires_at      DATETIME(6)   NULL,
    -- How many times a completer has picked the key up (B2).
    completer_attempts INT        NOT NULL DEFAULT 0,
    -- Kept for the shape every dialect's rows share; MariaDB has no LISTEN, so
    -- waiting duplicates poll (P10) and nothing sets it.
    waiters         BOOLEAN       NOT NULL DEFAULT FALSE,
    -- The non-idempotent foreign call this key's worker began and has not recorded
    -- (R6): a claim that finds it set errors the key instead of calling again.
    calling         VARCHAR(255)  NULL,
    PRIMARY KEY (id),
    CONSTRAINT idempotency_keys_scope_key_unique UNIQUE (scope, `key`),
    CONSTRAINT idempotency_keys_key_length CHECK (char_length(`key`) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_keys_finished_has_response
        CHECK (finished_at IS NULL OR response_status IS NOT NULL),
    -- The sweeper's view (B1), the completer's (B2) and the reaper's (B3). MariaDB
    -- has no partial indexes: NULLs are indexed too, which costs space, not answers.
    INDEX idempotency_keys_locked_idx (locked_at),
    INDEX idempotency_keys_pending_idx (finished_at, last_run_at),
    INDEX idempotency_keys_expires_idx (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- Every key with its observable state, computed exactly as states.key_state does
-- (a test holds the two together), so that the operator's listing filters by state
-- before its LIMIT and its counts group by it; written once here for both. MERGE: a
-- query's WHERE on the key's columns reaches the table's indexes. The view's k.* is
-- the key table's columns when the view is made: a migration that adds one makes the
-- view again (CREATE OR REPLACE VIEW).
CREATE ALGORITHM = MERGE VIEW idempotency_key_states AS
SELECT
    CASE
        WHEN k.finished_at IS NOT NULL THEN
            CASE
                WHEN k.error IS NOT NULL THEN 'errored'
                WHEN k.expires_at <= UTC_TIMESTAMP(6) THEN 'expired'
                WHEN coalesce(k.response_status, 500) < 400 THEN 'complete'
                ELSE 'failed'
            END
        WHEN k.locked_at + INTERVAL k.lock_timeout MICROSECOND > UTC_TIMESTAMP(6)
            THEN 'processing'
        WHEN k.expires_at <= UTC_TIMESTAMP(6) THEN 'expired'
        ELSE 'pending'
    END AS state,
    k.*
FROM idempotency_keys AS k;

-- Jobs staged by a phase, committed with it (R7).
CREATE TABLE idempotence_staged_jobs (
    id          BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- The runner deduplicates deliveries by this key (see the PostgreSQL schema).
    job_key     VARCHAR(255)  NOT NULL UNIQUE,
    scope       VARCHAR(255)  NOT NULL,
    key_id      BIGINT        NOT NULL,
    name        VARCHAR(255)  NOT NULL,
    args        LONGTEXT      NOT NULL DEFAULT '{}',
    created_at  DATETIME(6)   NOT NULL DEFAULT UTC_TIMESTAMP(6)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- The built-in job runner's queue (B4), as in the PostgreSQL schema.
CREATE TABLE idempotence_jobs (
    id          BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job_key     VARCHAR(255)  NOT NULL UNIQUE,
    scope       VARCHAR(255)  NOT NULL,
    key_id      BIGINT        NOT NULL,
    name        VARCHAR(255)  NOT NULL,
    args        LONGTEXT      NOT NULL DEFAULT '{}',
    -- ready: waiting or running (run_at is then the end of the runner's lease);
    -- done: ran to the end; dead: failed too often, left for a human.
    status      VARCHAR(16)   NOT NULL DEFAULT 'ready',
    attempts    INT           NOT NULL DEFAULT 0,
    run_at      DATETIME(6)   NOT NULL DEFAULT UTC_TIMESTAMP(6),
    last_error  TEXT          NULL,
    created_at  DATETIME(6)   NOT NULL DEFAULT UTC_TIMESTAMP(6),
    finished_at DATETIME(6)   NULL,
    CONSTRAINT idempotence_jobs_status CHECK (status IN ('ready', 'done', 'dead')),
    INDEX idempotence_jobs_ready_idx (status, run_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;
