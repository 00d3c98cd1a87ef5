"""The store operations, written once, without I/O.

Each operation is a generator: it yields [`Query`][idempotence.stores.sql.Query] objects
and receives their rows back, and returns its result. A thin runner (`connection_async`,
`connection`) runs it on a sync or an async connection, so the logic of every store
exists exactly once and the sync and async stores cannot drift. A
[`Dialect`][idempotence.stores.sql.Dialect] holds what differs between databases: the
query file, value conversions, and the shape of the claim.
"""

from __future__ import annotations

import abc
import functools
import json
from dataclasses import replace
from datetime import datetime, timedelta
from importlib.resources.abc import Traversable
from typing import Any, ClassVar, TypeVar

from ... import _queries
from ..._frozen import quick_new
from ..._json import writer
from ...errors import LockLost, SchemaMissing, StoreError
from ...states import (
    STARTED,
    Claim,
    ClaimRequest,
    KeyRecord,
    KeyStatus,
    Lease,
    Outcome,
    StagedJob,
    StoredResponse,
    arbitrate,
    claim_from,
    new_response,
)
from .._fenced import lost as _lost
from . import batch_plan as _batch
from .query import APPLICATION as APPLICATION
from .query import Op as Op
from .query import Query as Query
from .query import Row as Row
from .query import new_query as new_query
from .transactions import TransactionStatements, savepoint_name

T = TypeVar("T")

_new_record = quick_new(KeyRecord)

MAX_CLAIM_ATTEMPTS = 8
"""A claim that keeps meeting rows committed after its snapshot gives up after this
many statements. Each retry needs a new concurrent change of the same key, so in
practice the second statement settles it."""


