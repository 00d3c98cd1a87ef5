"""What replication a PostgreSQL key store runs on, said once at start (DESIGN 13).

With synchronous replication a COMMIT returns only once a standby has it, so a
failover to that standby loses no finished key. With asynchronous replication (or a
``synchronous_commit`` below ``remote_write``) a promoted standby may lack the last
keys the old primary finished: their retries run again. The store logs which it
found on its first connection, and ``require_synchronous_standby=True`` refuses to
work without a synchronous standby (StoreUnavailable: 503), so a team that relies on
it learns at once when it is gone. The decision is pure (`describe`); the
statement reads only settings and ``pg_stat_replication``.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("idempotence.stores")

REPLICATION_SQL = """
SELECT current_setting('synchronous_standby_names') AS names,
       current_setting('synchronous_commit') AS commit_level,
       pg_is_in_recovery() AS in_recovery,
       (SELECT count(*) FROM pg_stat_replication) AS standbys,
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))
           AS synchronous,
       -- A role without pg_read_all_stats sees other sessions' columns as NULL.
       (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL) AS hidden
"""
"""One round trip: the settings, and the standbys that replicate synchronously now."""

_WAITING = frozenset({"on", "remote_write", "remote_apply"})
"""``synchronous_commit`` levels that wait for a synchronous standby."""


class Replication(enum.Enum):
    """The replication a store's COMMITs run on."""

    SYNCHRONOUS = "synchronous"
    """A synchronous standby acknowledges every COMMIT: a failover to it loses nothing."""
    ASYNCHRONOUS = "asynchronous"
    """Standbys stream, but COMMITs do not wait for them: a failover may lose the
    last finished keys, whose retries then run again."""
    WAITING = "waiting for a synchronous standby"
    """Synchronous standbys are named but none is connected: every COMMIT waits
    (until ``statement_timeout`` ends it)."""
    NONE = "none"
    """No standby: a failover is a restore."""
    UNKNOWN = "unknown"
    """The store's role may not read the standbys' state."""


@dataclass(frozen=True)
class ReplicationState:
    replication: Replication
    detail: str


def describe(row: dict[str, Any]) -> ReplicationState:
    """The replication described by `REPLICATION_SQL`'s row."""
    names = str(row.get("names") or "").strip()
    level = str(row.get("commit_level") or "on")
    standbys, synchronous = int(row.get("standbys") or 0), int(row.get("synchronous") or 0)
    if int(row.get("hidden") or 0):
        return ReplicationState(
            Replication.UNKNOWN,
            "the store's role cannot read pg_stat_replication: grant it pg_monitor",
        )
    if names and level in _WAITING:
        if synchronous:
            return ReplicationState(
                Replication.SYNCHRONOUS, f"{synchronous} synchronous standby(s) ({names})"
            )
        return ReplicationState(
            Replication.WAITING,
            f"synchronous_standby_names is {names!r} but no such standby is connected: "
            "every commit waits for one",
        )
    if standbys:
        why = "no synchronous_standby_names" if not names else f"synchronous_commit={level}"
        return ReplicationState(
            Replication.ASYNCHRONOUS,
            f"{standbys} asynchronous standby(s) ({why}): a failover may lose the last "
            "finished keys, and their retries would run again",
        )
    return ReplicationState(Replication.NONE, "no standby")


def report(state: ReplicationState, *, required: bool) -> str | None:
    """Log the replication found; the reason to refuse the connection, if ``required``
    and it is not synchronous."""
    if state.replication is Replication.SYNCHRONOUS:
        logger.info("PostgreSQL replication: %s", state.detail)
        return None
    if required:
        return (
            "PostgreSQL has no synchronous standby and the store was opened with "
            f"require_synchronous_standby=True ({state.detail})"
        )
    # A server with no standby is the common case and loses nothing to a failover it
    # cannot have: said at debug, so it does not precede every CLI command's output.
    log = logger.debug if state.replication is Replication.NONE else logger.warning
    log("PostgreSQL replication: %s: %s", state.replication.value, state.detail)
    return None
