"""The peers, side by side in one run: the same FastAPI app and handler guarded by
idemkit 1.0.2 and by idempotence, on PostgreSQL and Redis.

Run it from the repository root::

    .venv/bin/python benchmarks/peers.py             # every guard, about 4 minutes
    .venv/bin/python benchmarks/peers.py --quick     # a smoke run, about 40 seconds
    .venv/bin/python benchmarks/peers.py --postgres-kind machine --json

The peers are never the package's dependencies: ``bash benchmarks/setup.sh`` installs
``benchmarks/requirements.txt`` (idemkit, asyncpg, redis, uvloop, httptools) into
``benchmarks/.deps`` with ``pip install --target``, and the script appends that
directory to the server processes' ``sys.path``, so every guard runs on the same
FastAPI, Starlette, uvicorn, uvloop and httptools.

Guards (``--guard``, repeatable; all by default), each in a uvicorn process of its own:

``ours-pg``        idempotence's middleware, handler mode, ``AsyncPostgresStore`` (psycopg)
``idemkit-pg``     idemkit's ``IdempotencyMiddleware`` with ``PostgresBackend`` (asyncpg)
``ours-redis``     idempotence on Redis, ``AsyncRedisStore`` (redis-py), when
                   ``open_async_store("redis://...")`` works in this checkout (else
                   skipped with a printed line)
``ours-cached``    idempotence, ``AsyncCachedStore``: ``AsyncPostgresStore`` with the
                   redis-server in front of it for replays (likewise skipped)
``idemkit-redis``  idemkit with ``RedisBackend`` (redis-py)

Every guard gets its own database (PostgreSQL: a database of one cluster, by default a
throwaway one with fsync=off and synchronous_commit=off, as the peers' own benchmarks
run it; ``--postgres-kind machine`` uses ``--postgres`` as configured. Redis: one
throwaway redis-server, a database number per guard) and both tenancy settings say
"one tenant" explicitly. Rows per guard: ``trivial`` (the same endpoint without the
middleware, in the same process: the baseline), ``handler`` (a unique key per request),
``replay`` (one key throughout), and ``trivial``/``handler`` at one connection
(latency). The summary compares our handler and replay ratios with idemkit's on the
same database, in the same run.
"""

import argparse
import contextlib
from typing import Any

import _harness as harness

GUARDS = ("ours-pg", "idemkit-pg", "ours-redis", "idemkit-redis", "ours-cached")
#: The guards that need our Redis store (skipped, with a line, in a checkout without).
ON_REDIS = ("ours-redis", "ours-cached")


def rows(server: str) -> list[harness.Row]:
    row = harness.Row
    return [
        row(server, "trivial", "/plain/trivial", None),
        row(server, "handler", "/guarded/handler", "trivial"),
        row(server, "replay", "/guarded/handler", "trivial", fixed=True),
        row(server, "trivial", "/plain/trivial", None, connections=1),
        row(server, "handler", "/guarded/handler", "trivial", connections=1),
    ]


# -- the server process ------------------------------------------------------------------------


def build_app(guard: str, target: str, cache: str | None) -> Any:
    if guard.startswith("ours-"):
        return harness.trivial_app(harness.our_guard(harness.our_store(target, cache)))
    import idemkit
    from idemkit.backends.postgres import PostgresBackend
    from idemkit.backends.redis import RedisBackend

    backend: Any
    if guard == "idemkit-pg":
        backend = PostgresBackend.from_url(target, max_size=20)
    else:
        backend = RedisBackend.from_url(target)

    def guard_app(app: Any) -> None:
        config = idemkit.HttpConfig(scope_mode="single_tenant")
        app.add_middleware(idemkit.IdempotencyMiddleware, backend=backend, config=config)

    return harness.trivial_app(guard_app)


# -- the driver ----------------------------------------------------------------------------------


def prepare(guard: str, target: str) -> None:
    """The guard's schema: our migrations, idemkit's ``init_pg``."""
    if guard in ("ours-pg", "ours-cached"):
        from idempotence.stores.postgres import PostgresStore

        with PostgresStore(target) as store:
            store.migrate()
        harness.in_service(target)
    elif guard == "idemkit-pg":
        import asyncio

        from idemkit.backends.postgres import init_pg

        asyncio.run(init_pg(target))


