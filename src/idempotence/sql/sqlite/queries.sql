-- Every statement the SQLite store runs on the key table, one named query each.
-- Every statement filters on scope (DESIGN 8; tests/test_sql.py checks it).
--
-- Times are REAL seconds since the Unix epoch from SQLite's own clock:
--     (julianday('now') - 2440587.5) * 86400.0
-- SQLite 3.40 has no unixepoch('subsec'); julianday keeps milliseconds. 'now' is
-- stable within one statement.
--
-- SQLite serialises writers, so the claim is one BEGIN IMMEDIATE transaction (P6's
-- "one serializable transaction"): claim_read, then claim_insert or claim_take_over
-- as states.arbitrate decides.

-- claim_read --
SELECT (julianday('now') - 2440587.5) * 86400.0 AS db_now, k.*
FROM idempotency_keys AS k
WHERE k.scope = :scope AND k.key = :key;

-- claim_insert --
INSERT INTO idempotency_keys (
    scope, key, request_method, request_path, fingerprint, request_params,
    flow, lock_timeout, locked_at, last_run_at, created_at, expires_at
)
VALUES (
    :scope, :key, :method, :path, :fingerprint, :params,
    :flow, :lock_timeout,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0,
    (julianday('now') - 2440587.5) * 86400.0 + :retention
)
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
-- the lock.
UPDATE idempotency_keys
SET recovery_point = :recovery_point,
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
