"""What the engine of a flow asks its driver to do (the driver is generated:
:mod:`._driver_async` and :mod:`._driver`)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..states import STARTED, ClaimRequest, KeyRecord, Lease, StoredResponse
from .contexts import FlowInfo, PhaseContext
from .results import FlowResult
from .steps import ATTEMPT_MARK, ForeignStep, PhaseFn

# -- effects: what the engine asks its driver to do ---------------------------------------


@dataclass(frozen=True, slots=True)
class DoClaim:
    request: ClaimRequest


@dataclass(frozen=True, slots=True)
class DoPhase:
    """Run ``fn`` in a transaction, then close the phase; the driver returns
    ``(PhaseResult, Lease)``."""

    fn: Callable[..., Any]
    context: PhaseContext
    with_result: bool

    def event(self, moment: str) -> str:
        """The observer's name for this phase at ``moment``, by its step's recovery
        point (a non-idempotent call's recording phase runs at an attempt point)."""
        point = self.context.lease.recovery_point.partition(ATTEMPT_MARK)[0]
        return f"phase:{point}:{moment}"


@dataclass(frozen=True, slots=True)
class DoCall:
    """Run a foreign call outside any transaction; the driver returns its value."""

    flow: FlowInfo
    step: ForeignStep
    record: KeyRecord
    lease: Lease

    def event(self, moment: str) -> str:
        return f"call:{self.step.name}:{moment}"


@dataclass(frozen=True, slots=True)
class DoInTransaction:
    """F3: claim, run ``fn`` and store its response in one transaction; the driver
    returns ``(Claim, PhaseResult | None)``."""

    request: ClaimRequest
    flow: FlowInfo
    fn: PhaseFn

    def event(self, moment: str) -> str:
        return f"phase:{STARTED}:{moment}"


@dataclass(frozen=True, slots=True)
class DoCheckpoint:
    lease: Lease
    recovery_point: str


@dataclass(frozen=True, slots=True)
class DoFinish:
    lease: Lease
    response: StoredResponse
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DoRelease:
    lease: Lease


@dataclass(frozen=True, slots=True)
class DoForget:
    lease: Lease


Effect: TypeAlias = (
    DoClaim | DoPhase | DoCall | DoInTransaction | DoCheckpoint | DoFinish | DoRelease | DoForget
)
Engine: TypeAlias = Generator[Effect, Any, FlowResult]
