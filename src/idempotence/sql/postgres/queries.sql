-- Every statement the PostgreSQL store runs on the key table, one named query each.
-- Every statement filters on scope, so the table can be distributed by scope
-- (DESIGN 8); tests/test_sql.py checks it. Times come from the database clock:
-- now() for the claim (its own transaction), statement_timestamp() inside a caller's
-- transaction, where now() would be the transaction's start.
-- A statement on one key names both its id and its key when it knows both, and
-- implies no partial index's predicate, so that its generic plan is a lookup of one
-- row on a unique index whatever the table held when it was planned (see
-- SESSION_PLANNING in stores/postgres/_store_shared.py; tests/test_postgres_plans.py).

-- claim --
-- Insert the key, or take over an existing one whose lock is free or expired
-- (P1, P5), in ONE statement: the unique constraint arbitrates, never a prior SELECT
-- (P6). The takeover predicate in the WHERE clause is states.arbitrate's P5 rule.
-- When the existing row may not be taken, ON CONFLICT leaves it unchanged and the
-- last branch returns it for the caller to classify (P2-P4). If a concurrent
-- transaction committed the row after this statement's snapshot, the last branch
-- cannot see it and the statement returns no row, or an older version of it: the
-- caller notices (no row, or a row the state machine would have taken) and runs the
-- statement again.
-- A finished key is settled for good (P3: a replay, or P2: a mismatch), so when the
-- snapshot already shows it finished the INSERT is skipped: ON CONFLICT would lock the
-- row even to leave it unchanged, and that lock is a write whose commit waits for a
-- WAL flush. A replay then writes nothing. (A key the reaper deletes after the
-- snapshot is replayed once more, as a retry a moment earlier would have been.)
WITH settled AS (
    SELECT FROM idempotency_keys AS s
    WHERE s.scope = %(scope)s AND s.key = %(key)s AND s.finished_at IS NOT NULL
),
claimed AS (
    INSERT INTO idempotency_keys AS k (
        scope, key, request_method, request_path, fingerprint, request_params,
        flow, lock_timeout, locked_at, last_run_at, expires_at
    )
    SELECT
        %(scope)s, %(key)s, %(method)s, %(path)s, %(fingerprint)s, %(params)s::jsonb,
        %(flow)s, %(lock_timeout)s, now(), now(), now() + %(retention)s::interval
    WHERE NOT EXISTS (SELECT FROM settled)
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

-- claim_finished --
-- The claim of a run whose stored response is known before it runs (a transactional
-- consumer's acknowledgement, F3): the claim above, with the same rules and the same
-- shape (bounded_claim adds its settings as to the claim), that writes the key it takes
-- finished with that response at once. It always opens the run's transaction, so the
-- COMMIT settles the key with the run's own writes and a rollback takes it back with
-- them; the COMMIT then carries no finish, and the row is written once instead of
-- inserted, then updated (a second version, its index entries again). The columns are
-- what the finish would have set, at the transaction's time (now(), when the run
-- began). A takeover (P5) moves the lock token on, so the previous holder's fenced
-- writes are refused (F1), and wakes that key's waiting duplicates at the COMMIT (P10).
WITH settled AS (
    SELECT FROM idempotency_keys AS s
    WHERE s.scope = %(scope)s AND s.key = %(key)s AND s.finished_at IS NOT NULL
),
claimed AS (
    INSERT INTO idempotency_keys AS k (
        scope, key, request_method, request_path, fingerprint, request_params,
        flow, lock_timeout, last_run_at, expires_at, recovery_point,
        response_status, response_headers, response_body, finished_at
    )
    SELECT
        %(scope)s, %(key)s, %(method)s, %(path)s, %(fingerprint)s, %(params)s::jsonb,
        %(flow)s, %(lock_timeout)s, now(), now() + %(retention)s::interval, 'finished',
        %(status)s, %(headers)s::jsonb, %(body)s, now()
    WHERE NOT EXISTS (SELECT FROM settled)
    ON CONFLICT (scope, key) DO UPDATE
        SET lock_token = k.lock_token + 1,
            locked_at = NULL,
            lock_timeout = EXCLUDED.lock_timeout,
            last_run_at = now(),
            recovery_point = 'finished',
            calling = NULL,
            response_status = EXCLUDED.response_status,
            response_headers = EXCLUDED.response_headers,
            response_body = EXCLUDED.response_body,
            error = NULL,
            finished_at = now(),
            expires_at = now() + (k.expires_at - k.created_at),
            waiters = CASE
                WHEN NOT k.waiters THEN false
                WHEN octet_length(json_build_array(k.scope, k.key)::text) >= 8000 THEN false
                ELSE pg_notify('idempotence_settled', json_build_array(k.scope, k.key)::text)
                    IS NULL
            END
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

-- claim_batch --
-- Many claims of one scope as one statement (DESIGN 11: natural batching): the
-- claim above, a row of parameters each, the parameters as arrays unnested side by
-- side. batch_index says whose row is whose (1 for the first claim). Every claim
-- gets the row the single statement would have returned it, and the same rule holds
-- for a key that comes back with no row or a stale one: its caller runs the single
-- statement again. A key appears at most once per batch (ON CONFLICT DO UPDATE
-- cannot change a row twice in one statement); the rows are inserted in key order,
-- so two batches that share keys take their row locks in the same order.
-- A key whose row another open transaction holds (a request-as-transaction claim of
-- it, F3) would make the whole batch wait for that transaction: the INSERT's row
-- source first bounds the statement's lock wait to %(lock_wait)s (for this statement's
-- own transaction only), and a batch that gives up is sent again claim by claim, so
-- only the claim of that key waits, as it would have alone.
-- Every read of the key table is a probe of one row by (scope, key), per claim: the
-- subqueries on i.key end in OFFSET 0, which keeps PostgreSQL from turning them into
-- a join with the batch's rows. As a join, while the statistics say one row per
-- scope (a table analyzed small, grown since), its plan reads the scope once by the
-- scope alone instead: the whole scope, at every batch (tests/test_postgres_plans.py).
WITH input AS (
    SELECT *
    FROM unnest(
        %(key)s::text[], %(method)s::text[], %(path)s::text[], %(fingerprint)s::text[],
        %(params)s::text[], %(flow)s::text[], %(lock_timeout)s::interval[],
        %(retention)s::interval[]
    ) WITH ORDINALITY
        AS i (key, method, path, fingerprint, params, flow, lock_timeout, retention, batch_index)
),
claimed AS (
    INSERT INTO idempotency_keys AS k (
        scope, key, request_method, request_path, fingerprint, request_params,
        flow, lock_timeout, locked_at, last_run_at, expires_at
    )
    SELECT
        %(scope)s, i.key, i.method, i.path, i.fingerprint, i.params::jsonb,
        i.flow, i.lock_timeout, now(), now(), now() + i.retention
    FROM input AS i
    WHERE set_config('lock_timeout', %(lock_wait)s, true) IS NOT NULL
      AND NOT EXISTS (
        SELECT FROM idempotency_keys AS s
        WHERE s.scope = %(scope)s AND s.key = i.key AND s.finished_at IS NOT NULL
        OFFSET 0
    )
    ORDER BY i.key
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
SELECT i.batch_index, true AS claimed, now() AS db_now, c.*
FROM claimed AS c
JOIN input AS i ON i.key = c.key
UNION ALL
SELECT i.batch_index, false AS claimed, now() AS db_now, k.*
FROM input AS i
CROSS JOIN LATERAL (
    SELECT * FROM idempotency_keys AS s
    WHERE s.scope = %(scope)s AND s.key = i.key
    OFFSET 0
) AS k
WHERE NOT EXISTS (SELECT FROM claimed AS c WHERE c.key = i.key);

-- claim_held --
-- The claim of a key whose row another request's open transaction holds (F3), read
-- instead of waiting for that transaction (F8): the latest committed version of the
-- row, if any. Always one row: with no key committed yet (the holder's INSERT is not),
-- k.* is NULL and db_now still says when. See stores/_sql/ops.py: claim_held.
SELECT now() AS db_now, k.*
FROM (SELECT) AS one
LEFT JOIN LATERAL (
    SELECT * FROM idempotency_keys AS s WHERE s.scope = %(scope)s AND s.key = %(key)s
) AS k ON true;

-- checkpoint --
-- Advance the recovery point, fenced by the lock token (F1). It is the last
-- statement of the phase's transaction: no row back means another worker took the
-- key over, and the caller rolls the whole phase back. Committing a phase also proves
-- the holder alive, so the lock is refreshed. calling names the non-idempotent
-- foreign call about to begin (R6), and is NULL for every other checkpoint: the one
-- that records the call's result, or takes the attempt back after a determinate
-- failure, clears it.
UPDATE idempotency_keys
SET recovery_point = %(recovery_point)s,
    calling = %(calling)s,
    locked_at = statement_timestamp(),
    last_run_at = statement_timestamp()
WHERE scope = %(scope)s AND id = %(id)s AND key = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING lock_token;

-- finish --
-- Store the response and unlock, fenced (F1). The retention window restarts at the
-- finish, so a key finished late by the completer is still replayable for as long as
-- one finished at once (expires_at - created_at is the retention the claim set).
-- Duplicates waiting for the key are woken (P10: see mark_waiter).
UPDATE idempotency_keys
SET recovery_point = 'finished',
    calling = NULL,
    response_status = %(status)s,
    response_headers = %(headers)s::jsonb,
    response_body = %(body)s,
    error = %(error)s,
    finished_at = statement_timestamp(),
    locked_at = NULL,
    expires_at = statement_timestamp() + (expires_at - created_at),
    waiters = CASE
        WHEN NOT waiters THEN false
        WHEN octet_length(json_build_array(scope, key)::text) >= 8000 THEN false
        ELSE pg_notify('idempotence_settled', json_build_array(scope, key)::text) IS NULL
    END
WHERE scope = %(scope)s AND id = %(id)s AND key = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING id;

-- finish_batch --
-- Many finishes of one scope as one statement (DESIGN 11: natural batching): the
-- finish above, a row of parameters each, unnested side by side. Each row is fenced
-- by its own lock token (F1): a stale one matches nothing, so only that caller's
-- batch_index is missing from the result and only that caller is refused. A key
-- appears at most once per batch. The lock wait is bounded as in claim_batch.
-- Each row is found by a probe of one row, per finish: row_id, the version of the
-- caller's row this statement sees, looked up by (scope, key); the UPDATE then takes
-- that version by its ctid (a TID scan, one row). A plain join of the batch's rows
-- with the table reads the whole scope by the scope alone while the statistics say
-- one row per scope (tests/test_postgres_plans.py), and so does the TID plan unless
-- the batch's rows look few: the set_config test is written as an equality (true:
-- set_config returns the setting as current_setting then reads it), which the
-- planner expects to keep one row in 200, so it drives the update row by row.
-- A ctid names one version of the row: when another statement updated the row after
-- this one's snapshot (a duplicate's mark_waiter), the row is not updated and comes
-- back missing, and the caller sends its single finish again (_batch.answered).
UPDATE idempotency_keys AS k
SET recovery_point = 'finished',
    calling = NULL,
    response_status = i.status,
    response_headers = i.headers::jsonb,
    response_body = i.body,
    error = i.error,
    finished_at = statement_timestamp(),
    locked_at = NULL,
    expires_at = statement_timestamp() + (k.expires_at - k.created_at),
    waiters = CASE
        WHEN NOT k.waiters THEN false
        WHEN octet_length(json_build_array(k.scope, k.key)::text) >= 8000 THEN false
        ELSE pg_notify('idempotence_settled', json_build_array(k.scope, k.key)::text) IS NULL
    END
FROM (
    SELECT u.*, (
        SELECT s.ctid FROM idempotency_keys AS s
        WHERE s.scope = %(scope)s AND s.key = u.key AND s.id = u.id
    ) AS row_id
    FROM unnest(
        %(id)s::bigint[], %(key)s::text[], %(token)s::bigint[], %(status)s::integer[],
        %(headers)s::text[], %(body)s::bytea[], %(error)s::text[]
    ) WITH ORDINALITY AS u (id, key, token, status, headers, body, error, batch_index)
    WHERE set_config('lock_timeout', %(lock_wait)s, true) = current_setting('lock_timeout')
    OFFSET 0
) AS i
WHERE k.scope = %(scope)s AND k.ctid = i.row_id AND k.id = i.id AND k.key = i.key
  AND k.lock_token = i.token AND k.finished_at IS NULL
RETURNING i.batch_index, k.id, k.finished_at, k.expires_at;

-- release --
-- Unlock without finishing (R5): the next claim resumes from the recovery point.
-- Duplicates waiting for the key are woken to claim it (P10: see mark_waiter).
UPDATE idempotency_keys
SET locked_at = NULL,
    waiters = CASE
        WHEN NOT waiters THEN false
        WHEN octet_length(json_build_array(scope, key)::text) >= 8000 THEN false
        ELSE pg_notify('idempotence_settled', json_build_array(scope, key)::text) IS NULL
    END
WHERE scope = %(scope)s AND id = %(id)s AND key = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL
RETURNING id;

-- heartbeat --
-- Extend a live lock (F2), fenced like every write of the holder. A released lock
-- (locked_at NULL) stays released. coalesce hides that test from the planner, which
-- would otherwise scan the sweeper's partial index of locked rows (see the header).
UPDATE idempotency_keys
SET locked_at = statement_timestamp()
WHERE scope = %(scope)s AND id = %(id)s AND key = %(key)s AND lock_token = %(token)s
  AND finished_at IS NULL AND coalesce(locked_at IS NOT NULL, false)
RETURNING locked_at;

-- get --
-- The key, and the database clock read with it: key_status names the key's state
-- (expired past expires_at) on that clock, in the same statement.
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
-- 'started', when nothing else can refer to the row. Duplicates waiting for the key
-- are woken to claim it afresh (P10: see mark_waiter; RETURNING of a DELETE reads the
-- deleted row, so the test is made there).
WITH forgotten AS (
    DELETE FROM idempotency_keys
    WHERE scope = %(scope)s AND id = %(id)s AND key = %(key)s AND lock_token = %(token)s
      AND recovery_point = 'started' AND finished_at IS NULL
    RETURNING id, scope, key, waiters
)
SELECT id,
    CASE
        WHEN NOT waiters THEN false
        WHEN octet_length(json_build_array(scope, key)::text) >= 8000 THEN false
        ELSE pg_notify('idempotence_settled', json_build_array(scope, key)::text) IS NOT NULL
    END AS woke_waiters
FROM forgotten;

-- mark_waiter --
-- P10: a duplicate request is about to wait for the key's holder, and asks to be
-- woken when the key settles. The statements that settle a key (finish, release,
-- forget, sweep_expired_locks) then send one NOTIFY on the channel
-- idempotence_settled, with the JSON array [scope, key] as payload, and clear the
-- flag. Keys nobody waits for send none: a NOTIFY takes a lock that is held until
-- commit and serializes every notifying commit in the cluster.
-- Those statements test the flag in SET, which reads the row as it was before the
-- update (RETURNING sees it after), and the latest committed version of it, so a mark
-- that commits while they wait for the row lock is seen. pg_notify returns void, never
-- NULL, so `pg_notify(...) IS NULL` clears the flag once the NOTIFY is queued. A
-- payload of 8000 bytes or more (a very long scope) would fail the statement, so it is
-- never sent: the waiter's own bounded pause ends its wait instead.
-- Only a key still in progress (unfinished, with a live lock: states.arbitrate's P4)
-- is marked. No row back means it settled since the claim: the duplicate claims again
-- at once. The waiter LISTENs before it marks, so a settle that commits after this
-- statement always reaches it. The row lock may make this wait for a transaction that
-- holds the key (request-as-transaction mode), as the duplicate's claim would have.
-- coalesce: a NULL lock is no live lock, and the planner cannot read the test as
-- locked_at IS NOT NULL (the sweeper's partial index; see the header).
UPDATE idempotency_keys
SET waiters = true
WHERE scope = %(scope)s AND key = %(key)s
  AND finished_at IS NULL AND coalesce(locked_at + lock_timeout > now(), false)
RETURNING id;

-- listen --
-- P10: the store's one listener connection subscribes to the channel of mark_waiter.
LISTEN idempotence_settled;

-- == maintenance (cross-scope) ==
-- The background services and the operator's commands (DESIGN 7, F5). Most of them
-- look for work across every scope, so they cannot filter on one: each says why
-- under its header. On a table distributed by scope (DESIGN 8) they fan out to every
-- shard, which is what a sweep over the whole table has to do. Each write picks its
-- batch with FOR UPDATE SKIP LOCKED, so any number of nodes can run the same service
-- at once: a row is in one node's batch or in none. They run in a transaction of
-- their own that starts with maintenance_timeout, and use statement_timestamp(),
-- not now(), so the time is the statement's even late in a transaction.

-- maintenance_timeout --
-- Bound every statement of the maintenance transaction (SET LOCAL statement_timeout):
-- a sweep stuck behind a lock gives up, and the next pass tries again, rather than
-- piling up behind it.
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true);

-- db_now --
-- The database clock, once per pass: work touched during the pass is newer than
-- this, so a pass never picks the same key twice.
SELECT statement_timestamp() AS db_now;

-- sweep_expired_locks --
-- cross-scope: the sweeper looks for expired locks in every scope (B1).
-- Unlock keys whose holder stopped renewing its lock (a crashed worker), bumping the
-- fencing token so that a zombie's late checkpoint is refused (F1), and wake the
-- duplicates waiting for them (P10: see mark_waiter). Unfinished keys only: a finished
-- key holds no lock. The outer WHERE repeats the expiry test on the row it updates, in
-- case a claim renewed the lock since the subquery read it.
UPDATE idempotency_keys AS k
SET lock_token = k.lock_token + 1,
    locked_at = NULL,
    waiters = CASE
        WHEN NOT k.waiters THEN false
        WHEN octet_length(json_build_array(k.scope, k.key)::text) >= 8000 THEN false
        ELSE pg_notify('idempotence_settled', json_build_array(k.scope, k.key)::text) IS NULL
    END
FROM (
    SELECT scope, id, locked_at
    FROM idempotency_keys
    WHERE locked_at IS NOT NULL AND finished_at IS NULL
      AND locked_at + lock_timeout <= statement_timestamp()
    ORDER BY locked_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS expired
WHERE k.scope = expired.scope AND k.id = expired.id
  AND k.locked_at + k.lock_timeout <= statement_timestamp()
RETURNING k.id, k.scope, k.key, k.flow, k.recovery_point, k.lock_token,
    expired.locked_at AS held_since;

-- pick_abandoned --
-- cross-scope: the completer looks for abandoned keys in every scope (B2).
-- Take a batch of abandoned keys of the given flows: unfinished, not live-locked, not
-- expired (the reaper's), and not run since the grace period before the pass began.
-- Counting the attempt and moving last_run_at in the same statement is the
-- completer's lease: another completer skips the key until the grace period passes
-- again, and a key whose flow crashes the completer itself still runs out of attempts.
UPDATE idempotency_keys AS k
SET completer_attempts = k.completer_attempts + 1,
    last_run_at = statement_timestamp()
FROM (
    SELECT scope, id
    FROM idempotency_keys
    WHERE finished_at IS NULL
      AND (locked_at IS NULL OR locked_at + lock_timeout <= statement_timestamp())
      AND (expires_at IS NULL OR expires_at > statement_timestamp())
      AND coalesce(last_run_at, created_at) <= %(since)s::timestamptz - %(grace)s::interval
      AND flow IN (SELECT jsonb_array_elements_text(%(flows)s::jsonb))
    ORDER BY last_run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS abandoned
WHERE k.scope = abandoned.scope AND k.id = abandoned.id
RETURNING statement_timestamp() AS db_now, k.*;

-- reset_completer_attempts --
-- A resumed flow that paused (a phase returned NoOp) made progress rather than
-- failing: its attempts start again, so a flow that waits is not mistaken for one
-- that keeps failing.
UPDATE idempotency_keys
SET completer_attempts = 0
WHERE scope = %(scope)s AND id = %(id)s AND key = %(key)s AND finished_at IS NULL
RETURNING id;

-- abandoned_unregistered --
-- cross-scope: the completer reports abandoned keys in every scope (B2).
-- Abandoned keys whose flow is not among the given ones: the completer cannot resume
-- them, so it reports them, per flow, and leaves them alone.
SELECT flow, count(*) AS keys
FROM idempotency_keys
WHERE finished_at IS NULL
  AND (locked_at IS NULL OR locked_at + lock_timeout <= statement_timestamp())
  AND (expires_at IS NULL OR expires_at > statement_timestamp())
  AND coalesce(last_run_at, created_at) <= %(since)s::timestamptz - %(grace)s::interval
  AND flow NOT IN (SELECT jsonb_array_elements_text(%(flows)s::jsonb))
GROUP BY flow
ORDER BY flow;

-- expire_pending --
-- cross-scope: the reaper expires keys in every scope (B3).
-- Turn unfinished keys past expires_at that no live worker holds into a stored
-- failure (the 408 problem the caller passes): finished, so replayed to a retry and
-- refused to any zombie's fenced write (every fenced write requires an unfinished
-- row). The retention restarts, as at any finish, so the answer stays replayable.
-- No ORDER BY: which expired key goes first does not matter, and not sorting lets
-- the planner use the small partial indexes of unfinished rows instead of walking
-- every expired finished row in expires_at order.
UPDATE idempotency_keys AS k
SET recovery_point = 'finished',
    response_status = %(status)s,
    response_headers = %(headers)s::jsonb,
    response_body = %(body)s,
    error = NULL,
    finished_at = statement_timestamp(),
    locked_at = NULL,
    expires_at = statement_timestamp() + (k.expires_at - k.created_at)
FROM (
    SELECT scope, id
    FROM idempotency_keys
    WHERE finished_at IS NULL
      AND expires_at <= statement_timestamp()
      AND (locked_at IS NULL OR locked_at + lock_timeout <= statement_timestamp())
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS expired
WHERE k.scope = expired.scope AND k.id = expired.id
  AND k.finished_at IS NULL
RETURNING k.id, k.scope, k.key, k.flow;

-- reap_finished --
-- cross-scope: the reaper deletes expired keys in every scope (B3).
-- Delete finished keys past expires_at, oldest first. Never an errored key (it waits
-- for a human, R6), never a locked one (a finished key is never locked; the test is
-- a guard), never one with no expiry (retention None: kept forever). Only the count
-- comes back: a thousand ids per batch would cost the client for nothing.
WITH reaped AS (
    DELETE FROM idempotency_keys AS k
    USING (
        SELECT scope, id
        FROM idempotency_keys
        WHERE finished_at IS NOT NULL AND error IS NULL AND locked_at IS NULL
          AND expires_at <= statement_timestamp()
        ORDER BY expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS expired
    WHERE k.scope = expired.scope AND k.id = expired.id
    RETURNING 1
)
SELECT count(*) AS deleted FROM reaped;

-- deliver_job --
-- The built-in runner's delivery (B4): in the enqueuer's transaction, together with
-- the take_staged_jobs that removed the job. The unique job_key makes a repeat a
-- no-op: exactly once per job_key.
INSERT INTO idempotence_jobs (job_key, scope, key_id, name, args)
VALUES (%(job_key)s, %(scope)s, %(key_id)s, %(name)s, %(args)s::jsonb)
ON CONFLICT (job_key) DO NOTHING
RETURNING id;

-- pick_jobs --
-- The runner's batch: due jobs of the given names. The attempt is counted and run_at
-- moved to the end of the lease in the same statement, so a runner that dies mid-job
-- leaves it to be picked again when the lease ends (at-least-once execution).
UPDATE idempotence_jobs AS j
SET attempts = j.attempts + 1,
    run_at = statement_timestamp() + %(lease)s::interval
FROM (
    SELECT id
    FROM idempotence_jobs
    WHERE status = 'ready' AND run_at <= statement_timestamp()
      AND name IN (SELECT jsonb_array_elements_text(%(names)s::jsonb))
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS due
WHERE j.id = due.id
RETURNING j.id, j.job_key, j.scope, j.key_id, j.name, j.args, j.attempts, j.created_at;

-- job_done --
-- Fenced by the attempt count: if the lease ran out and another runner picked the job
-- again, that runner decides its fate. coalesce keeps the planner from reading the
-- status test as the predicate of the runner's partial index (see the header): here
-- and in job_failed.
UPDATE idempotence_jobs
SET status = 'done', finished_at = statement_timestamp(), last_error = NULL
WHERE id = %(id)s AND attempts = %(attempts)s AND coalesce(status = 'ready', false)
RETURNING id;

-- job_failed --
-- Retry after the backoff the caller computed, or give up (dead) after max_attempts.
UPDATE idempotence_jobs
SET status = CASE WHEN attempts >= %(max_attempts)s THEN 'dead' ELSE 'ready' END,
    run_at = statement_timestamp() + %(backoff)s::interval,
    last_error = %(error)s,
    finished_at = CASE WHEN attempts >= %(max_attempts)s THEN statement_timestamp() END
WHERE id = %(id)s AND attempts = %(attempts)s AND coalesce(status = 'ready', false)
RETURNING status;

-- list_keys --
-- cross-scope: the operator lists keys of every scope unless given one (F5).
-- Keys with their observable state, computed here exactly as states.key_state does
-- (a test holds the two together), so that --state filters before LIMIT. Newest
-- first.
SELECT *
FROM (
    SELECT now() AS db_now,
        CASE
            WHEN k.finished_at IS NOT NULL THEN
                CASE
                    WHEN k.error IS NOT NULL THEN 'errored'
                    WHEN k.expires_at <= now() THEN 'expired'
                    WHEN coalesce(k.response_status, 500) < 400 THEN 'complete'
                    ELSE 'failed'
                END
            WHEN k.locked_at + k.lock_timeout > now() THEN 'processing'
            WHEN k.expires_at <= now() THEN 'expired'
            ELSE 'pending'
        END AS state,
        k.*
    FROM idempotency_keys AS k
    WHERE (%(scope)s::text IS NULL OR k.scope = %(scope)s::text)
      AND (%(key)s::text IS NULL OR k.key = %(key)s::text)
) AS keyed
WHERE %(state)s::text IS NULL OR keyed.state = %(state)s::text
ORDER BY keyed.created_at DESC, keyed.id DESC
LIMIT %(limit)s;

-- key_stats --
-- cross-scope: the operator's counts cover every scope unless given one (F5).
-- Keys per state (as in list_keys), the oldest key of each state, and how often
-- locks changed hands: every takeover and every sweep bumps lock_token from 1.
SELECT now() AS db_now, state, count(*) AS keys, min(created_at) AS oldest,
    sum(lock_token - 1) AS takeovers
FROM (
    SELECT
        CASE
            WHEN k.finished_at IS NOT NULL THEN
                CASE
                    WHEN k.error IS NOT NULL THEN 'errored'
                    WHEN k.expires_at <= now() THEN 'expired'
                    WHEN coalesce(k.response_status, 500) < 400 THEN 'complete'
                    ELSE 'failed'
                END
            WHEN k.locked_at + k.lock_timeout > now() THEN 'processing'
            WHEN k.expires_at <= now() THEN 'expired'
            ELSE 'pending'
        END AS state,
        k.created_at,
        k.lock_token
    FROM idempotency_keys AS k
    WHERE %(scope)s::text IS NULL OR k.scope = %(scope)s::text
) AS keyed
GROUP BY state;

-- job_stats --
-- Staged jobs not yet delivered, and the built-in runner's jobs by status.
SELECT 'staged' AS status, count(*) AS jobs FROM idempotence_staged_jobs
UNION ALL
SELECT status, count(*) AS jobs FROM idempotence_jobs GROUP BY status;

-- evict_key --
-- The operator removes one key (its retries then run afresh). A live lock means a
-- worker is running it right now, so that needs force; the holder's later fenced
-- writes then find no row and roll back (F1). Only the row read before, by its id:
-- a cache in front has refused that row's response, and no other incarnation's.
DELETE FROM idempotency_keys AS k
WHERE k.scope = %(scope)s AND k.key = %(key)s AND k.id = %(id)s
  AND (%(force)s OR k.locked_at IS NULL OR k.locked_at + k.lock_timeout <= now())
RETURNING k.id;
