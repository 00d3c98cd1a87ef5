"""A fake mailer that records receipts, and the ``send_receipt`` job that uses it (R7).

The mailer is a foreign system like the payment provider: a SQLite file of its own,
outside the key store's transactions. It deduplicates by the job's ``job_key``, the
way a real email API deduplicates by an idempotency key: the job runner runs a job at
least once (a runner that dies mid-job runs it again), and a repeat must not send a
second receipt. It counts the repeats it absorbed, so the demo can show them.

```python
mailer = FakeMailer(tmp_path / "mailer.sqlite3")
mailer.send("rocket_rides-7-1-charge_created-send_receipt-0", ride_id=7, user="usr_1")
# True
mailer.send("rocket_rides-7-1-charge_created-send_receipt-0", ride_id=7, user="usr_1")
# False
```
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass

from idempotence.maintenance import Job, JobRegistry

__all__ = ["FakeMailer", "Receipt", "receipt_jobs"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS receipts (
    -- One receipt per job: a repeated delivery of the same job sends nothing new.
    job_key    TEXT    PRIMARY KEY,
    ride_id    INTEGER NOT NULL,
    user_id    TEXT    NOT NULL,
    charge_id  TEXT,
    -- Deliveries of this job, the first included.
    deliveries INTEGER NOT NULL DEFAULT 1,
    sent_at    REAL    NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Receipt:
    """One receipt the mailer sent."""

    job_key: str
    ride_id: int
    user_id: str
    charge_id: str | None
    deliveries: int
    sent_at: float


class FakeMailer:
    """Receipts in the SQLite file at ``path``; many processes may share it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    def send(self, job_key: str, *, ride_id: int, user: str, charge_id: str | None = None) -> bool:
        """Send the receipt of ``ride_id`` once per ``job_key``; True if it was sent now."""
        with self._connect() as conn:
            row = conn.execute(
                "INSERT INTO receipts (job_key, ride_id, user_id, charge_id, sent_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (job_key)"
                " DO UPDATE SET deliveries = deliveries + 1 RETURNING deliveries",
                (job_key, ride_id, user, charge_id, time.time()),
            ).fetchone()
        return bool(row[0] == 1)

    def receipts(self) -> list[Receipt]:
        """Every receipt sent, oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT job_key, ride_id, user_id, charge_id, deliveries, sent_at"
                " FROM receipts ORDER BY sent_at, job_key"
            ).fetchall()
        return [Receipt(*row) for row in rows]

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # Autocommit: every statement is its own transaction.
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        with closing(conn):
            yield conn


def receipt_jobs(mailer: FakeMailer) -> JobRegistry:
    """The job registry of the demo's runner: ``send_receipt`` through ``mailer``."""
    jobs = JobRegistry()

    @jobs.register("send_receipt")
    def send_receipt(job: Job) -> None:
        args = job.args
        mailer.send(
            job.job_key,
            ride_id=int(args["ride_id"]),
            user=args["user"],
            charge_id=args.get("charge_id"),
        )

    return jobs
