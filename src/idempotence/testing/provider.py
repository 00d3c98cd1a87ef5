"""A fake payment provider that behaves like a real one, for tests of flows (R4, R6).

It keeps its charges in a SQLite file of its own: another database than the key
store's, as a real provider's is, so what it committed survives the killing of the
process that called it. It deduplicates by idempotency key the way Stripe does, and
it can be made to misbehave the way networks do.

```python
provider = FakeProvider(tmp_path / "provider.sqlite3")
first = provider.charge(2000, "tok_visa", idempotency_key="rides-1-charge")
again = provider.charge(2000, "tok_visa", idempotency_key="rides-1-charge")
first == again, len(provider.charges())
# (True, 1)
provider.charge(2000, "tok_declined").declined                # a result, not an error
# True
provider.fail_next(Fault.TIMEOUT_AFTER_COMMIT)                 # charged, then "timeout"
provider.before_commit = lambda charge: os.kill(os.getpid(), signal.SIGKILL)
```

Each call opens a connection of its own, so one provider can serve many threads and
many processes can share one file.
"""

from __future__ import annotations

import enum
import os
import secrets
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Charge", "FakeProvider", "Fault", "IdempotencyKeyReused", "ProviderError"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fakepay_charges (
    id              TEXT    PRIMARY KEY,
    -- A provider's own dedup: one charge per key, whatever happens to the caller.
    idempotency_key TEXT    UNIQUE,
    amount          INTEGER NOT NULL,
    card            TEXT    NOT NULL,
    reference       TEXT,
    status          TEXT    NOT NULL,
    created_at      REAL    NOT NULL
);
-- Every request received, charged or not: how many times a caller really called.
CREATE TABLE IF NOT EXISTS fakepay_requests (
    id              INTEGER PRIMARY KEY,
    idempotency_key TEXT,
    reference       TEXT,
    amount          INTEGER NOT NULL,
    card            TEXT    NOT NULL,
    received_at     REAL    NOT NULL
);
"""


class Fault(enum.Enum):
    """A failure to inject into the next call (see
    [`FakeProvider.fail_next`][idempotence.testing.provider.FakeProvider.fail_next])."""

    RESET_BEFORE_COMMIT = "reset_before_commit"
    """The connection drops before the provider commits: nothing is charged, but the
    caller cannot tell (``ConnectionResetError``, indeterminate to it)."""
    RESET_AFTER_COMMIT = "reset_after_commit"
    """The provider commits the charge, then the connection drops
    (``ConnectionResetError``): the caller cannot tell it was charged."""
    TIMEOUT_AFTER_COMMIT = "timeout_after_commit"
    """The provider commits the charge, then the caller times out (``TimeoutError``)."""
    SERVER_ERROR = "server_error"
    """The provider answers 500 and charges nothing
    ([`ProviderError`][idempotence.testing.provider.ProviderError])."""


class ProviderError(Exception):
    """The provider answered with an error status: nothing was charged."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class IdempotencyKeyReused(ProviderError):
    """The idempotency key was first used with other parameters (a 400, as Stripe's)."""

    def __init__(self, key: str) -> None:
        super().__init__(
            400,
            f"idempotency key {key!r} was first used with different parameters; "
            "an idempotency key names one request",
        )
        self.key = key


@dataclass(frozen=True, slots=True)
class Charge:
    """One charge as the provider recorded it."""

    id: str
    amount: int
    card: str
    status: str
    """``"succeeded"`` or ``"declined"``."""
    idempotency_key: str | None
    reference: str | None
    """The caller's reference (metadata), for reconciliation."""
    created_at: float

    @property
    def declined(self) -> bool:
        return self.status == "declined"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


CommitHook = Callable[[Charge], None]
"""Called with the charge just before, or just after, the provider commits it."""