def start(
    guards: list[str], args: argparse.Namespace, stack: contextlib.ExitStack
) -> dict[str, harness.Server]:
    servers: dict[str, harness.Server] = {}
    throwaways = harness.Throwaways(stack)
    admin, kind = args.postgres, "the machine's PostgreSQL as configured"
    if any(g.endswith(("-pg", "-cached")) for g in guards) and args.postgres_kind == "fast":
        admin = throwaways.fast_cluster()
        kind = "throwaway PostgreSQL cluster, fsync=off, synchronous_commit=off"
    for number, guard in enumerate(guards):
        meter: harness.Meter
        arguments = ["--guard", guard]
        if guard.endswith(("-pg", "-cached")):
            label = guard.replace("-", "_")
            dsn, dbname = stack.enter_context(harness.postgres_database(admin, label))
            target, what = harness.url_of(dsn), kind
            meter = harness.PostgresMeter(admin, dbname)
            stack.callback(meter.close)
        if guard.endswith(("-redis", "-cached")):
            redis, pid = throwaways.redis()
            redis_meter = harness.ProcessMeter("redis", pid)
            if guard.endswith("-redis"):
                target, what, meter = f"{redis}/{number}", "throwaway redis-server", redis_meter
            else:
                arguments += ["--cache", f"{redis}/{number}"]
                what += " + throwaway redis-server (replays)"
                meter = harness.Meters(meter, redis_meter)
        prepare(guard, target)
        port, pid = stack.enter_context(
            harness.app_server(__file__, [*arguments, "--target", target])
        )
        servers[guard] = harness.Server(guard, port, pid, meter, f"{what}; {driver(guard)}")
    return servers


def driver(guard: str) -> str:
    return {
        "ours-pg": "idempotence (psycopg)",
        "idemkit-pg": "idemkit 1.0.2 (asyncpg)",
        "ours-redis": "idempotence (redis-py)",
        "ours-cached": "idempotence, AsyncCachedStore (psycopg, redis-py)",
        "idemkit-redis": "idemkit 1.0.2 (redis-py)",
    }[guard]


#: What the summary compares: (our guard, idemkit's, the row).
PAIRS = (
    ("ours-pg", "idemkit-pg", "handler"),
    ("ours-redis", "idemkit-redis", "handler"),
    ("ours-pg", "idemkit-pg", "replay"),
    ("ours-redis", "idemkit-redis", "replay"),
    ("ours-cached", "idemkit-redis", "replay"),
)


def compare(table: list[dict[str, Any]]) -> list[str]:
    """Our guards' ratios against idemkit's for the same row, on the same database
    (the cached store's replays, from Redis, against idemkit's on Redis)."""
    ratio = {(r["server"], r["row"]): r["ratio"] for r in table if r["ratio"]}
    lines = []
    for ours_name, theirs_name, row in PAIRS:
        ours, theirs = ratio.get((ours_name, row)), ratio.get((theirs_name, row))
        if ours and theirs:
            lines.append(
                f"{row:<8} {ours_name} / {theirs_name}: ratio {ours:.2f} / {theirs:.2f} "
                f"= {ours / theirs:.2f}x"
            )
    return lines


def main() -> None:
    def serve_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--guard", required=True, choices=GUARDS)
        parser.add_argument("--target", required=True)
        parser.add_argument("--cache", help="ours-cached: the Redis URL of the cache")

    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--guard", action="append", choices=GUARDS, help="repeatable")
        parser.add_argument("--postgres-kind", choices=("fast", "machine"), default="fast")

    def app(args: argparse.Namespace) -> Any:
        return build_app(args.guard, args.target, args.cache)

    args = harness.command_line(__doc__ or "", serve_options, options, app)
    if args is None:
        return
    guards = harness.without_missing_redis(args.guard or list(GUARDS), *ON_REDIS)
    with contextlib.ExitStack() as stack:
        servers = start(guards, args, stack)
        table = harness.measure(servers, [r for g in guards for r in rows(g)], args)
    head = "peers: " + harness.head(args, "1 process per guard")
    harness.emit(table, servers, args, head, compare(table))


if __name__ == "__main__":
    main()
