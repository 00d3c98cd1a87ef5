"""What a step of a flow is handed: its context, and the observer of a run (F4)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..states import KeyRecord, Lease


class FlowInfo(Protocol):
    """What the steps and the driver of a flow know of it (a
    [`Flow`][idempotence.testing.harness.Flow])."""

    name: str

    @property
    def steps(self) -> Mapping[str, Any]: ...

    def key_for(self, key_id: int, name: str) -> str: ...


# -- contexts ---------------------------------------------------------------------------


@dataclass(slots=True)
class PhaseContext:
    """What an atomic phase gets: the key, and the transaction to write in."""

    flow: FlowInfo
    record: KeyRecord
    lease: Lease
    tx: Any
    """The phase's transaction: ``Transaction`` or ``AsyncTransaction``."""
    result: Any = None
    """For the phase that records a foreign call: the call's return value."""
    jobs: list[tuple[str, str, Any]] = field(default_factory=list)

    @property
    def params(self) -> Any:
        """The request parameters stored at the first claim."""
        return self.record.params

    def key_for(self, name: str) -> str:
        """The derived idempotency key of foreign call ``name`` (R4)."""
        return self.flow.key_for(self.lease.id, name)

    def stage(self, name: str, args: Any = None, *, job_key: str | None = None) -> None:
        """Stage job ``name`` with JSON ``args``: it commits with this phase (R7).

        Its ``job_key`` (the runner's dedup id) is derived from the key row, the
        phase and the job's place in it unless given.
        """
        json.dumps(args)  # fail in the phase, not at commit, on unserialisable args
        # The token keeps a phase that runs again in a later attempt (after a NoOp)
        # from colliding with the job it staged the first time.
        lease = self.lease
        place = f"{lease.id}-{lease.token}-{lease.recovery_point}-{name}-{len(self.jobs)}"
        key = job_key or f"{self.flow.name}-{place}"
        self.jobs.append((key, name, args if args is not None else {}))


@dataclass(slots=True)
class ForeignContext:
    """What a foreign call gets: the key, its derived keys, and a heartbeat (F2).

    ``heartbeat()`` extends the lock (fenced); on an async store it is a coroutine
    function. A call that outlasts the lock timeout must beat, or another worker may
    take the key over and the recording phase will be refused (F1).
    """

    flow: FlowInfo
    record: KeyRecord
    lease: Lease
    heartbeat: Callable[[], Any]

    @property
    def params(self) -> Any:
        return self.record.params

    def key_for(self, name: str) -> str:
        return self.flow.key_for(self.lease.id, name)


# -- observing a run (F4) -----------------------------------------------------------------


class Observer(Protocol):
    """Called with the name of each boundary a run crosses (see the module docstring).

    It runs on the worker's own thread, inside the phase's transaction for
    ``before_commit``: keep it quick, and let it raise only to abort the run.
    """

    def __call__(self, event: str, /) -> None: ...