class FakeProvider:
    """A payment provider in a SQLite file of its own.

    ``latency`` (seconds) delays every call, as a network would. ``before_commit``
    and ``after_commit`` are called around the provider's own commit of a new
    charge, in the caller's process: a crash harness kills the caller there, to see
    what a flow makes of a charge that did, or did not, happen.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        latency: float = 0.0,
        before_commit: CommitHook | None = None,
        after_commit: CommitHook | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.latency = latency
        self.before_commit = before_commit
        self.after_commit = after_commit
        self._faults: deque[Fault] = deque()
        self._faults_lock = threading.Lock()
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"FakeProvider({self.path!r})"

    # -- faults ----------------------------------------------------------------------

    def fail_next(self, fault: Fault, times: int = 1) -> None:
        """Make the next ``times`` calls of this provider object fail with ``fault``."""
        with self._faults_lock:
            self._faults.extend([fault] * times)

    def _next_fault(self) -> Fault | None:
        with self._faults_lock:
            return self._faults.popleft() if self._faults else None

    # -- the API ---------------------------------------------------------------------

    def charge(
        self,
        amount: int,
        card: str,
        idempotency_key: str | None = None,
        *,
        reference: str | None = None,
    ) -> Charge:
        """Charge ``amount`` (in cents) to ``card``.

        With an ``idempotency_key`` already used, nothing new is charged: the first
        charge comes back if the parameters are the same, and
        [`IdempotencyKeyReused`][idempotence.testing.provider.IdempotencyKeyReused] is
        raised if they differ. A card whose name ends in ``declined`` is declined: the
        declined charge is recorded (and replayed under its key) and returned, not
        raised. Without a key, every call charges.
        """
        self._record_request(amount, card, idempotency_key, reference)
        if self.latency:
            time.sleep(self.latency)
        fault = self._next_fault()
        if fault is Fault.SERVER_ERROR:
            raise ProviderError(500, "internal error; nothing was charged")
        with self._connect() as conn, self._write(conn):
            if idempotency_key is not None:
                existing = self._by_key(conn, idempotency_key)
                if existing is not None:
                    if (existing.amount, existing.card, existing.reference) != (
                        amount,
                        card,
                        reference,
                    ):
                        raise IdempotencyKeyReused(idempotency_key)
                    return self._respond(existing, fault)
            charge = Charge(
                id=f"ch_{secrets.token_hex(8)}",
                amount=amount,
                card=card,
                status="declined" if card.endswith("declined") else "succeeded",
                idempotency_key=idempotency_key,
                reference=reference,
                created_at=time.time(),
            )
            conn.execute(
                "INSERT INTO fakepay_charges (id, idempotency_key, amount, card, reference,"
                " status, created_at) VALUES (:id, :idempotency_key, :amount, :card,"
                " :reference, :status, :created_at)",
                asdict(charge),
            )
            if self.before_commit is not None:
                self.before_commit(charge)
            if fault is Fault.RESET_BEFORE_COMMIT:
                raise ConnectionResetError("connection reset by peer (nothing was charged)")
        # Committed: from here on the charge exists whatever befalls the caller.
        if self.after_commit is not None:
            self.after_commit(charge)
        return self._respond(charge, fault)

    def charges(self, *, reference: str | None = None) -> list[Charge]:
        """Every charge, oldest first (only ``reference``'s if given): for
        reconciliation against the caller's records (B5)."""
        sql = "SELECT * FROM fakepay_charges"
        params: dict[str, Any] = {}
        if reference is not None:
            sql += " WHERE reference = :reference"
            params["reference"] = reference
        with self._connect() as conn:
            rows = conn.execute(sql + " ORDER BY created_at, id", params).fetchall()
        return [_charge(row) for row in rows]

    def received(self, *, reference: str | None = None, idempotency_key: str | None = None) -> int:
        """How many charge requests arrived (for ``reference`` or ``idempotency_key``
        if given), whatever became of them."""
        sql = "SELECT count(*) FROM fakepay_requests WHERE 1 = 1"
        params: dict[str, Any] = {}
        if reference is not None:
            sql += " AND reference = :reference"
            params["reference"] = reference
        if idempotency_key is not None:
            sql += " AND idempotency_key = :key"
            params["key"] = idempotency_key
        with self._connect() as conn:
            count: int = conn.execute(sql, params).fetchone()[0]
        return count

    # -- internals -------------------------------------------------------------------

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.row_factory = sqlite3.Row
        with closing(conn):
            yield conn

    @staticmethod
    @contextmanager
    def _write(conn: sqlite3.Connection) -> Iterator[None]:
        # IMMEDIATE: two racing calls with one key are serialised, so the second
        # finds the first's charge instead of making its own.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _record_request(
        self, amount: int, card: str, key: str | None, reference: str | None
    ) -> None:
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO fakepay_requests (idempotency_key, reference, amount, card,"
                " received_at) VALUES (?, ?, ?, ?, ?)",
                (key, reference, amount, card, time.time()),
            )

    @staticmethod
    def _by_key(conn: sqlite3.Connection, key: str) -> Charge | None:
        row = conn.execute(
            "SELECT * FROM fakepay_charges WHERE idempotency_key = ?", (key,)
        ).fetchone()
        return None if row is None else _charge(row)

    @staticmethod
    def _respond(charge: Charge, fault: Fault | None) -> Charge:
        # A replay (nothing new to commit) drops its connection like any other answer.
        if fault is Fault.RESET_AFTER_COMMIT or fault is Fault.RESET_BEFORE_COMMIT:
            raise ConnectionResetError("connection reset by peer (after the charge)")
        if fault is Fault.TIMEOUT_AFTER_COMMIT:
            raise TimeoutError("the provider did not answer in time (after the charge)")
        return charge


def _charge(row: sqlite3.Row) -> Charge:
    return Charge(
        id=row["id"],
        amount=row["amount"],
        card=row["card"],
        status=row["status"],
        idempotency_key=row["idempotency_key"],
        reference=row["reference"],
        created_at=row["created_at"],
    )