class Dialect(abc.ABC):
    """What one database needs that the others do not."""

    name: ClassVar[str]
    claim_is_one_statement: ClassVar[bool]
    """True when the claim is a single statement that is atomic on its own (it then
    runs in autocommit, one round trip); False when the driver must wrap it in a
    write transaction."""
    previews_claims: ClassVar[bool] = False
    """True when a claim should first be tried as a plain read (claim_preview), so
    that replays and conflicts never take the write lock (SQLite)."""
    reads_before_insert: ClassVar[bool] = False
    """True when the claim in a transaction (claim_in_transaction) reads the key with a
    locking read first and inserts only a key it did not find (MariaDB: an INSERT that
    looked for the key itself would hold InnoDB's table-wide AUTO_INCREMENT lock while
    it waited for a row lock). The unique constraint still decides a race; the loser's
    transaction fails and runs again."""
    sql_folder: ClassVar[Traversable | None] = None
    """Where the dialect's SQL files are (``queries.sql``, ``schema.sql`` and
    ``migrations/``). None: the package's own ``idempotence/sql/<name>/``, as for the
    built-in dialects; a dialect outside the package names a folder of its own, such
    as ``importlib.resources.files("mypackage") / "sql"``."""

    begin_statement: ClassVar[str] = "BEGIN"
    """The statement that opens a write transaction of the store's own (SQLite's
    ``BEGIN IMMEDIATE`` takes the write lock at once)."""

    def __init__(self) -> None:
        self.queries = _queries.load(self.folder())

    @classmethod
    def transaction_statements(cls, nested: bool) -> TransactionStatements:
        """The statements of a transaction for a connection that sends its own: a
        write transaction, or a savepoint of a new name when one is open
        (``nested``)."""
        if not nested:
            return TransactionStatements(cls.begin_statement, "COMMIT", ("ROLLBACK",))
        return cls.savepoint_statements(savepoint_name())

    @classmethod
    def savepoint_statements(cls, name: str) -> TransactionStatements:
        """The statements of savepoint ``name`` (SQL's own, unless the database's
        differ)."""
        return TransactionStatements(
            f"SAVEPOINT {name}", f"RELEASE SAVEPOINT {name}", (f"ROLLBACK TO SAVEPOINT {name}",)
        )

    def folder(self) -> Traversable:
        """The folder of this dialect's SQL files (see
        [`sql_folder`][idempotence.stores.sql.Dialect.sql_folder])."""
        return _queries.folder(self.name if self.sql_folder is None else self.sql_folder)

    def query(self, name: str, /, **params: Any) -> Query:
        return new_query(name, self.queries[name], params)

    def query_with(self, name: str, params: dict[str, Any]) -> Query:
        """`query` with its parameters in a dict, used as it is (not copied)."""
        return new_query(name, self.queries[name], params)

    def application(self, sql: str, params: Any) -> Query:
        """The application's own statement (``tx.execute``), its ``:name``
        placeholders written the way the driver takes them."""
        return new_query(APPLICATION, sql, params or {})

    # -- value conversions ------------------------------------------------------------

    @abc.abstractmethod
    def timestamp(self, value: Any) -> datetime:
        """A database timestamp as an aware UTC datetime."""

    @abc.abstractmethod
    def duration_in(self, value: timedelta | None) -> Any:
        """A duration as the database stores it."""

    @abc.abstractmethod
    def duration_out(self, value: Any) -> timedelta:
        """A stored duration back as a timedelta."""

    def optional_timestamp(self, value: Any) -> datetime | None:
        return None if value is None else self.timestamp(value)

    @staticmethod
    def json_out(value: Any) -> Any:
        # psycopg parses jsonb itself; SQLite hands back text. Most keys store no
        # parameters and no headers: those need no parser.
        if value == "{}":
            return {}
        if value == "[]":
            return []
        # Text (bytes on a SQL_ASCII PostgreSQL), or what the driver parsed already.
        return json.loads(value) if isinstance(value, str | bytes) else value

    def record(self, row: Row) -> KeyRecord:
        """Build a [`KeyRecord`][idempotence.testing.harness.KeyRecord] from a row of
        the key table."""
        if "calling" not in row:
            # The newest column of the key table is missing: a schema older than this
            # release (the statements read ``k.*``). Fail closed, as a statement that
            # names a missing column does.
            raise SchemaMissing(
                "The key store's schema is older than this release (the key table has "
                "no column 'calling'): run `idempotence migrate --database URL`"
            )
        timestamp = self.timestamp
        response = None
        if row["response_status"] is not None:
            headers = self.json_out(row["response_headers"]) or []
            response = new_response(
                row["response_status"],
                tuple((str(k), str(v)) for k, v in headers),
                bytes(row["response_body"] or b""),
            )
        # Every field, in KeyRecord's order, past the class call: once per claim.
        return _new_record(
            row["id"],
            row["scope"],
            row["key"],
            row["request_method"],
            row["request_path"],
            row["fingerprint"],
            self.json_out(row["request_params"]),
            row["flow"],
            row["recovery_point"],
            row["lock_token"],
            None if (value := row["locked_at"]) is None else timestamp(value),
            self.duration_out(row["lock_timeout"]),
            response,
            row["error"],
            timestamp(row["created_at"]),
            None if (value := row["last_run_at"]) is None else timestamp(value),
            None if (value := row["finished_at"]) is None else timestamp(value),
            None if (value := row["expires_at"]) is None else timestamp(value),
            row["calling"],
        )

    def claim_params(self, request: ClaimRequest) -> dict[str, Any]:
        return {
            "scope": request.scope,
            "key": request.key,
            "method": request.method,
            "path": request.path,
            "fingerprint": request.fingerprint,
            # An empty dict is most claims' (an HTTP handler's): json.dumps with
            # separators builds an encoder per call.
            "params": "{}"
            if request.params == {}
            else json.dumps(request.params, separators=(",", ":")),
            "flow": request.flow,
            "lock_timeout": self.duration_in(request.lock_timeout),
            "retention": self.duration_in(request.retention),
        }

    @abc.abstractmethod
    def claim(self, request: ClaimRequest, finished: StoredResponse | None = None) -> Op[Claim]:
        """Claim ``request``'s key: exactly one outcome (DESIGN 4). Given ``finished``
        (only in the transaction the claim opens), a key it takes is written finished
        with that response in the same transaction (see ``claim_finished``)."""

    def batch(self, queries: list[Query]) -> Query:
        """``queries`` (of one kind and one scope) as the one statement that runs them
        all: the query file's ``<name>_batch`` (DESIGN 11, see `batch_plan`)."""
        name = f"{queries[0].name}_batch"
        return Query(name, self.queries[name], _batch.params(queries))

    def script_statements(self, script: str) -> list[str]:
        """A migration script as the statements the driver can run one call each."""
        return [script]


