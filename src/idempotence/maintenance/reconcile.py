"""The reconciliation hook (B5): compare local records with the foreign system's.

Idempotency keys make each side effect happen once; reconciliation checks that the two
sides agree anyway: a charge at the provider with no ride here (a local phase lost after
the call), or a ride here with no charge there. A flow declares how to list both sides
for a time window by registering a
[`Reconciler`][idempotence.maintenance.reconcile.Reconciler] under its name;
``idempotence reconcile FLOW --since 24h`` prints the differences.

```python
class Rides:
    def foreign_ids(self, since, until):
        return [c.metadata["ride"] for c in stripe.Charge.list(created={"gte": since})]
    def local_ids(self, since, until):
        return [r.id for r in Ride.objects.filter(created__gte=since, created__lt=until)]
reconcilers.register("rides", Rides())
reconcile(Rides(), since).foreign_only
# ('ride_81',)
```
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError


@runtime_checkable
class Reconciler(Protocol):
    """Lists the ids of one flow's records on both sides, for ``[since, until)``.

    Both methods must return the same kind of id (say, the ride id the charge
    carries in its metadata) so that the two sets can be compared.
    """

    def foreign_ids(self, since: datetime, until: datetime) -> Iterable[str]: ...

    def local_ids(self, since: datetime, until: datetime) -> Iterable[str]: ...


class ReconcilerRegistry:
    """Reconcilers by flow name."""

    def __init__(self) -> None:
        self._by_flow: dict[str, Reconciler] = {}

    def register(self, flow: Any, reconciler: Reconciler) -> Reconciler:
        """Register ``reconciler`` for ``flow`` (a [`Flow`][idempotence.testing.harness.Flow] or
        its name)."""
        name = flow if isinstance(flow, str) else flow.name
        if not isinstance(reconciler, Reconciler):
            raise ConfigurationError(
                f"the reconciler of flow {name!r} needs foreign_ids() and local_ids()"
            )
        self._by_flow[name] = reconciler
        return reconciler

    def get(self, flow: str) -> Reconciler:
        try:
            return self._by_flow[flow]
        except KeyError:
            known = ", ".join(sorted(self._by_flow)) or "none"
            raise ConfigurationError(
                f"no reconciler is registered for flow {flow!r} (registered: {known})"
            ) from None

    def __contains__(self, flow: object) -> bool:
        return flow in self._by_flow


reconcilers = ReconcilerRegistry()
"""The default registry."""


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The differences between the two sides for one window."""

    flow: str
    since: datetime
    until: datetime
    foreign_only: tuple[str, ...]
    """Foreign records with no local record: an effect we do not know about."""
    local_only: tuple[str, ...]
    """Local records with no foreign record: an effect that never happened."""
    matched: int
    """Ids found on both sides."""

    @property
    def clean(self) -> bool:
        return not self.foreign_only and not self.local_only


def reconcile(
    reconciler: Reconciler, since: datetime, until: datetime | None = None, *, flow: str = ""
) -> Reconciliation:
    """Compare both sides of ``reconciler`` for ``[since, until)`` (until: now)."""
    until = until if until is not None else datetime.now(UTC)
    if since >= until:
        raise ConfigurationError(f"the window is empty: since {since} is not before {until}")
    foreign = {str(i) for i in reconciler.foreign_ids(since, until)}
    local = {str(i) for i in reconciler.local_ids(since, until)}
    return Reconciliation(
        flow=flow,
        since=since,
        until=until,
        foreign_only=tuple(sorted(foreign - local)),
        local_only=tuple(sorted(local - foreign)),
        matched=len(foreign & local),
    )


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """A point in time from ``24h``, ``7d``, ``90m`` (ago) or an ISO 8601 time (UTC
    unless it says otherwise).

    ```python
    parse_since("2h", datetime(2024, 1, 1, 12, tzinfo=UTC)).hour
    # 10
    parse_since("2024-01-01T00:00").isoformat()
    # '2024-01-01T00:00:00+00:00'
    ```
    """
    text = text.strip()
    duration = _DURATION.fullmatch(text)
    if duration is not None:
        amount, unit = duration.groups()
        ago = timedelta(**{_UNITS[unit]: float(amount)})
        return (now or datetime.now(UTC)) - ago
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(
            f"not a time: {text!r}; use a duration ago (30m, 24h, 7d) or ISO 8601 "
            "(2024-05-01T00:00)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
