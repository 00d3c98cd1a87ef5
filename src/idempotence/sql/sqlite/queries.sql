-- Every statement the SQLite store runs on the key table, one named query each.
-- Every statement filters on scope (DESIGN 8; tests/test_sql.py checks it).
--
-- Times are REAL seconds since the Unix epoch from SQLite's own clock:
--     (julianday('now') - 2440587.5) * 86400.0
-- SQLite 3.40 has no unixepoch('subsec'); julianday keeps milliseconds. 'now' is
-- stable within one statement.
--
-- SQLite serialises writers, so the claim is one BEGIN IMMEDIATE transaction (P6's
-- "one serializable transaction"): claim_insert, which takes a new key; for a key that
-- exists, claim_read, then claim_take_over if states.arbitrate decides so.

-- claim_read --
SELECT (julianday('now') - 2440587.5) * 86400.0 AS db_now, k.*
FROM idempotency_keys AS k
WHERE k.scope = :scope AND k.key = :key;

-- claim_insert --
-- A new key (P1), or no row when the key exists: the caller then reads it. Most claims
-- that get this far take a new key, so they need no read first. The key is looked
-- for before the INSERT, not left to ON CONFLICT alone: an INSERT that conflicts still
-- writes (it takes an AUTOINCREMENT id), and a replay must write nothing.
INSERT INTO idempotency_keys (
    scope, key, request_method, request_path, fingerprint, request_params,
    flow, lock_timeout, locked_at, last_run_at, created_at, expires_at
)
SELECT
    :scope, :key, :method, :path, :fingerprint, :params,
    :flow, :lock_timeout,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0 + :retention
WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys WHERE scope = :scope AND key = :key)
ON CONFLICT (scope, key) DO NOTHING
RETURNING (julianday('now') - 2440587.5) * 86400.0 AS db_now, *;

-- claim_insert_finished --
-- claim_insert for a run whose response is known before it runs (see claim_finished
-- in the PostgreSQL queries): the new key written finished with it, in the claim's
-- transaction. The retention runs from the finish, as finish's does.
INSERT INTO idempotency_keys (
    scope, key, request_method, request_path, fingerprint, request_params,
    flow, lock_timeout, last_run_at, created_at, expires_at, recovery_point,
    response_status, response_headers, response_body, finished_at
)
SELECT
    :scope, :key, :method, :path, :fingerprint, :params,
    :flow, :lock_timeout,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0 + :retention,
    'finished', :status, :headers, :body,
    (julianday('now') - 2440587.5) * 86400.0
WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys WHERE scope = :scope AND key = :key)
ON CONFLICT (scope, key) DO NOTHING
RETURNING (julianday('now') - 2440587.5) * 86400.0 AS db_now, *;

-- claim_take_over --
-- P5: a new lock and a new fencing token (F1).
UPDATE idempotency_keys
SET lock_token = lock_token + 1,
    locked_at = (julianday('now') - 2440587.5) * 86400.0,
    lock_timeout = :lock_timeout,
    last_run_at = (julianday('now') - 2440587.5) * 86400.0
WHERE scope = :scope AND id = :id
RETURNING (julianday('now') - 2440587.5) * 86400.0 AS db_now, *;

-- checkpoint --
-- Fenced by the lock token (F1); see the PostgreSQL twin for why it also refreshes
-- the lock, and for calling (R6).
UPDATE idempotency_keys
SET recovery_point = :recovery_point,
    calling = :calling,
    locked_at = (julianday('now') - 2440587.5) * 86400.0,
    last_run_at = (julianday('now') - 2440587.5) * 86400.0
WHERE scope = :scope AND id = :id AND lock_token = :token
  AND finished_at IS NULL
RETURNING lock_token;

-- finish --
-- The retention window restarts at the finish (expires_at - created_at is the
-- retention the claim set).
UPDATE idempotency_keys
SET recovery_point = 'finished',
    calling = NULL,
    response_status = :status,
    response_headers = :headers,
    response_body = :body,
    error = :error,
    finished_at = (julianday('now') - 2440587.5) * 86400.0,
    locked_at = NULL,
    expires_at = (julianday('now') - 2440587.5) * 86400.0 + (expires_at - created_at)
WHERE scope = :scope AND id = :id AND lock_token = :token
  AND finished_at IS NULL
RETURNING id;

-- release --
UPDATE idempotency_keys
SET locked_at = NULL
WHERE scope = :scope AND id = :id AND lock_token = :token
  AND finished_at IS NULL
RETURNING id;

-- heartbeat --
UPDATE idempotency_keys
SET locked_at = (julianday('now') - 2440587.5) * 86400.0
WHERE scope = :scope AND id = :id AND lock_token = :token
  AND finished_at IS NULL AND locked_at IS NOT NULL
RETURNING locked_at;

-- get --
-- The key, and the database clock read with it: key_status names the key's state
-- (expired past expires_at) on that clock, in the same statement.
SELECT (julianday('now') - 2440587.5) * 86400.0 AS db_now, k.*
FROM idempotency_keys AS k
WHERE k.scope = :scope AND k.key = :key;