# -- operations shared by every SQL dialect --------------------------------------------


def _fenced(lease: Lease) -> dict[str, Any]:
    # The key as well as the id: see SESSION_PLANNING in stores/postgres/_store_shared.py.
    return {"scope": lease.scope, "key": lease.key, "id": lease.id, "token": lease.token}


def refuse_after_finished_claim(
    claim: Claim | None, lease: Lease, operation: str, instrumentation: Any = None
) -> None:
    """Refuse at once a fenced write of ``lease``'s key in the transaction whose claim
    (``claim``, the transaction's) already wrote that key finished
    (``transaction(finished=...)``): the database would refuse any fenced write of the
    finished row, at the COMMIT for a finish deferred to it, after the application's
    statements ran. Reported to ``instrumentation`` as any refused fenced write."""
    if claim is None or claim.lease is None or not claim.record.finished:
        return
    if (claim.lease.scope, claim.lease.key) != (lease.scope, lease.key):
        return
    lost = LockLost(
        f"cannot {operation} key {lease.key!r} in scope {lease.scope!r}: the claim that "
        "opened this transaction wrote it finished (transaction(finished=...)), so "
        "nothing may finish or checkpoint it again; this transaction must roll back",
        scope=lease.scope,
        key=lease.key,
        token=lease.token,
    )
    if instrumentation is not None:
        instrumentation.lock_lost(operation, lost)
    raise lost


def checkpoint(
    d: Dialect, lease: Lease, recovery_point: str, calling: str | None = None
) -> Op[Lease]:
    """Record ``recovery_point`` as reached, fenced by the lease (R2, F1).

    ``calling`` names the non-idempotent foreign call about to begin (R6); any other
    checkpoint clears it.
    """
    rows = yield d.query(
        "checkpoint", recovery_point=recovery_point, calling=calling, **_fenced(lease)
    )
    if not rows:
        raise _lost(lease, f"checkpoint {recovery_point!r} for")
    return lease.advanced(recovery_point, calling)


def finish(d: Dialect, lease: Lease, response: StoredResponse, error: str | None) -> Op[None]:
    """Store the response and unlock, fenced (P3, R5, R6)."""
    rows = yield d.query_with("finish", _finish_params(lease, response, error))
    if not rows:
        raise _lost(lease, "finish")


def finish_times(
    d: Dialect, lease: Lease, response: StoredResponse, error: str | None
) -> Op[tuple[datetime, datetime | None]]:
    """`finish`, handing back the finished row's ``finished_at`` and
    ``expires_at``, the database's own times: with the claim's record, the finished
    record that a cache in front of the store keeps for replays (``CachedStore``),
    without reading the whole row back. Its statement is named ``finish``, so it
    batches with the plain finishes (DESIGN 11: ``finish_batch`` returns both times)."""
    sql = _returning_times(d.queries["finish"])
    rows = yield Query("finish", sql, _finish_params(lease, response, error))
    if not rows:
        raise _lost(lease, "finish")
    return d.timestamp(rows[0]["finished_at"]), d.optional_timestamp(rows[0]["expires_at"])


def _finish_params(lease: Lease, response: StoredResponse, error: str | None) -> dict[str, Any]:
    # The response's dict, added to: one dict made, not three.
    params = _response_params(response)
    params["error"] = error
    params.update(_fenced(lease))
    return params


