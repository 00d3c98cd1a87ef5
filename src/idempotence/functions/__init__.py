"""Guarded functions: ``@idempotent`` runs a function once per key (DESIGN 12).

See [`idempotent`][idempotence.functions.decorator.idempotent], and
``docs/how-to/functions.md`` for a tour.
"""

from __future__ import annotations

from ._guard import FUNCTION_FLOW, CallContext, current_call
from .decorator import idempotent

__all__ = ["FUNCTION_FLOW", "CallContext", "current_call", "idempotent"]
