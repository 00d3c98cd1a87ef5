-- Every statement the MariaDB store runs, one named query each, with pyformat
-- parameters (PyMySQL and aiomysql interpolate them on the client; a list becomes
-- (a, b, c)). Every statement on one key filters on scope (DESIGN 8).
--
-- Times are DATETIME(6) in UTC from the server's clock, UTC_TIMESTAMP(6), which is
-- fixed for the length of one statement; durations are BIGINT microseconds.
--
-- MariaDB 10.6+ has INSERT ... RETURNING and DELETE ... RETURNING, but no UPDATE ...
-- RETURNING and no LISTEN. So a query here may be a short script of statements, each
-- ending with a semicolon at the end of its line, which the store runs in order in
-- the caller's transaction (stores/mariadb/_steps.py):
--   * a write that matches no row ends the query with no rows (the connection asks
--     for found rows, not changed rows: a fenced write of unchanged values counts);
--   * a SELECT that finds nothing ends it with no rows too, and %(selected)s in the
--     statements after it is the list of the ids it found;
--   * the query's rows are those of its last statement that returns rows;
--   * an UPDATE ending with RETURNING reads those columns back from its one row, by
--     the id its WHERE starts with (scope = %(scope)s AND id = %(id)s, or id = %(id)s)
--     in the same transaction, once the UPDATE matched it.
-- MariaDB evaluates the assignments of an UPDATE from left to right, each seeing the
-- ones before: no SET here reads a column an earlier assignment changed.
--
-- The claim is one write transaction that retries (P6's "one serializable
-- transaction"): claim_read locks the key's row, or the gap where it would go
-- (FOR UPDATE reads the latest committed version, whatever the isolation); a key it
-- found is decided by states.arbitrate and taken over by claim_take_over if it may
-- be; one it did not find is inserted by claim_insert. The unique constraint decides
-- a race for a new key: the loser's INSERT waits for the winner, then fails with a
-- deadlock or a duplicate, and the loser's transaction runs again and reads the key.

-- claim_read --
SELECT *, UTC_TIMESTAMP(6) AS db_now
FROM idempotency_keys
WHERE scope = %(scope)s AND `key` = %(key)s
FOR UPDATE;

-- claim_insert --
-- A new key (P1), after claim_read found none: a plain INSERT ... VALUES, which takes
-- InnoDB's AUTO_INCREMENT lock only for a moment. (An INSERT ... SELECT that looked
-- for the key itself would hold that table-wide lock to the end of the statement,
-- waiting for a row another transaction holds: every new key would wait behind it.)
INSERT INTO idempotency_keys (
    scope, `key`, request_method, request_path, fingerprint, request_params,
    flow, lock_timeout, locked_at, last_run_at, created_at, expires_at
)
VALUES (
    %(scope)s, %(key)s, %(method)s, %(path)s, %(fingerprint)s, %(params)s,
    %(flow)s, %(lock_timeout)s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    UTC_TIMESTAMP(6) + INTERVAL %(retention)s MICROSECOND
)
RETURNING *, UTC_TIMESTAMP(6) AS db_now;

-- claim_insert_finished --
-- claim_insert for a run whose response is known before it runs (see claim_finished
-- in the PostgreSQL queries): the new key written finished with it, in the claim's
-- transaction. The retention runs from the finish, as finish's does.
INSERT INTO idempotency_keys (
    scope, `key`, request_method, request_path, fingerprint, request_params,
    flow, lock_timeout, last_run_at, created_at, expires_at, recovery_point,
    response_status, response_headers, response_body, finished_at
)
VALUES (
    %(scope)s, %(key)s, %(method)s, %(path)s, %(fingerprint)s, %(params)s,
    %(flow)s, %(lock_timeout)s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    UTC_TIMESTAMP(6) + INTERVAL %(retention)s MICROSECOND, 'finished',
    %(status)s, %(headers)s, %(body)s, UTC_TIMESTAMP(6)
)
RETURNING *, UTC_TIMESTAMP(6) AS db_now;

-- claim_take_over --
-- P5: a new lock and a new fencing token (F1), on the row claim_read locked.
UPDATE idempotency_keys
SET lock_token = lock_token + 1,
    locked_at = UTC_TIMESTAMP(6),
    lock_timeout = %(lock_timeout)s,
    last_run_at = UTC_TIMESTAMP(6)