# json.dumps's own output (its defaults), by a writer made once: json.dumps builds an
# encoder at every call. Pairs of strings cannot hold a cycle (the one check dropped).
_write_headers = writer()


def _response_params(response: StoredResponse) -> dict[str, Any]:
    headers = response.headers
    return {
        "status": response.status,
        # No headers (a consumer's acknowledgement): no writer call at all.
        "headers": _write_headers([list(pair) for pair in headers]) if headers else "[]",
        "body": response.body,
    }


@functools.cache
def _returning_times(statement: str) -> str:
    # The same statement as ``finish``, returning the two times it sets as well as
    # its id: one text in queries.sql, so the two cannot drift. The plain finish keeps
    # returning only the id, so a store without a cache parses no more than it did.
    head, found, tail = statement.rpartition("RETURNING id")
    if not found or tail.strip():
        raise AssertionError(f"the finish query no longer ends with RETURNING id: {statement}")
    return head + "RETURNING id, finished_at, expires_at"


def end_phase(
    d: Dialect,
    lease: Lease,
    jobs: list[tuple[str, str, Any]],
    recovery_point: str | None,
    response: StoredResponse | None,
) -> Op[Lease]:
    """Close a phase in its transaction: stage its jobs, then, as the last statement,
    either store ``response`` or checkpoint ``recovery_point`` (R2, R7, F1)."""
    yield from stage_jobs(d, lease, jobs)
    if response is not None:
        yield from finish(d, lease, response, None)
        return lease.advanced("finished")
    return (yield from checkpoint(d, lease, recovery_point or lease.recovery_point))


def batch(d: Dialect, queries: list[Query]) -> Op[list[list[Row]]]:
    """Run ``queries`` (of one kind and one scope) as one statement; the rows each
    would have returned (DESIGN 11). One of them goes out as itself."""
    if len(queries) == 1:
        return [(yield queries[0])]
    rows = yield d.batch(queries)
    return _batch.split(rows, len(queries))


def release(d: Dialect, lease: Lease) -> Op[None]:
    """Unlock without finishing, fenced (R5)."""
    rows = yield d.query("release", **_fenced(lease))
    if not rows:
        raise _lost(lease, "release")


def heartbeat(d: Dialect, lease: Lease) -> Op[datetime]:
    """Refresh the lock, fenced (F2); returns the new ``locked_at``."""
    rows = yield d.query("heartbeat", **_fenced(lease))
    if not rows:
        raise _lost(lease, "heartbeat")
    return d.timestamp(rows[0]["locked_at"])


def migrate(d: Dialect, *, upto: str | None = None) -> Op[list[str]]:
    """Apply the dialect's pending migrations in one transaction; return their versions.
    Given ``upto``, only those up to that version (a Django migration's, see
    `idempotence.contrib.django_app`)."""
    yield d.query("migrations_prepare")
    applied = {row["version"] for row in (yield d.query("migrations_applied"))}
    done = []
    for version, script in _queries.migrations(d.folder()):
        if version in applied or (upto is not None and version > upto):
            continue
        for statement in d.script_statements(script):
            yield Query(f"migration {version}", statement, {})
        yield d.query("migrations_record", version=version)
        done.append(version)
    return done


def pending_migrations(d: Dialect) -> Op[list[str]]:
    """The versions of the dialect's migrations not applied yet, read only (a schema
    never migrated fails with the driver's missing-table error: ``SchemaMissing``)."""
    applied = {row["version"] for row in (yield d.query("migrations_applied"))}
    return [version for version, _ in _queries.migrations(d.folder()) if version not in applied]


def forget(d: Dialect, lease: Lease) -> Op[None]:
    """Delete a key that never got past ``started``, fenced (R5: rejected requests
    store nothing)."""
    rows = yield d.query("forget", **_fenced(lease))
    if not rows:
        raise _lost(lease, "forget")