-- migrations_prepare --
-- The migrating transaction is BEGIN IMMEDIATE: that is the lock.
CREATE TABLE IF NOT EXISTS idempotence_migrations (
    version    TEXT PRIMARY KEY,
    applied_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

-- migrations_applied --
SELECT version FROM idempotence_migrations ORDER BY version;

-- migrations_record --
INSERT INTO idempotence_migrations (version) VALUES (:version);

-- stage_job --
INSERT INTO idempotence_staged_jobs (job_key, scope, key_id, name, args, created_at)
VALUES (:job_key, :scope, :key_id, :name, :args, (julianday('now') - 2440587.5) * 86400.0);

-- take_staged_jobs --
-- SQLite has one writer at a time, so the caller's write transaction is the lock.
DELETE FROM idempotence_staged_jobs
WHERE id IN (SELECT id FROM idempotence_staged_jobs ORDER BY id LIMIT :limit)
RETURNING id, job_key, scope, key_id, name, args, created_at;

-- forget --
DELETE FROM idempotency_keys
WHERE scope = :scope AND id = :id AND lock_token = :token
  AND recovery_point = 'started' AND finished_at IS NULL
RETURNING id;

-- == maintenance (cross-scope) ==
-- The background services and the operator's commands (DESIGN 7, F5); see the
-- PostgreSQL twin for what each does. Most look for work across every scope and say
-- why under their header. SQLite has one writer at a time, so a batch needs no SKIP
-- LOCKED: the maintenance transaction (BEGIN IMMEDIATE) is the lock, and a second
-- node's batch starts after the first one's commit and sees its changes. RETURNING
-- comes back in no particular order; the caller sorts.

-- maintenance_timeout --
-- SQLite has no statement timeout; the busy timeout already bounds the wait for the
-- write lock. The statement exists so both dialects run the same operations.
SELECT :timeout_ms AS timeout_ms;

-- db_now --
SELECT (julianday('now') - 2440587.5) * 86400.0 AS db_now;

-- sweep_expired_locks --
-- cross-scope: the sweeper looks for expired locks in every scope (B1).
UPDATE idempotency_keys
SET lock_token = lock_token + 1,
    locked_at = NULL
WHERE id IN (
    SELECT id
    FROM idempotency_keys
    WHERE locked_at IS NOT NULL AND finished_at IS NULL
      AND locked_at + lock_timeout <= (julianday('now') - 2440587.5) * 86400.0
    ORDER BY locked_at
    LIMIT :limit
)
RETURNING id, scope, key, flow, recovery_point, lock_token, NULL AS held_since;

-- pick_abandoned --
-- cross-scope: the completer looks for abandoned keys in every scope (B2).
UPDATE idempotency_keys
SET completer_attempts = completer_attempts + 1,
    last_run_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id IN (
    SELECT id
    FROM idempotency_keys
    WHERE finished_at IS NULL
      AND (locked_at IS NULL
           OR locked_at + lock_timeout <= (julianday('now') - 2440587.5) * 86400.0)
      AND (expires_at IS NULL OR expires_at > (julianday('now') - 2440587.5) * 86400.0)
      AND coalesce(last_run_at, created_at) <= :since - :grace
      AND flow IN (SELECT value FROM json_each(:flows))
    ORDER BY last_run_at, id
    LIMIT :limit
)
RETURNING (julianday('now') - 2440587.5) * 86400.0 AS db_now, *;

-- reset_completer_attempts --
-- A resumed flow that paused (a phase returned NoOp) made progress rather than
-- failing: its attempts start again, so a flow that waits is not mistaken for one
-- that keeps failing.
UPDATE idempotency_keys
SET completer_attempts = 0
WHERE scope = :scope AND id = :id AND finished_at IS NULL
RETURNING id;

-- abandoned_unregistered --
-- cross-scope: the completer reports abandoned keys in every scope (B2).
SELECT flow, count(*) AS keys
FROM idempotency_keys
WHERE finished_at IS NULL
  AND (locked_at IS NULL
       OR locked_at + lock_timeout <= (julianday('now') - 2440587.5) * 86400.0)
  AND (expires_at IS NULL OR expires_at > (julianday('now') - 2440587.5) * 86400.0)
  AND coalesce(last_run_at, created_at) <= :since - :grace
  AND flow NOT IN (SELECT value FROM json_each(:flows))
GROUP BY flow
ORDER BY flow;

-- expire_pending --
-- cross-scope: the reaper expires keys in every scope (B3).
UPDATE idempotency_keys
SET recovery_point = 'finished',
    response_status = :status,
    response_headers = :headers,
    response_body = :body,
    error = NULL,
    finished_at = (julianday('now') - 2440587.5) * 86400.0,
    locked_at = NULL,
    expires_at = (julianday('now') - 2440587.5) * 86400.0 + (expires_at - created_at)
WHERE id IN (
    SELECT id
    FROM idempotency_keys
    WHERE finished_at IS NULL
      AND expires_at <= (julianday('now') - 2440587.5) * 86400.0
      AND (locked_at IS NULL
           OR locked_at + lock_timeout <= (julianday('now') - 2440587.5) * 86400.0)
    LIMIT :limit
)
RETURNING id, scope, key, flow;

-- reap_finished --
-- cross-scope: the reaper deletes expired keys in every scope (B3).
-- SQLite cannot count a DELETE in a CTE: one row per deleted key comes back instead
-- (in process, that costs next to nothing).
DELETE FROM idempotency_keys
WHERE id IN (
    SELECT id
    FROM idempotency_keys
    WHERE finished_at IS NOT NULL AND error IS NULL AND locked_at IS NULL
      AND expires_at <= (julianday('now') - 2440587.5) * 86400.0
    ORDER BY expires_at
    LIMIT :limit
)
RETURNING 1 AS deleted;

-- deliver_job --
INSERT INTO idempotence_jobs (job_key, scope, key_id, name, args, run_at, created_at)
VALUES (
    :job_key, :scope, :key_id, :name, :args,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0
)
ON CONFLICT (job_key) DO NOTHING
RETURNING id;

-- pick_jobs --
UPDATE idempotence_jobs
SET attempts = attempts + 1,
    run_at = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE id IN (
    SELECT id
    FROM idempotence_jobs
    WHERE status = 'ready' AND run_at <= (julianday('now') - 2440587.5) * 86400.0
      AND name IN (SELECT value FROM json_each(:names))
    ORDER BY run_at, id
    LIMIT :limit
)
RETURNING id, job_key, scope, key_id, name, args, attempts, created_at;

-- job_done --
UPDATE idempotence_jobs
SET status = 'done', finished_at = (julianday('now') - 2440587.5) * 86400.0, last_error = NULL
WHERE id = :id AND attempts = :attempts AND status = 'ready'
RETURNING id;

-- job_failed --
UPDATE idempotence_jobs
SET status = CASE WHEN attempts >= :max_attempts THEN 'dead' ELSE 'ready' END,
    run_at = (julianday('now') - 2440587.5) * 86400.0 + :backoff,
    last_error = :error,
    finished_at = CASE
        WHEN attempts >= :max_attempts THEN (julianday('now') - 2440587.5) * 86400.0
    END
WHERE id = :id AND attempts = :attempts AND status = 'ready'
RETURNING status;

-- list_keys --
-- cross-scope: the operator lists keys of every scope unless given one (F5).
-- The CASE is states.key_state, as in the PostgreSQL twin.
WITH clock AS (SELECT (julianday('now') - 2440587.5) * 86400.0 AS db_now)
SELECT *
FROM (
    SELECT clock.db_now,
        CASE
            WHEN k.finished_at IS NOT NULL THEN
                CASE
                    WHEN k.error IS NOT NULL THEN 'errored'
                    WHEN k.expires_at <= clock.db_now THEN 'expired'
                    WHEN coalesce(k.response_status, 500) < 400 THEN 'complete'
                    ELSE 'failed'
                END
            WHEN k.locked_at + k.lock_timeout > clock.db_now THEN 'processing'
            WHEN k.expires_at <= clock.db_now THEN 'expired'
            ELSE 'pending'
        END AS state,
        k.*
    FROM idempotency_keys AS k, clock
    WHERE (:scope IS NULL OR k.scope = :scope)
      AND (:key IS NULL OR k.key = :key)
) AS keyed
WHERE :state IS NULL OR keyed.state = :state
ORDER BY keyed.created_at DESC, keyed.id DESC
LIMIT :limit;

-- key_stats --
-- cross-scope: the operator's counts cover every scope unless given one (F5).
WITH clock AS (SELECT (julianday('now') - 2440587.5) * 86400.0 AS db_now)
SELECT min(db_now) AS db_now, state, count(*) AS keys, min(created_at) AS oldest,
    sum(lock_token - 1) AS takeovers
FROM (
    SELECT clock.db_now,
        CASE
            WHEN k.finished_at IS NOT NULL THEN
                CASE
                    WHEN k.error IS NOT NULL THEN 'errored'
                    WHEN k.expires_at <= clock.db_now THEN 'expired'
                    WHEN coalesce(k.response_status, 500) < 400 THEN 'complete'
                    ELSE 'failed'
                END
            WHEN k.locked_at + k.lock_timeout > clock.db_now THEN 'processing'
            WHEN k.expires_at <= clock.db_now THEN 'expired'
            ELSE 'pending'
        END AS state,
        k.created_at,
        k.lock_token
    FROM idempotency_keys AS k, clock
    WHERE :scope IS NULL OR k.scope = :scope
) AS keyed
GROUP BY state;

-- job_stats --
SELECT 'staged' AS status, count(*) AS jobs FROM idempotence_staged_jobs
UNION ALL
SELECT status, count(*) AS jobs FROM idempotence_jobs GROUP BY status;

-- evict_key --
DELETE FROM idempotency_keys
WHERE scope = :scope AND key = :key AND id = :id
  AND (:force
       OR locked_at IS NULL
       OR locked_at + lock_timeout <= (julianday('now') - 2440587.5) * 86400.0)
RETURNING id;
