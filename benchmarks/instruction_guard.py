"""CI's guard against a slower request path: instructions a guarded request adds, counted
by callgrind, against a committed baseline.

Run it from the repository root::

    .venv/bin/python benchmarks/instruction_guard.py            # compare; exit 1 on a regression
    .venv/bin/python benchmarks/instruction_guard.py --update   # a new baseline: a reviewed commit
    .venv/bin/python benchmarks/instruction_guard.py --backend sqlite --json

Rows: ``handler``, ``replay`` and ``transaction`` (request-as-transaction) on PostgreSQL
and SQLite, ``handler`` and ``replay`` on Redis. A row's number is what the guard ADDS to
a request: the instructions per request of the guarded endpoint minus those of the same
endpoint unguarded (``handler`` and ``replay`` against the trivial endpoint, ``transaction``
against the endpoint doing its one INSERT in a transaction of its own), measured in the
same process, after the same set-up. The app, the store and the databases are
``profile_request.py``'s (``build_app``, ``targets``); the requests go in process through
``httpx.AsyncClient`` on an ``ASGITransport``, one at a time.

How it counts: one child process per backend runs under ``valgrind --tool=callgrind``. It
warms every endpoint up, then runs each phase (N requests to one endpoint) between two
marker calls (``Markers``), at each of which callgrind writes a dump and starts again
from zero: the dump after a phase holds that phase, every thread's work in it, and
nothing of the start-up, the imports or the warm-up. Instruction counts do not depend
on how busy the machine is, but some of the code counted reads the clock
(``steady_psycopg``), and threads wake by the clock too (the PostgreSQL store's
watchdog, every 0.25 s): runs on the shared 2-core machine at a load of 5 to 12
spread by 0.1 to 1.6 % per row (PostgreSQL the most), well inside the 10 % limit.

The comparison (``compare``) fails a row that grew more than ``--limit`` (10 %) over
``benchmarks/baseline/instructions.json`` and prints every row, every time. A row that
shrank passes; ``--update`` writes the new numbers, and that file changes only in a
commit of its own that says how it was produced (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline" / "instructions.json"
LIMIT = 0.10
SETUP = "bash benchmarks/setup.sh"

#: Endpoints of profile_request.build_app, by phase: (path, one key for every request).
PHASES: dict[str, tuple[str, bool]] = {
    "trivial": ("/trivial", False),
    "insert": ("/insert", False),
    "handler": ("/handler", False),
    "replay": ("/handler", True),
    "transaction": ("/tx", False),
}
#: row -> (backend, the guarded phase, the unguarded phase it is counted against)
ROWS: dict[str, tuple[str, str, str]] = {
    "postgres handler": ("postgres", "handler", "trivial"),
    "postgres replay": ("postgres", "replay", "trivial"),
    "postgres transaction": ("postgres", "transaction", "insert"),
    "sqlite handler": ("sqlite", "handler", "trivial"),
    "sqlite replay": ("sqlite", "replay", "trivial"),
    "sqlite transaction": ("sqlite", "transaction", "insert"),
    "redis handler": ("redis", "handler", "trivial"),
    "redis replay": ("redis", "replay", "trivial"),
}
BACKENDS = ("postgres", "sqlite", "redis")


# -- the comparison (pure) ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One row against its baseline."""

    row: str
    baseline: float | None
    now: float
    limit: float

    @property
    def change(self) -> float | None:
        """(now - baseline) / baseline; None without a baseline."""
        if self.baseline is None or self.baseline <= 0:
            return None
        return (self.now - self.baseline) / self.baseline

    @property
    def failed(self) -> bool:
        # A row without a baseline fails too: a new row gets one by a reviewed --update.
        if self.baseline is None or self.baseline <= 0:
            return True
        return self.now > self.baseline * (1 + self.limit)


def compare(baseline: dict[str, float], now: dict[str, float], limit: float) -> list[Verdict]:
    """Every measured row against the baseline's number for it (rows of the baseline
    that were not measured, another backend's, are not judged)."""
    return [Verdict(row, baseline.get(row), value, limit) for row, value in now.items()]


def table(verdicts: list[Verdict]) -> str:
    """The rows, as printed every time: row, baseline, now, change %."""
    lines = [f"{'row':<22} {'baseline':>12} {'now':>12} {'change':>9}"]
    for v in verdicts:
        before = "-" if v.baseline is None else f"{v.baseline:,.0f}"
        change = "no baseline" if v.change is None else f"{v.change * 100:+.2f} %"
        mark = f"  FAILED (> +{v.limit * 100:g} %)" if v.failed and v.change is not None else ""
        lines.append(f"{v.row:<22} {before:>12} {v.now:>12,.0f} {change:>9}{mark}")
    return "\n".join(lines)


