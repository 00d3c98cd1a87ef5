"""Guarded requests against a key table of 10 million keys, and against an empty one,
in the same run.

Run it from the repository root::

    .venv/bin/python benchmarks/large_table.py                  # 10,000,000 keys, ~15 minutes
    .venv/bin/python benchmarks/large_table.py --keys 1000000   # a smaller table
    .venv/bin/python benchmarks/large_table.py --quick          # 100,000 keys, a smoke run

One throwaway PostgreSQL cluster (fsync=off, as ``http_bench.py``'s ``pg-fast``) holds
two databases, each migrated and served by its own ``http_bench.py`` app server (uvicorn,
uvloop, httptools; the same FastAPI endpoints and middleware):

``empty``  the key table with the thousand finished keys of ``http_bench.py``'s
           databases (a table in service has statistics);
``full``   the key table filled with ``--keys`` finished keys over a thousand scopes,
           half of them past their expiry and not yet reaped (``reaper.py``'s fill),
           then ``VACUUM ANALYZE`` and a ``CHECKPOINT``.

Rows on each, as in ``http_bench.py``: ``trivial`` and ``insert`` (baselines: no
middleware), ``handler`` (a new key per request: the claim and the finish) and
``transaction`` (request-as-transaction). The rows run in interleaved rounds across both
servers, so both tables share whatever else the machine does. Below the table, per
guarded row: full / empty for req/s and for p99. Targets (issue #34): req/s >= 0.8 of
the empty table's, p99 at most 1.5x. The script measures; it does not judge.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import _harness as harness

#: The guarded rows compared across the two tables, and their baselines.
ROWS = (("trivial", None), ("handler", "trivial"), ("insert", None), ("transaction", "insert"))
PATHS = {
    "trivial": "/plain/trivial",
    "handler": "/guarded/handler",
    "insert": "/plain/insert",
    "transaction": "/guarded/tx",
}
GUARDED = ("handler", "transaction")


def full_against_empty(table: list[dict[str, Any]]) -> list[str]:
    """Each guarded row on the full table over the same row on the empty one."""
    found = {(row["server"], row["row"]): row for row in table}
    lines = []
    for name in GUARDED:
        full, empty = found.get(("full", name)), found.get(("empty", name))
        if not (full and empty and empty["rps"] and empty["p99_us"]):
            continue
        lines.append(
            f"{name}: full / empty req/s = {full['rps'] / empty['rps']:.2f} (target >= 0.8),"
            f" p99 = {full['p99_us'] / empty['p99_us']:.2f}x (target <= 1.5x)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000_000, help="keys in the full table")
    harness.add_options(parser)
    args = parser.parse_args()
    harness.use_repo()
    harness.use_deps()
    if args.quick:
        args.keys = min(args.keys, 100_000)
    harness.apply_quick(args)
    harness.ensure_wrk()
    import http_bench
    import reaper

    servers: dict[str, harness.Server] = {}
    rows: list[harness.Row] = []
    with contextlib.ExitStack() as stack:
        admin = harness.Throwaways(stack).fast_cluster()
        for name in ("empty", "full"):
            url, dbname = stack.enter_context(harness.postgres_database(admin, f"table_{name}"))
            http_bench.migrate("postgres", url)
            what = "the key table in service (1,000 keys)"
            if name == "full":
                seconds = reaper.fill(url, args.keys)
                what = f"{args.keys:,} keys (half expired), filled in {seconds:.0f} s"
            meter = harness.PostgresMeter(admin, dbname)
            stack.callback(meter.close)
            arguments = ["--backend", "postgres", "--target", url]
            port, pid = stack.enter_context(harness.app_server(http_bench.__file__, arguments))
            servers[name] = harness.Server(name, port, pid, meter, f"{what}; fsync=off cluster")
            rows += [harness.Row(name, row, PATHS[row], baseline) for row, baseline in ROWS]
        table = harness.measure(servers, rows, args)
    head = harness.head(args, "1 process") + f"; {args.keys:,} keys in the full table"
    harness.emit(table, servers, args, head, full_against_empty(table))


if __name__ == "__main__":
    main()