WHERE scope = %(scope)s AND id = %(id)s
RETURNING *, UTC_TIMESTAMP(6) AS db_now;

-- claim_held --
-- The claim of a key whose row another request's open transaction holds (F3, F8):
-- a plain read, which InnoDB answers from the latest committed version without
-- waiting for the holder. Always one row; with no key committed yet, id is NULL.
SELECT k.*, UTC_TIMESTAMP(6) AS db_now
FROM (SELECT 1 AS one) AS o
LEFT JOIN idempotency_keys AS k ON k.scope = %(scope)s AND k.`key` = %(key)s;

-- checkpoint --
-- Fenced by the lock token (F1); see the PostgreSQL twin for why it also refreshes
-- the lock, and for calling (R6).
UPDATE idempotency_keys
SET recovery_point = %(recovery_point)s,
    calling = %(calling)s,
    locked_at = UTC_TIMESTAMP(6),
    last_run_at = UTC_TIMESTAMP(6)
WHERE scope = %(scope)s AND id = %(id)s AND `key` = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING lock_token;

-- finish --
-- Store the response and unlock, fenced (F1). The retention window restarts at the
-- finish (expires_at - created_at is the retention the claim set).
UPDATE idempotency_keys
SET recovery_point = 'finished',
    calling = NULL,
    response_status = %(status)s,
    response_headers = %(headers)s,
    response_body = %(body)s,
    error = %(error)s,
    finished_at = UTC_TIMESTAMP(6),
    locked_at = NULL,
    expires_at = UTC_TIMESTAMP(6)
        + INTERVAL TIMESTAMPDIFF(MICROSECOND, created_at, expires_at) MICROSECOND
WHERE scope = %(scope)s AND id = %(id)s AND `key` = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING id;

-- release --
-- Unlock without finishing (R5): the next claim resumes from the recovery point.
UPDATE idempotency_keys
SET locked_at = NULL
WHERE scope = %(scope)s AND id = %(id)s AND `key` = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING id;

-- heartbeat --
-- Extend a live lock (F2), fenced; a released lock stays released.
UPDATE idempotency_keys
SET locked_at = UTC_TIMESTAMP(6)
WHERE scope = %(scope)s AND id = %(id)s AND `key` = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL AND locked_at IS NOT NULL
RETURNING locked_at;

-- get --
-- The key, and the database clock read with it: key_status names the key's state
-- (expired past expires_at) on that clock, in the same statement.
SELECT *, UTC_TIMESTAMP(6) AS db_now
FROM idempotency_keys
WHERE scope = %(scope)s AND `key` = %(key)s;