def read_baseline(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    return {row: float(value) for row, value in json.loads(path.read_text())["rows"].items()}


def write_baseline(path: Path, rows: dict[str, float], args: argparse.Namespace) -> None:
    """The baseline with what produced it (a reviewer compares like with like)."""
    kept = read_baseline(path)  # rows of backends not measured this time stay
    kept.update({row: round(value) for row, value in rows.items()})
    produced = {
        "command": "python benchmarks/instruction_guard.py --update",
        "requests": args.requests,
        "warmup": args.warmup,
        "python": platform.python_version(),
        "valgrind": valgrind_version(),
        "psycopg": _version("psycopg"),
        "redis": _version("redis"),
        "hiredis": _version("hiredis"),  # redis-py parses replies with it when importable
        "sqlite": _sqlite_version(),
    }
    body = {"unit": "instructions added per request", "produced": produced}
    body["rows"] = {row: kept[row] for row in ROWS if row in kept}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")


def _version(distribution: str) -> str | None:
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(distribution)
    return None


def _sqlite_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version


# -- the child process (under callgrind) ------------------------------------------------------


class Markers:
    """A C function that nothing else in the process calls, called before and after
    each phase: callgrind writes a dump of its counters on entering libc's
    ``getpgrp`` (``--dump-before``) and starts them again from zero, so the dump after
    a phase holds that phase alone; the one before it, discarded, holds what came
    before (start-up, imports, warm-up, the heap's collection). A C function, since
    callgrind tells functions apart by symbol (every Python function is the
    interpreter's eval loop), called by the interpreter's own C code
    (``os.getpgrp``): through ctypes, libffi's call is not one callgrind sees as a call.

    Not ``--zero-before`` at the start: it zeroes the calling thread's counters only,
    and the other threads' work (SQLite's, on its executor) of the warm-up landed in
    the first phase. A dump writes and zeroes every thread's. A dump too many or too
    few fails the count, so a third caller of ``getpgrp`` would show."""

    DUMP = "getpgrp"

    @staticmethod
    def cut() -> None:
        os.getpgrp()

    @classmethod
    def options(cls) -> list[str]:
        return [f"--dump-before={cls.DUMP}"]


def steady_psycopg() -> list[str]:
    """Take the wall clock out of psycopg's async waits, in this process only.

    psycopg's ``wait_async`` (3.3) decides two things by the moment, not by the work:
    it yields to the event loop once ``MAX_BUSY_TIME`` (5 ms) has passed since it last
    did, and, before it waits on the loop, it polls the socket (``_ready``) and goes on
    at once if the server has answered already. Under callgrind the client runs some 50
    times slower, so both happen at random and each costs thousands of instructions.
    Here neither does: no yield for time spent, and the poll sees only whether the
    socket takes writes, so every read waits on the loop, as on a machine where the
    client is faster than the server's answer. psycopg has no public setting for this
    (``PSYCOPG_WAIT_FUNC`` picks the blocking wait function only), so these are its
    private names; the list says which were found, and the guard prints it.
    """
    from psycopg import waiting

    steadied = []
    if hasattr(waiting, "MAX_BUSY_TIME"):
        waiting.MAX_BUSY_TIME = math.inf
        steadied.append("MAX_BUSY_TIME")
    ready = getattr(waiting, "_ready", None)
    if ready is not None:

        def writable_only(fileno: int, wait: int) -> int:
            return int(ready(fileno, wait & waiting.WAIT_W)) if wait & waiting.WAIT_W else 0

        waiting._ready = writable_only  # type: ignore[attr-defined]
        steadied.append("_ready")
    return steadied


def phases_of(backend: str) -> list[str]:
    return [p for p in PHASES if any(r[0] == backend and p in r[1:] for r in ROWS.values())]


async def _run_phases(app: Any, phases: list[str], requests: int, warmup: int) -> None:
    import httpx

    body = json.dumps({"amount": 42}).encode()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://guard") as client:

        async def send(phase: str, key: str, measured: bool) -> None:
            path, replay = PHASES[phase]
            key = f"{phase}-settled" if replay else key  # settled by its first warm-up
            headers = {"idempotency-key": key, "content-type": "application/json"}
            response = await client.post(path, content=body, headers=headers)
            if response.status_code != 201:
                raise RuntimeError(f"{phase}: {path} answered {response.status_code}")
            if measured and replay != ("idempotent-replayed" in response.headers):
                raise RuntimeError(f"{phase}: replayed is not {replay} (P3)")

        # Keys are the same at every run (each run has fresh databases), so that even
        # their hashing costs the same.
        for phase in phases:
            for i in range(warmup):
                await send(phase, f"{phase}-w-{i:06d}", False)
        for phase in phases:
            gc.collect()  # every phase starts from the same heap, outside the count
            Markers.cut()
            for i in range(requests):
                await send(phase, f"{phase}-m-{i:06d}", True)
            Markers.cut()


def child(backend: str, target: str, requests: int, warmup: int) -> None:
    """Run in the callgrind process: the phases of one backend, one dump each."""
    from profile_request import build_app

    steadied = steady_psycopg() if backend == "postgres" else []
    app, store, closing = build_app(backend, target)

    async def main() -> None:
        try:
            await _run_phases(app, phases_of(backend), requests, warmup)
        finally:
            await store.close()
            for each in closing:
                await each.close()

    asyncio.run(main())
    print(json.dumps({"backend": backend, "phases": phases_of(backend), "steadied": steadied}))


# -- the parent --------------------------------------------------------------------------------


def valgrind_version() -> str | None:
    if shutil.which("valgrind") is None:
        return None
    done = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def count(backend: str, target: str, args: argparse.Namespace) -> dict[str, float]:
    """Instructions per request of each phase of ``backend``, from callgrind's dumps."""
    from profile_request import callgrind, total

    child = [sys.executable, str(Path(__file__).resolve()), "--child", backend]
    child += ["--target", target, "--requests", str(args.requests), "--warmup", str(args.warmup)]
    with tempfile.TemporaryDirectory() as folder:
        command = callgrind(os.path.join(folder, "callgrind.out"), child, *Markers.options())
        # The same string hashes at every run (dict and set layouts with them).
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the {backend} child failed:\n{done.stderr[-3000:]}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        dumps = sorted(Path(folder).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        # A dump before each phase (discarded) and one after it (the phase's).
        totals = [total(path.read_text()) for path in dumps[1::2]]
    phases = report["phases"]
    if len(dumps) != 2 * len(phases):
        raise RuntimeError(f"{backend}: {len(dumps)} callgrind dumps for {len(phases)} phases")
    args.steadied[backend] = report["steadied"]
    return {phase: n / args.requests for phase, n in zip(phases, totals, strict=True)}


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Every row of the chosen backends: the guarded phase minus its unguarded one."""
    from profile_request import targets

    rows: dict[str, float] = {}
    with targets(args.postgres, set(args.backend)) as found:
        for backend in args.backend:
            per = count(backend, found[backend], args)
            for row, (of, guarded, unguarded) in ROWS.items():
                if of == backend:
                    rows[row] = per[guarded] - per[unguarded]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="repeatable")
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--update", action="store_true", help="rewrite the baseline")
    parser.add_argument("--limit", type=float, default=LIMIT, help="growth that fails a row")
    parser.add_argument("--requests", type=int, default=100, help="per phase, counted")
    parser.add_argument("--warmup", type=int, default=30, help="per endpoint, not counted")
    parser.add_argument("--json", action="store_true", help="the verdicts as JSON")
    parser.add_argument(
        "--postgres",
        default=os.environ.get(
            "IDEMPOTENCE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.target, args.requests, args.warmup)
        return 0
    if shutil.which("valgrind") is None:
        print(f"valgrind is not installed: run `{SETUP}`", file=sys.stderr)
        return 2
    args.backend = args.backend or list(BACKENDS)
    args.steadied = {}
    now = measure(args)
    verdicts = compare(read_baseline(args.baseline), now, args.limit)
    if args.json:
        print(json.dumps([{**dataclasses.asdict(v), "change": v.change} for v in verdicts]))
    else:
        print(f"instructions a guarded request adds (callgrind), against {args.baseline}")
        print(table(verdicts))
        print(f"psycopg steadied: {args.steadied.get('postgres', '-')}")
    if args.update:
        write_baseline(args.baseline, now, args)
        print(f"baseline written: {args.baseline} (commit it on its own, saying how)")
        return 0
    failed = [v.row for v in verdicts if v.failed]
    if failed:
        print(f"FAILED: {', '.join(failed)} (limit +{args.limit * 100:g} %)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
