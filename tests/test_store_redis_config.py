"""What a Redis store, or a cached store's Redis, is given: URLs, clients, timeouts
(DESIGN 8, P11). A mistake is refused when the store is made, with a message that says
what to write, never read as something else (redis-py reads a database it cannot
parse as database 0) and never left to fail every request; a cluster that cannot be
reached is unavailable (503), not a server error.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idempotence import (
    ClaimRequest,
    ConfigurationError,
    DatabaseUrl,
    StoreMisconfigured,
    StoreUnavailable,
)
from idempotence.flows import Flow
from idempotence.http import Endpoint, Idempotency, IdempotencyMiddleware, single_tenant
from idempotence.stores.cached import AsyncCachedStore, CachedStore
from idempotence.stores.redis import AsyncRedisStore, RedisStore
from idempotence.stores.sqlite import AsyncSqliteStore, SqliteStore
from tests.support.redis import SHARED_URL, require
from tests.support.stores import Blocking, EventLoopThread

FP = "f" * 64
CLI = os.path.join(os.path.dirname(sys.executable), "idempotence")


def request(scope: str, key: str = "k1") -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint=FP)


def host_port() -> str:
    """``host:port`` of the shared server (no database)."""
    return require(SHARED_URL).split("://", 1)[1].split("/", 1)[0]


# -- URLs --------------------------------------------------------------------------------------

#: URLs redis-py would read otherwise than written (another database), or refuse
#: only at the first command; and what the refusal says.
BAD_URLS = [
    ("redis://{hp}/abc", "invalid database 'abc'"),
    ("redis://{hp}/12/extra", "invalid database '12/extra'"),
    ("redis://{hp}/5x", "invalid database '5x'"),
    ("redis://{hp}/0?db=two", "invalid database 'two'"),
    ("redis://{hp}/-1", "invalid database '-1'"),
    ("redis://{hp}/12?prefix=x", "unknown option 'prefix' in the Redis URL: remove it"),
    ("redis://{hp}/12?socket_timeout=soon", "invalid option in the Redis URL: .*socket_timeout"),
    ("redis://[::1/0", "invalid Redis URL: write redis://"),
    ("redis://{hp}/1?protocol=4", "invalid option in the Redis URL"),
    ("redis://{hp}:x/0", "invalid Redis URL"),
    ("http://{hp}/0", "unsupported scheme 'http'"),
]


@pytest.mark.parametrize(("url", "message"), BAD_URLS, ids=[u for u, _ in BAD_URLS])
@pytest.mark.parametrize("kind", [RedisStore, AsyncRedisStore])
def test_a_redis_url_read_otherwise_than_written_is_refused(
    kind: type, url: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        kind(url.format(hp=host_port()))


@pytest.mark.parametrize(("url", "message"), BAD_URLS, ids=[u for u, _ in BAD_URLS])
def test_a_cached_stores_redis_url_read_otherwise_than_written_is_refused(
    tmp_path: Any, url: str, message: str
) -> None:
    primary = SqliteStore(str(tmp_path / "keys.sqlite3"))
    async_primary = AsyncSqliteStore(str(tmp_path / "keys.sqlite3"))
    try:
        with pytest.raises(ConfigurationError, match=message):
            CachedStore(primary, url.format(hp=host_port()))
        with pytest.raises(ConfigurationError, match=message):
            AsyncCachedStore(async_primary, url.format(hp=host_port()))
    finally:
        primary.close()
        asyncio.run(async_primary.close())


@pytest.mark.parametrize(
    "url",
    ["redis://{hp}/abc", "redis://{hp}/1?db=x", "redis+cluster://{hp}/1", "redis://[::1/0"],
)
def test_the_database_url_of_the_cli_checks_the_redis_database(url: str) -> None:
    with pytest.raises(ConfigurationError):
        DatabaseUrl.parse(url.format(hp=host_port()))


@pytest.mark.parametrize(
    ("url", "db"),
    [
        ("redis://{hp}", 0),
        ("redis://{hp}/", 0),
        ("redis://{hp}/15", 15),
        ("redis://{hp}?db=3", 3),
        ("rediss://{hp}/2?ssl_cert_reqs=none", 2),
        ("redis://{hp}/1?client_name=app&socket_keepalive=true", 1),
        ("unix:///tmp/redis.sock?db=2", 2),
        ("redis://{hp}/0/", 0),
        ("redis://{hp}/%31", 1),
        ("redis://{hp}/1?db=", 1),
        ("redis://user:p%2Fw%40rd@{hp}/0", 0),
    ],
)
def test_the_urls_redis_py_reads_as_written_are_taken(url: str, db: int) -> None:
    # Taken, and read as written: the client the store opened talks to that database
    # (and with that password), as redis-py itself reads the URL.
    written = url.format(hp=host_port())
    for kind in (RedisStore, AsyncRedisStore):
        store = kind(written)
        try:
            options = store._client.connection_pool.connection_kwargs
            assert options.get("db", 0) == db  # redis-py leaves out the default
            if "user:" in written:
                assert (options["username"], options["password"]) == ("user", "p/w@rd")
        finally:
            closing = store.close()
            if asyncio.iscoroutine(closing):
                asyncio.run(closing)


@pytest.mark.parametrize(
    ("url", "secret"),
    [("redis://default:ab/cd==@{hp}/0", "'ab'"), ("redis://:x@y/z@{hp}/0", "z@")],
)
def test_a_refused_url_never_shows_a_password(url: str, secret: str) -> None:
    # An unencoded '/' in a password breaks the URL at the wrong place: the refusal
    # says how to write it, without quoting what it found there.
    with pytest.raises(ConfigurationError, match="percent-encode") as refused:
        RedisStore(url.format(hp=host_port()))
    assert secret not in str(refused.value)


def test_a_cluster_has_database_0_only() -> None:
    for kind in (RedisStore, AsyncRedisStore):
        with pytest.raises(ConfigurationError, match="database 0 only, not 1"):
            kind(f"redis+cluster://{host_port()}/1")


def test_evict_with_a_cache_url_in_another_database_is_a_usage_error_and_evicts_nothing(
    tmp_path: Any,
) -> None:
    # redis-py would have written the tombstone to database 0, and the cache in
    # database 5 would then go on replaying the evicted key's response.
    database = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    with SqliteStore(database.removeprefix("sqlite:///")) as store:
        store.migrate()
        lease = store.claim(request("acct")).lease
        assert lease is not None
    cache = f"redis://{host_port()}/5x"
    done = subprocess.run(
        [CLI, "keys", "evict", "acct", "k1", "--force", "--database", database, "--cache", cache],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "invalid database '5x'" in done.stderr
    with SqliteStore(database.removeprefix("sqlite:///")) as store:
        assert store.get("acct", "k1") is not None  # still there


# -- clients and timeouts ----------------------------------------------------------------------


def test_a_client_of_the_other_flavour_is_refused() -> None:
    url = require(SHARED_URL)
    with pytest.raises(ConfigurationError, match=r"redis\.client\.Redis or .*, not Redis"):
        RedisStore(redis.asyncio.Redis.from_url(url))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"redis\.asyncio\.client\.Redis or"):
        AsyncRedisStore(redis.Redis.from_url(url))  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), None, "1"])
def test_a_timeout_that_is_no_positive_number_of_seconds_is_refused(
    timeout: float, tmp_path: Any
) -> None:
    url = require(SHARED_URL)
    for make in (
        lambda: RedisStore(url, timeout=timeout),
        lambda: AsyncRedisStore(url, timeout=timeout),
        lambda: CachedStore(SqliteStore(str(tmp_path / "k.sqlite3")), url, timeout=timeout),
    ):
        with pytest.raises(ConfigurationError, match="positive number of seconds"):
            make()


# -- a cluster that cannot be reached (P11) ----------------------------------------------------


def unreachable_clusters() -> list[str]:
    # No server at all; a server that is no cluster node.
    return ["redis+cluster://127.0.0.1:1", f"redis+cluster://{host_port()}"]


@pytest.mark.parametrize(
    ("which", "error", "says"),
    [
        ("refused", StoreUnavailable, "Redis key store is unavailable"),
        # Unavailable too (nothing runs), but a configuration error: no retry cures it.
        ("not-a-cluster", StoreMisconfigured, "Redis server is not a cluster node"),
    ],
)
def test_p11_an_unreachable_cluster_is_unavailable(
    which: str, error: type[StoreUnavailable], says: str
) -> None:
    url = unreachable_clusters()[which == "not-a-cluster"]
    # The sync client discovers the cluster as it is made; the async one at its first
    # command.
    with pytest.raises(error, match=says):
        RedisStore(url, timeout=0.5)
    store = Blocking(AsyncRedisStore(url, timeout=0.5), EventLoopThread())
    try:
        with pytest.raises(error, match=says):
            store.claim(request("s"))
    finally:
        store.close()


@pytest.mark.parametrize("which", ["refused", "not-a-cluster"])
def test_p11_an_unreachable_cluster_answers_503_and_runs_nothing(which: str) -> None:
    url = unreachable_clusters()[which == "not-a-cluster"]
    ran: list[int] = []

    async def endpoint(request: Request) -> JSONResponse:
        ran.append(1)
        return JSONResponse({"ok": True}, status_code=201)

    async def main() -> httpx.Response:
        store = AsyncRedisStore(url, timeout=0.5)
        config = Idempotency(store=store, scope=single_tenant(), endpoints=[Endpoint("POST /x")])
        app = IdempotencyMiddleware(
            Starlette(routes=[Route("/x", endpoint, methods=["POST"])]), config
        )
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.post("/x", json={}, headers={"idempotency-key": "k"})
        finally:
            await store.close()

    answer = asyncio.run(main())
    assert answer.status_code == 503, answer.text
    assert "retry-after" in answer.headers
    assert ran == []


@pytest.mark.slow
def test_p11_the_cli_on_an_unreachable_cluster_exits_unavailable() -> None:
    done = subprocess.run(
        [CLI, "stats", "--database", "redis+cluster://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# -- closed stores, flows ----------------------------------------------------------------------


def test_a_closed_stores_clock_is_unavailable(loop_thread: EventLoopThread) -> None:
    url = require(SHARED_URL)
    store = RedisStore(url)
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.server_time()
    async_store = AsyncRedisStore(url)
    loop_thread.run(async_store.close())
    with pytest.raises(StoreUnavailable, match="closed"):
        loop_thread.run(async_store.server_time())


def test_a_flow_run_on_a_redis_store_is_refused_before_it_claims(
    redis_prefix: str, loop_thread: EventLoopThread
) -> None:
    # Its first phase would fail for want of a transaction, and leave the key locked
    # until its lock timed out.
    flow = Flow("redis-phases")

    @flow.phase("started")
    def first(ctx: Any) -> Any:
        raise AssertionError("a phase ran on a Redis store")

    url = require(SHARED_URL)
    store = RedisStore(url, prefix=redis_prefix)
    try:
        with pytest.raises(ConfigurationError, match=r"needs a SQL store .*not RedisStore"):
            flow.run(store, request("s"))  # type: ignore[arg-type]
        assert store.get("s", "k1") is None  # nothing was claimed
    finally:
        store.close()
    async_store = AsyncRedisStore(url, prefix=redis_prefix)
    try:
        with pytest.raises(ConfigurationError, match=r"needs a SQL store .*not AsyncRedisStore"):
            loop_thread.run(flow.run_async(async_store, request("s")))  # type: ignore[arg-type]
        assert loop_thread.run(async_store.get("s", "k1")) is None
    finally:
        loop_thread.run(async_store.close())


def test_a_prefix_with_glob_characters_lists_its_own_records_only(redis_prefix: str) -> None:
    # The listing SCANs by pattern: an unescaped '*' in the prefix matched the
    # records of every store whose prefix it covers.
    url = require(SHARED_URL)
    mine, other = (
        RedisStore(url, prefix=f"{redis_prefix}*"),
        RedisStore(url, prefix=f"{redis_prefix}x"),
    )
    client = redis.Redis.from_url(url)
    try:
        other.claim(request("s", "theirs"))
        mine.claim(request("s", "mine"))
        assert [found.key for found in mine.records()] == ["mine"]
        assert [found.key for found in mine.records("s")] == ["mine"]
        assert [found.key for found in other.records()] == ["theirs"]
    finally:
        mine.close()
        other.close()
        for name in client.scan_iter(match=f"{redis_prefix}*"):
            client.delete(name)
        client.close()


@pytest.mark.slow
def test_the_cli_reads_a_redis_store_under_its_own_prefix(redis_prefix: str, tmp_path: Any) -> None:
    url = require(SHARED_URL)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60)

    store = RedisStore(url, prefix=redis_prefix)
    try:
        store.claim(request("acct", "prefixed"))
        # Without it the CLI looks under the default prefix, and finds nothing there.
        hidden = cli("keys", "list", "--scope", "acct", "--database", url)
        assert hidden.returncode == 0 and "prefixed" not in hidden.stdout, hidden.stderr
        found = cli("keys", "list", "--database", url, "--redis-prefix", redis_prefix)
        assert found.returncode == 0 and "prefixed" in found.stdout, found.stderr
        shown = cli("keys", "show", "acct", "prefixed", "--database", url)
        assert shown.returncode == 4  # not under the default prefix
        args = ("acct", "prefixed", "--database", url, "--redis-prefix", redis_prefix)
        assert cli("keys", "show", *args).returncode == 0
        stats = cli("stats", "--scope", "acct", "--database", url, "--redis-prefix", redis_prefix)
        assert stats.returncode == 0 and "total keys       1" in stats.stdout, stats.stdout
        assert cli("keys", "evict", *args, "--force").returncode == 0
        assert store.get("acct", "prefixed") is None
    finally:
        store.close()
    braces = cli("keys", "list", "--database", url, "--redis-prefix", "a{b}")
    assert braces.returncode == 2 and "without braces" in braces.stderr
    sqlite = f"sqlite:///{tmp_path / 'keys.sqlite3'}"
    refused = cli("keys", "list", "--database", sqlite, "--redis-prefix", redis_prefix)
    assert refused.returncode == 2 and "for a redis:// database" in refused.stderr


# -- writes that wait for replicas -------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"replicas": -1}, "replicas is the number of Redis replicas"),
        ({"replicas": 1.5}, "replicas is the number of Redis replicas"),
        ({"replicas": True}, "replicas is the number of Redis replicas"),
        ({"replicas": 1, "replica_timeout": 0}, "replica_timeout is a positive number"),
        ({"replicas": 1, "replica_timeout": float("nan")}, "replica_timeout is a positive"),
        ({"replicas": 1, "replica_timeout": float("inf")}, "replica_timeout is a positive"),
        ({"replicas": 1, "replica_timeout": 1.0}, r"must be shorter than the store's timeout"),
    ],
)
def test_a_replica_wait_that_makes_no_sense_is_refused(options: dict[str, Any], says: str) -> None:
    url = require(SHARED_URL)
    for make in (RedisStore, AsyncRedisStore):
        with pytest.raises(ConfigurationError, match=says):
            make(url, timeout=1.0, **options)


def test_a_replica_wait_is_read_from_the_url_and_kept_from_redis_py() -> None:
    url = require(SHARED_URL)
    with RedisStore(f"{url}?replicas=1&replica_timeout=0.2&socket_keepalive=true") as store:
        assert (store._wait.replicas, store._wait.timeout_ms) == (1, 200)
        kwargs = store.client.connection_pool.connection_kwargs
        assert "replicas" not in kwargs and kwargs["socket_keepalive"] is True
    with RedisStore(url, replicas=2) as store:  # half the timeout by default
        assert (store._wait.replicas, store._wait.timeout_ms) == (2, 500)
    with RedisStore(url) as store:
        assert store._wait.replicas == 0
    parsed = DatabaseUrl.parse(f"{url}?replicas=1")
    assert parsed.target.endswith("?replicas=1")


@pytest.mark.parametrize(
    ("query", "options", "says"),
    [
        ("?replicas=one", {}, "as in \\?replicas=1, not 'one'"),
        ("?replica_timeout=soon", {}, "as in \\?replica_timeout=0.5, not 'soon'"),
        ("?replicas=1", {"replicas": 1}, "both in the Redis URL and as an argument"),
        ("?replica_timeout=0.1", {"replica_timeout": 0.1}, "both in the Redis URL"),
    ],
)
def test_a_replica_wait_in_the_url_says_what_to_write(
    query: str, options: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        RedisStore(require(SHARED_URL) + query, **options)


def test_a_cluster_refuses_a_replica_wait() -> None:
    # Refused before the sync client discovers the cluster: no server needed.
    with pytest.raises(ConfigurationError, match="not supported on a Redis Cluster"):
        RedisStore("redis+cluster://127.0.0.1:1", replicas=1)
    with pytest.raises(ConfigurationError, match="not supported on a Redis Cluster"):
        AsyncRedisStore(redis.asyncio.RedisCluster(host="127.0.0.1", port=1), replicas=1)
