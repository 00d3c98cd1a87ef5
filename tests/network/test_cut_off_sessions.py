"""A session the partition cut off mid-batch gives its row back within the bound
(DESIGN 13).

The store sends a request-as-transaction claim in a pipeline: BEGIN and the claim, then
a Sync. A partition between the claim and the Sync leaves the server's session
"active", reading the rest of the batch, with the claim's row lock held: no
``statement_timeout`` runs (the statement is done) and no
``idle_in_transaction_session_timeout`` (the session is not idle). Only the server's
side of the TCP connection can notice the client is gone; with the system's keepalive
(two hours by default) every retry of that key was told 409 for as long
(``benchmarks/faults.py`` found such keys). The store's sessions set the server's
keepalives and user timeout to the bound, so the server drops the connection, and
rolls the claim back, within about the bound.

The app here is a process in the app host's namespace that sends such a batch with
the store's own connection settings, over the back link to a cluster that listens on
it (no relay: the relay's kernel would answer the server's keepalives). Without the
server-side settings the row stays locked past the test's bound.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg

from .hosts import ROOT, AppHost

BOUND = 1.0
#: The server notices within its keepalive idle time plus its user timeout (about
#: two bounds); slack for a machine shared by many test runs.
RELEASED_WITHIN = 2 * BOUND + 4.0

CHILD = """
import sys, time
import psycopg
from idempotence.stores.postgres._store_shared import connection_options, session_settings

url, bound = sys.argv[1], float(sys.argv[2])
conn = psycopg.connect(url, **connection_options(1.0, bound))
conn.execute(session_settings(bound))  # what the store's pool runs on a new connection
pg = conn.pgconn
pg.enter_pipeline_mode()
pg.send_query_params(b"BEGIN", None)
pg.send_query_params(b"UPDATE cut_rows SET n = n + 1 WHERE id = 1", None)
pg.send_flush_request()
while pg.flush():
    pass
print("sent", flush=True)  # and no Sync: the batch is cut off here
time.sleep(120)
"""


def row_locked(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            with conn.transaction():
                conn.execute("SELECT 1 FROM cut_rows WHERE id = 1 FOR UPDATE NOWAIT")
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_a_session_cut_off_mid_batch_releases_its_row_within_the_bound(
    app_host: AppHost,
) -> None:
    with app_host.database() as (over_link, local):
        with psycopg.connect(local, autocommit=True) as conn:
            conn.execute("CREATE TABLE cut_rows (id INT PRIMARY KEY, n INT NOT NULL)")
            conn.execute("INSERT INTO cut_rows VALUES (1, 0)")
        child = subprocess.Popen(
            [*app_host.exec_prefix(), sys.executable, "-c", CHILD, over_link, str(BOUND)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "sent", "the app's batch was not sent"
            # The server ran the UPDATE and waits for the rest of the batch.
            deadline = time.monotonic() + 10
            while not row_locked(local):
                assert time.monotonic() < deadline, "the batch never locked the row"
                time.sleep(0.05)
            with psycopg.connect(local, autocommit=True) as conn:
                state = conn.execute(
                    "SELECT state, wait_event FROM pg_stat_activity WHERE client_addr = %s",
                    (app_host.back.ns_ip,),
                ).fetchone()
            assert state == ("active", "ClientRead"), state
            with app_host.back.partitioned():
                cut = time.monotonic()
                while row_locked(local):
                    took = time.monotonic() - cut
                    assert took < RELEASED_WITHIN, (
                        f"the cut-off session still held the row {took:.1f} s into the partition"
                    )
                    time.sleep(0.1)
                released = time.monotonic() - cut
            print(f"the row was released {released:.2f} s into the partition")
        finally:
            child.kill()
            child.wait(timeout=10)