-- migrations_prepare --
-- MariaDB commits every DDL statement at once, so a migration is not one
-- transaction: the store serialises migrators with a named lock instead (GET_LOCK,
-- see MariaDBStore.migrate), and each migration creates what does not exist yet.
CREATE TABLE IF NOT EXISTS idempotence_migrations (
    version    VARCHAR(64) NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_nopad_bin;

-- migrations_applied --
SELECT version FROM idempotence_migrations ORDER BY version;

-- migrations_record --
INSERT INTO idempotence_migrations (version) VALUES (%(version)s);

-- migrations_lock --
-- The migrators' named lock, held by the connection until released (or closed).
SELECT GET_LOCK('idempotence_migrations', %(seconds)s) AS locked;

-- migrations_unlock --
SELECT RELEASE_LOCK('idempotence_migrations') AS released;

-- stage_job --
INSERT INTO idempotence_staged_jobs (job_key, scope, key_id, name, args)
VALUES (%(job_key)s, %(scope)s, %(key_id)s, %(name)s, %(args)s);

-- take_staged_jobs --
-- The rows are locked, skipping those another enqueuer has, then deleted.
SELECT id, job_key, scope, key_id, name, args, created_at
FROM idempotence_staged_jobs
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
DELETE FROM idempotence_staged_jobs WHERE id IN %(selected)s;

-- forget --
DELETE FROM idempotency_keys
WHERE scope = %(scope)s AND id = %(id)s AND `key` = %(key)s AND lock_token = %(token)s
  AND recovery_point = 'started' AND finished_at IS NULL
RETURNING id;

-- == maintenance (cross-scope) ==
-- The background services and the operator's commands (DESIGN 7, F5); see the
-- PostgreSQL twin for what each does. A batch is picked with FOR UPDATE SKIP LOCKED
-- (another node's batch, or a request's open transaction, is skipped, not waited
-- for), then written by id.

-- maintenance_timeout --
-- Not bounded on MariaDB: its statement time limit would stay set on the pooled
-- connection. The batches skip locked rows, so they do not wait on requests. The
-- statement exists so all dialects run the same operations.
SELECT %(timeout_ms)s AS timeout_ms;

-- db_now --
SELECT UTC_TIMESTAMP(6) AS db_now;

-- sweep_expired_locks --
-- cross-scope: the sweeper looks for expired locks in every scope (B1).
SELECT id, scope, `key`, flow, recovery_point, lock_token + 1 AS lock_token,
    locked_at AS held_since
FROM idempotency_keys
WHERE locked_at IS NOT NULL AND finished_at IS NULL
  AND locked_at + INTERVAL lock_timeout MICROSECOND <= UTC_TIMESTAMP(6)
ORDER BY locked_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
UPDATE idempotency_keys
SET lock_token = lock_token + 1,
    locked_at = NULL
WHERE id IN %(selected)s;

-- pick_abandoned --
-- cross-scope: the completer looks for abandoned keys in every scope (B2).
SELECT id
FROM idempotency_keys
WHERE finished_at IS NULL
  AND (locked_at IS NULL OR locked_at + INTERVAL lock_timeout MICROSECOND <= UTC_TIMESTAMP(6))
  AND (expires_at IS NULL OR expires_at > UTC_TIMESTAMP(6))
  AND coalesce(last_run_at, created_at)
      <= CAST(%(since)s AS DATETIME(6)) - INTERVAL %(grace)s MICROSECOND
  AND JSON_CONTAINS(%(flows)s, JSON_QUOTE(flow))
ORDER BY last_run_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
UPDATE idempotency_keys
SET completer_attempts = completer_attempts + 1,
    last_run_at = UTC_TIMESTAMP(6)
WHERE id IN %(selected)s;
SELECT *, UTC_TIMESTAMP(6) AS db_now FROM idempotency_keys WHERE id IN %(selected)s;

-- reset_completer_attempts --
-- A resumed flow that paused (a phase returned NoOp) made progress rather than
-- failing: its attempts start again.
UPDATE idempotency_keys
SET completer_attempts = 0
WHERE scope = %(scope)s AND id = %(id)s AND `key` = %(key)s AND finished_at IS NULL
RETURNING id;

-- abandoned_unregistered --
-- cross-scope: the completer reports abandoned keys in every scope (B2).
SELECT flow, count(*) AS `keys`
FROM idempotency_keys
WHERE finished_at IS NULL
  AND (locked_at IS NULL OR locked_at + INTERVAL lock_timeout MICROSECOND <= UTC_TIMESTAMP(6))
  AND (expires_at IS NULL OR expires_at > UTC_TIMESTAMP(6))
  AND coalesce(last_run_at, created_at)
      <= CAST(%(since)s AS DATETIME(6)) - INTERVAL %(grace)s MICROSECOND
  AND NOT JSON_CONTAINS(%(flows)s, JSON_QUOTE(flow))
GROUP BY flow
ORDER BY flow;

-- expire_pending --
-- cross-scope: the reaper expires keys in every scope (B3).
SELECT id, scope, `key`, flow
FROM idempotency_keys
WHERE finished_at IS NULL
  AND expires_at <= UTC_TIMESTAMP(6)
  AND (locked_at IS NULL OR locked_at + INTERVAL lock_timeout MICROSECOND <= UTC_TIMESTAMP(6))
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
UPDATE idempotency_keys
SET recovery_point = 'finished',
    response_status = %(status)s,
    response_headers = %(headers)s,
    response_body = %(body)s,
    error = NULL,
    finished_at = UTC_TIMESTAMP(6),
    locked_at = NULL,
    expires_at = UTC_TIMESTAMP(6)
        + INTERVAL TIMESTAMPDIFF(MICROSECOND, created_at, expires_at) MICROSECOND
WHERE id IN %(selected)s;

-- reap_finished --
-- cross-scope: the reaper deletes expired keys in every scope (B3).
-- One row per deleted key comes back (the caller adds them up).
SELECT id
FROM idempotency_keys
WHERE finished_at IS NOT NULL AND error IS NULL AND locked_at IS NULL
  AND expires_at <= UTC_TIMESTAMP(6)
ORDER BY expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
DELETE FROM idempotency_keys WHERE id IN %(selected)s RETURNING 1 AS deleted;

-- deliver_job --
-- The built-in runner's delivery (B4): a repeated job_key inserts nothing. The key is
-- looked for by a plain read, which takes no lock: a locking read (or an INSERT ...
-- SELECT) would lock the gaps of the job_key index, and two enqueuers delivering
-- different jobs would deadlock on them. The first statement returns a row only when
-- the job is new; a race to insert the same job fails on the unique job_key and the
-- store runs the delivery again.
SELECT 1 AS new_job
FROM DUAL
WHERE NOT EXISTS (SELECT 1 FROM idempotence_jobs WHERE job_key = %(job_key)s);
INSERT INTO idempotence_jobs (job_key, scope, key_id, name, args)
VALUES (%(job_key)s, %(scope)s, %(key_id)s, %(name)s, %(args)s)
RETURNING id;

-- pick_jobs --
SELECT id
FROM idempotence_jobs
WHERE status = 'ready' AND run_at <= UTC_TIMESTAMP(6)
  AND JSON_CONTAINS(%(names)s, JSON_QUOTE(name))
ORDER BY run_at, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
UPDATE idempotence_jobs
SET attempts = attempts + 1,
    run_at = UTC_TIMESTAMP(6) + INTERVAL %(lease)s MICROSECOND
WHERE id IN %(selected)s;
SELECT id, job_key, scope, key_id, name, args, attempts, created_at
FROM idempotence_jobs
WHERE id IN %(selected)s;

-- job_done --
UPDATE idempotence_jobs
SET status = 'done', finished_at = UTC_TIMESTAMP(6), last_error = NULL
WHERE id = %(id)s AND attempts = %(attempts)s AND status = 'ready'
RETURNING id;

-- job_failed --
-- status is assigned last: the CASEs before it read the attempts, not the status.
UPDATE idempotence_jobs
SET run_at = UTC_TIMESTAMP(6) + INTERVAL %(backoff)s MICROSECOND,
    last_error = %(error)s,
    finished_at = CASE WHEN attempts >= %(max_attempts)s THEN UTC_TIMESTAMP(6) END,
    status = CASE WHEN attempts >= %(max_attempts)s THEN 'dead' ELSE 'ready' END
WHERE id = %(id)s AND attempts = %(attempts)s AND status = 'ready'
RETURNING status;

-- list_keys --
-- cross-scope: the operator lists keys of every scope unless given one (F5).
-- The CASE is states.key_state, as in the PostgreSQL twin.
SELECT *
FROM (
    SELECT UTC_TIMESTAMP(6) AS db_now,
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
    FROM idempotency_keys AS k
    WHERE (%(scope)s IS NULL OR k.scope = %(scope)s)
      AND (%(key)s IS NULL OR k.`key` = %(key)s)
) AS keyed
WHERE %(state)s IS NULL OR keyed.state = %(state)s
ORDER BY keyed.created_at DESC, keyed.id DESC
LIMIT %(limit)s;

-- key_stats --
-- cross-scope: the operator's counts cover every scope unless given one (F5).
SELECT UTC_TIMESTAMP(6) AS db_now, state, count(*) AS `keys`, min(created_at) AS oldest,
    sum(lock_token - 1) AS takeovers
FROM (
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
        k.created_at,
        k.lock_token
    FROM idempotency_keys AS k
    WHERE %(scope)s IS NULL OR k.scope = %(scope)s
) AS keyed
GROUP BY state;

-- job_stats --
SELECT 'staged' AS status, count(*) AS jobs FROM idempotence_staged_jobs
UNION ALL
SELECT status, count(*) AS jobs FROM idempotence_jobs GROUP BY status;

-- evict_key --
-- The operator removes one key, by the id read before (see the PostgreSQL twin).
DELETE FROM idempotency_keys
WHERE scope = %(scope)s AND `key` = %(key)s AND id = %(id)s
  AND (%(force)s
       OR locked_at IS NULL
       OR locked_at + INTERVAL lock_timeout MICROSECOND <= UTC_TIMESTAMP(6))
RETURNING id;
