-- 0004_waiters: duplicates waiting for a key are woken by NOTIFY (P10).

-- Set by a duplicate request that waits for the key's holder (mark_waiter). The
-- statement that settles the key (finish, release, forget, the sweeper's unlock) sends
-- one NOTIFY when it is set, and clears it. A NOTIFY takes a lock that is held until
-- commit and serializes every notifying commit, so a key nobody waits for sends none.
ALTER TABLE idempotency_keys ADD COLUMN waiters boolean NOT NULL DEFAULT false;