def stage_jobs(d: Dialect, lease: Lease, jobs: list[tuple[str, str, Any]]) -> Op[None]:
    """Insert ``(job_key, name, args)`` jobs in the phase's transaction (R7)."""
    for job_key, name, args in jobs:
        yield d.query(
            "stage_job",
            job_key=job_key,
            scope=lease.scope,
            key_id=lease.id,
            name=name,
            args=json.dumps(args, separators=(",", ":")),
        )


def take_staged_jobs(d: Dialect, limit: int) -> Op[list[StagedJob]]:
    """Remove up to ``limit`` staged jobs in the caller's transaction and return them."""
    rows = yield d.query("take_staged_jobs", limit=limit)
    return [
        StagedJob(
            id=row["id"],
            job_key=row["job_key"],
            scope=row["scope"],
            key_id=row["key_id"],
            name=row["name"],
            args=d.json_out(row["args"]),
            created_at=d.timestamp(row["created_at"]),
        )
        for row in sorted(rows, key=lambda row: row["id"])
    ]


def get(d: Dialect, scope: str, key: str) -> Op[KeyRecord | None]:
    rows = yield d.query("get", scope=scope, key=key)
    return d.record(rows[0]) if rows else None


def key_status(d: Dialect, scope: str, key: str) -> Op[KeyStatus | None]:
    """The key's status on the database clock: the ``get`` query reads the row and
    the database's time in one statement, so the state (EXPIRED past ``expires_at``,
    PROCESSING under a live lock) is the one a claim at that moment would see."""
    rows = yield d.query("get", scope=scope, key=key)
    if not rows:
        return None
    return KeyStatus.of(d.record(rows[0]), d.timestamp(rows[0]["db_now"]))


# -- the two shapes of claim ------------------------------------------------------------


def claim_in_one_statement(
    d: Dialect, request: ClaimRequest, finished: StoredResponse | None = None
) -> Op[Claim]:
    """The claim as one INSERT ... ON CONFLICT statement (PostgreSQL); with
    ``finished``, the ``claim_finished`` statement, which writes the key it takes
    finished with that response.

    See the ``claim`` query for why a statement can come back empty or stale; both
    are answered by running it again, which is safe because a statement that did not
    take the key changed nothing.
    """
    params = d.claim_params(request)
    name = "claim"
    if finished is not None:
        name = "claim_finished"
        params.update(_response_params(finished))
    for _ in range(MAX_CLAIM_ATTEMPTS):
        rows = yield d.query_with(name, params)
        if not rows:
            continue
        row = rows[0]
        record, now = d.record(row), d.timestamp(row["db_now"])
        if row["claimed"]:
            return claim_from(record, request.fingerprint, now, claimed=True)
        if arbitrate(record, request.fingerprint, now) is Outcome.EXECUTE:
            continue  # an older version of a row that changed since the snapshot
        return claim_from(record, request.fingerprint, now, claimed=False)
    raise StoreError(
        f"the claim of key {request.key!r} did not settle after {MAX_CLAIM_ATTEMPTS} "
        "statements; the key is changing faster than it can be read",
        scope=request.scope,
        key=request.key,
    )


def claim_preview(d: Dialect, request: ClaimRequest) -> Op[Claim | None]:
    """Decide a claim from a plain read when the read alone can decide it.

    REPLAY and MISMATCH read settled facts (a finished key stays finished, a fingerprint
    never changes); IN_PROGRESS may be a moment stale, which only costs the client a
    retry. A claim that may take the key returns None: it must be decided again inside
    the write transaction
    ([`claim_in_transaction`][idempotence.stores.sql.claim_in_transaction]), so P6
    holds.
    """
    rows = yield d.query("claim_read", scope=request.scope, key=request.key)
    if not rows:
        return None
    record, now = d.record(rows[0]), d.timestamp(rows[0]["db_now"])
    if arbitrate(record, request.fingerprint, now) is Outcome.EXECUTE:
        return None
    return claim_from(record, request.fingerprint, now, claimed=False)


