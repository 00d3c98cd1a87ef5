"""Run one claim in a process whose clock is moved (DESIGN 3: times are the store's).

    python -m tests.network.skewed SHIFT_SECONDS STORE_URL PREFIX KEY LOCK_SECONDS

libfaketime is not installed on this machine (nor in apt's lists here), so the shift
is made in-process, before the library is imported: ``time.time`` and ``time.time_ns``
answer the real time plus SHIFT_SECONDS. The monotonic clock is left alone, as an NTP
step leaves it. ``datetime.now`` cannot be moved from Python (psycopg's C code needs
the real class), and the claim path never reads it: the library reads the wall clock
only in the cache's expiry, the client's Retry-After dates and the reconciler.

Prints the claim's outcome and exits without finishing or releasing the key: a worker
that died holding the lock.
"""

from __future__ import annotations

import sys
import time

SHIFT = float(sys.argv[1])
_real_time, _real_time_ns = time.time, time.time_ns
time.time = lambda: _real_time() + SHIFT
time.time_ns = lambda: _real_time_ns() + int(SHIFT * 1e9)


def main() -> None:
    from datetime import timedelta

    from idempotence.states import ClaimRequest
    from idempotence.stores.postgres import PostgresStore
    from idempotence.stores.redis import RedisStore

    _, _, url, prefix, key, lock = sys.argv
    store = RedisStore(url, prefix=prefix) if url.startswith("redis") else PostgresStore(url)
    with store:
        request = ClaimRequest(
            scope="skew", key=key, fingerprint="f" * 64, lock_timeout=timedelta(seconds=float(lock))
        )
        print(store.claim(request).outcome.value, flush=True)


if __name__ == "__main__":
    main()
