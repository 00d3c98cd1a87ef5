-- Every statement the PostgreSQL store runs on the key table, one named query each.
-- Every statement filters on scope, so the table can be distributed by scope
-- (DESIGN 8); tests/test_sql.py checks it. Times come from the database clock:
-- now() for the claim (its own transaction), statement_timestamp() inside a caller's
-- transaction, where now() would be the transaction's start.

-- claim --
-- Insert the key, or take over an existing one whose lock is free or expired
-- (P1, P5), in ONE statement: the unique constraint arbitrates, never a prior SELECT
-- (P6). The takeover predicate in the WHERE clause is states.arbitrate's P5 rule.
-- When the existing row may not be taken, ON CONFLICT leaves it unchanged and the
-- second branch returns it for the caller to classify (P2-P4). If a concurrent
-- transaction committed the row after this statement's snapshot, the second branch
-- cannot see it and the statement returns no row, or an older version of it: the
-- caller notices (no row, or a row the state machine would have taken) and runs the
-- statement again.
WITH claimed AS (
    INSERT INTO idempotency_keys AS k (
        scope, key, request_method, request_path, fingerprint, request_params,
        flow, lock_timeout, locked_at, last_run_at, expires_at
    )
    VALUES (
        %(scope)s, %(key)s, %(method)s, %(path)s, %(fingerprint)s, %(params)s::jsonb,
        %(flow)s, %(lock_timeout)s, now(), now(), now() + %(retention)s::interval
    )
    ON CONFLICT (scope, key) DO UPDATE
        SET lock_token = k.lock_token + 1,
            locked_at = now(),
            lock_timeout = EXCLUDED.lock_timeout,
            last_run_at = now()
        WHERE k.fingerprint = EXCLUDED.fingerprint
          AND k.finished_at IS NULL
          AND (k.locked_at IS NULL OR k.locked_at + k.lock_timeout <= now())
    RETURNING k.*
)
SELECT true AS claimed, now() AS db_now, claimed.* FROM claimed
UNION ALL
SELECT false AS claimed, now() AS db_now, k.*
FROM idempotency_keys AS k
WHERE k.scope = %(scope)s AND k.key = %(key)s AND NOT EXISTS (SELECT FROM claimed);

-- checkpoint --
-- Advance the recovery point, fenced by the lock token (F1). It is the last
-- statement of the phase's transaction: no row back means another worker took the
-- key over, and the caller rolls the whole phase back. Committing a phase also proves
-- the holder alive, so the lock is refreshed.
UPDATE idempotency_keys
SET recovery_point = %(recovery_point)s,
    locked_at = statement_timestamp(),
    last_run_at = statement_timestamp()
WHERE scope = %(scope)s AND id = %(id)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING lock_token;

-- finish --
-- Store the response and unlock, fenced (F1). The retention window restarts at the
-- finish, so a key finished late by the completer is still replayable for as long as
-- one finished at once (expires_at - created_at is the retention the claim set).
UPDATE idempotency_keys
SET recovery_point = 'finished',
    response_status = %(status)s,
    response_headers = %(headers)s::jsonb,
    response_body = %(body)s,
    error = %(error)s,
    finished_at = statement_timestamp(),
    locked_at = NULL,
    expires_at = statement_timestamp() + (expires_at - created_at)
WHERE scope = %(scope)s AND id = %(id)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING id;

-- release --
-- Unlock without finishing (R5): the next claim resumes from the recovery point.
UPDATE idempotency_keys
SET locked_at = NULL
WHERE scope = %(scope)s AND id = %(id)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING id;

-- heartbeat --
-- Extend a live lock (F2), fenced like every write of the holder.
UPDATE idempotency_keys
SET locked_at = statement_timestamp()
WHERE scope = %(scope)s AND id = %(id)s AND lock_token = %(token)s
  AND finished_at IS NULL AND locked_at IS NOT NULL
RETURNING locked_at;

-- get --
SELECT now() AS db_now, k.*
FROM idempotency_keys AS k
WHERE k.scope = %(scope)s AND k.key = %(key)s;

-- migrations_prepare --
-- Migrations run one at a time across every process: the advisory lock is held
-- until the migrating transaction ends.
SELECT pg_advisory_xact_lock(7294158301);
CREATE TABLE IF NOT EXISTS idempotence_migrations (
    version    text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- migrations_applied --
SELECT version FROM idempotence_migrations ORDER BY version;

-- migrations_record --
INSERT INTO idempotence_migrations (version) VALUES (%(version)s);

-- stage_job --
-- Inside the phase's transaction, before its checkpoint: the job commits with the
-- phase or not at all (R7). Not the key table: no scope routing needed.
INSERT INTO idempotence_staged_jobs (job_key, scope, key_id, name, args)
VALUES (%(job_key)s, %(scope)s, %(key_id)s, %(name)s, %(args)s::jsonb);

-- take_staged_jobs --
-- The enqueuer's batch: deleted in the caller's transaction, which commits only once
-- the jobs are delivered. SKIP LOCKED lets several enqueuers share the table.
DELETE FROM idempotence_staged_jobs
WHERE id IN (
    SELECT id FROM idempotence_staged_jobs
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, job_key, scope, key_id, name, args, created_at;

-- forget --
-- R5: a request rejected before its first phase committed leaves nothing stored, so
-- the client may correct it and retry with the same key. Fenced, and only at
-- 'started', when nothing else can refer to the row.
DELETE FROM idempotency_keys
WHERE scope = %(scope)s AND id = %(id)s AND lock_token = %(token)s
  AND recovery_point = 'started' AND finished_at IS NULL
RETURNING id;