HELD_RETRY_AFTER = 1.0
"""Retry-After, in seconds, for a key that another request's open transaction holds
before its claim committed: how long that transaction will run is not known."""


def claim_held(d: Dialect, request: ClaimRequest) -> Op[Claim]:
    """The claim of a key whose row another open transaction holds (F8).

    Run once the claim that would have waited for that transaction rolled back: the
    key's last committed version still decides what it can (P2 a mismatch, P3 a
    replay, since a fingerprint never changes and a finished key stays finished);
    otherwise the key is in progress in that transaction (P4), which may still roll
    back, so the caller is told to come back (``held``), never that it may execute.
    """
    rows = yield d.query("claim_held", scope=request.scope, key=request.key)
    row, now = rows[0], d.timestamp(rows[0]["db_now"])
    if row["id"] is not None:
        record = d.record(row)
        if arbitrate(record, request.fingerprint, now) is not Outcome.EXECUTE:
            claim = claim_from(record, request.fingerprint, now, claimed=False)
            return replace(claim, held=claim.outcome is Outcome.IN_PROGRESS)
    else:
        # Not committed yet: the key as the holder's claim wrote it, as far as this
        # request can tell (the same key and scope; the holder's fingerprint is
        # unknown until it commits, and a retry then checks it).
        record = KeyRecord(
            id=0,
            scope=request.scope,
            key=request.key,
            method=request.method,
            path=request.path,
            fingerprint=request.fingerprint,
            params=request.params,
            flow=request.flow,
            recovery_point=STARTED,
            lock_token=1,
            locked_at=now,
            lock_timeout=request.lock_timeout,
            response=None,
            error=None,
            created_at=now,
            last_run_at=now,
            finished_at=None,
            expires_at=None,
        )
    return Claim(Outcome.IN_PROGRESS, record, retry_after=HELD_RETRY_AFTER, held=True)


def claim_in_transaction(
    d: Dialect, request: ClaimRequest, finished: StoredResponse | None = None
) -> Op[Claim]:
    """The claim as write-or-read-decide-write inside one write transaction (SQLite);
    with ``finished``, a key it takes is written finished with that response, in the
    same transaction.

    The driver runs it under an exclusive write lock (BEGIN IMMEDIATE), so its
    statements are one serializable unit and no other writer can interleave (P6): a
    new key is inserted at once; the insert of a key that exists does nothing, and the
    key is read and decided (``arbitrate``), then taken over if it may be.
    """
    rows = []
    if d.reads_before_insert:
        rows = yield d.query("claim_read", scope=request.scope, key=request.key)
    if not rows:
        params = d.claim_params(request)
        if finished is None:
            rows = yield d.query_with("claim_insert", params)
        else:
            rows = yield d.query("claim_insert_finished", **params, **_response_params(finished))
        if rows:
            return claim_from(
                d.record(rows[0]), request.fingerprint, d.timestamp(rows[0]["db_now"]), claimed=True
            )
        rows = yield d.query("claim_read", scope=request.scope, key=request.key)
    record, now = d.record(rows[0]), d.timestamp(rows[0]["db_now"])
    if arbitrate(record, request.fingerprint, now) is not Outcome.EXECUTE:
        return claim_from(record, request.fingerprint, now, claimed=False)
    rows = yield d.query(
        "claim_take_over",
        scope=request.scope,
        id=record.id,
        lock_timeout=d.duration_in(request.lock_timeout),
    )
    taken = claim_from(
        d.record(rows[0]), request.fingerprint, d.timestamp(rows[0]["db_now"]), claimed=True
    )
    if finished is None:
        return taken
    assert taken.lease is not None
    yield from finish(d, taken.lease, finished, None)
    # The claim's record is the finished row, as PostgreSQL's claim_finished returns it.
    rows = yield d.query("claim_read", scope=request.scope, key=request.key)
    return claim_from(
        d.record(rows[0]), request.fingerprint, d.timestamp(rows[0]["db_now"]), claimed=True
    )
