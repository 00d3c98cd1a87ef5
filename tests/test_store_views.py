"""The PostgreSQL store keeps one view (and one cursor) per connection of its pool, made
once: the map of views must not outgrow the pool as the pool replaces connections
(max_lifetime, a broken connection), or a long-lived process would keep every
connection it ever had."""

from __future__ import annotations

import psycopg_pool

from idempotence.stores.postgres import PostgresStore


def test_the_store_keeps_no_view_of_a_connection_the_pool_closed(pg_url: str) -> None:
    pool = psycopg_pool.ConnectionPool(
        pg_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True
    )
    try:
        with PostgresStore(pool) as store:
            seen = set()
            for _ in range(5):
                assert store.get("views", "k") is None
                raw = pool.getconn()
                seen.add(id(raw))
                raw.close()  # the pool discards it and opens another
                pool.putconn(raw)
            assert store.get("views", "k") is None
            views = store._source._views  # type: ignore[attr-defined]
            assert len(seen) == 5 and len(views) == 1
            assert not next(iter(views)).closed
    finally:
        pool.close()
