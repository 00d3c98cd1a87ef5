"""A PostgreSQL primary and a streaming standby on this machine (issue 35 item 4).

Two throwaway clusters (tests/support/postgres.py's machinery): the primary, and a
standby made from it by ``pg_basebackup``, streaming as ``application_name=standby1``.
With ``synchronous=True`` the primary names it in ``synchronous_standby_names``, so a
COMMIT returns only once the standby has the WAL. :meth:`Pair.fail_over` kills the
primary (``pg_ctl stop -m immediate``) and promotes the standby, as an operator would:
the standby's configuration is the primary's copy, so a synchronous pair's new
primary still waits for a standby that no longer exists (every COMMIT blocks: the
case of an unbounded wait that ``statement_timeout`` bounds).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.support.postgres import (
    BASE_DIR_PREFIX,
    PostgresUnavailable,
    _Cluster,
    _server_user,
    _tail,
    find_bindir,
)

STANDBY = "standby1"


@dataclass
class Pair:
    primary: _Cluster
    standby: _Cluster
    synchronous: bool

    @property
    def url(self) -> str:
        """A multi-host URL: libpq tries both and takes the one that accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            "/postgres?target_session_attrs=read-write&connect_timeout=2"
        )

    def primary_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary.port}/postgres"

    def standby_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby.port}/postgres"

    def replication_state(self) -> str | None:
        with psycopg.connect(self.primary_url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", (STANDBY,)
            ).fetchone()
        return None if row is None else str(row[0])

    @contextlib.contextmanager
    def lagging(self) -> Iterator[None]:
        """The standby behind for the block: its WAL receiver SIGSTOPped, and the
        primary's WAL sender for it ended, so none of the WAL the primary writes in
        the block reaches it, even after it resumes if the primary is gone by then (an
        asynchronous primary commits on; a synchronous one's COMMITs wait). SIGSTOP
        alone is no lag: the kernel takes the stream into the stopped receiver's
        socket, and it reads it all once resumed."""
        with psycopg.connect(self.standby_url(), autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
        assert row is not None, "the standby has no WAL receiver"
        pid = int(row[0])
        os.kill(pid, signal.SIGSTOP)
        try:
            with psycopg.connect(self.primary_url(), autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def kill_primary(self) -> None:
        self.primary.halt("immediate")  # the primary's host is gone

    def promote(self) -> None:
        result = self.standby.run(
            self.standby.bindir / "pg_ctl", "-D", self.standby.data, "-w", "-t", "30", "promote"
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl promote failed: {_tail(result)}")

    def forget_standby(self) -> None:
        """The operator's step after promoting a synchronous pair's standby: the new
        primary no longer waits for the standby it was."""
        with psycopg.connect(self.standby_url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")

    def fail_over(self) -> None:
        self.kill_primary()
        self.promote()


@contextlib.contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[Pair]:
    bindir = find_bindir()
    user = _server_user()
    primary = _Cluster(Path(tempfile.mkdtemp(prefix=BASE_DIR_PREFIX)), bindir, user)
    standby = _Cluster(Path(tempfile.mkdtemp(prefix=BASE_DIR_PREFIX)), bindir, user)
    try:
        primary.prepare(allow_copy=False)
        primary.init(
            {
                "fsync": "off",
                "wal_level": "replica",
                "max_wal_senders": "5",
                "hot_standby": "on",
                "synchronous_commit": "on",
                "synchronous_standby_names": STANDBY if synchronous else "",
            }
        )
        port = primary.start()
        standby.prepare(allow_copy=False)
        conninfo = f"host=127.0.0.1 port={port} user=postgres application_name={STANDBY}"
        result = standby.run(
            bindir / "pg_basebackup",
            *("-D", standby.data, "-d", conninfo, "-R", "-X", "stream", "--no-sync"),
            timeout=120,
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"pg_basebackup failed: {_tail(result)}")
        standby.start()
        pair = Pair(primary, standby, synchronous)
        deadline = time.monotonic() + 30
        want = "sync" if synchronous else "async"
        while pair.replication_state() != want:
            if time.monotonic() > deadline:
                raise PostgresUnavailable(f"the standby never reached state {want!r}")
            time.sleep(0.1)
        yield pair
    finally:
        for cluster in (standby, primary):
            cluster.stop()
            shutil.rmtree(cluster.base, ignore_errors=True)
