"""The steps a flow is made of: atomic phases and foreign calls (R1-R4, R6)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..errors import Indeterminate
from .contexts import ForeignContext, PhaseContext
from .results import PhaseResult

# -- steps ------------------------------------------------------------------------------

PhaseFn: TypeAlias = Callable[[PhaseContext], "PhaseResult | Awaitable[PhaseResult]"]
CallFn: TypeAlias = Callable[[ForeignContext], Any]
RecordFn: TypeAlias = Callable[[PhaseContext, Any], "PhaseResult | Awaitable[PhaseResult]"]


@dataclass(frozen=True, slots=True)
class AtomicStep:
    recovery_point: str
    fn: PhaseFn


@dataclass(frozen=True, slots=True)
class ForeignStep:
    recovery_point: str
    name: str
    call: CallFn
    record: RecordFn
    idempotent: bool


Step: TypeAlias = AtomicStep | ForeignStep

#: Separates a recovery point from the foreign call a non-idempotent step has begun.
ATTEMPT_MARK = "~calling:"


def attempt_point(recovery_point: str, name: str) -> str:
    """The recovery point committed just before a non-idempotent call (R6)."""
    return f"{recovery_point}{ATTEMPT_MARK}{name}"


#: A foreign call's failures that leave its outcome unknown (R6).
INDETERMINATE = (Indeterminate, TimeoutError, ConnectionError)
