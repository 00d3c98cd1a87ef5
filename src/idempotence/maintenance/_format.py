"""How the CLI shows keys, counts and results: aligned tables for people, JSON for
machines. Pure functions; no I/O."""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ..states import KeyRecord, KeyState
from ._ops import KeyRow
from .admin import Stats
from .reconcile import Reconciliation


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell.

    ```python
    print(table(["A", "BB"], [["x", 1], ["yyy", 22]]))
    # A    BB
    # x    1
    # yyy  22
    ```
    """
    cells = [[str(c) for c in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def age(delta: timedelta | None) -> str:
    """A short human duration: ``45s``, ``12m``, ``3h05m``, ``4d02h``.

    ```python
    age(timedelta(hours=3, minutes=5))
    # '3h05m'
    ```
    """
    if delta is None:
        return "-"
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return "-" + age(-delta)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def keys_table(rows: Sequence[KeyRow]) -> str:
    return table(
        ["SCOPE", "KEY", "STATE", "FLOW", "POINT", "CALLING", "STATUS", "AGE", "TOKEN"],
        [
            [
                r.record.scope,
                r.record.key,
                r.state.value,
                r.record.flow,
                r.record.recovery_point,
                r.record.calling or "-",
                r.record.response.status if r.record.response else "-",
                age(r.now - r.record.created_at),
                r.record.lock_token,
            ]
            for r in rows
        ],
    )


def key_detail(row: KeyRow) -> str:
    """Every field of one key, one per line."""
    data = key_json(row, full=True)
    response = data.pop("response")
    lines = [f"{name:<19} {value}" for name, value in data.items() if name != "params"]
    lines.append(f"{'params':<19} {json.dumps(data['params'], sort_keys=True)}")
    if response is not None:
        lines.append(f"{'response.status':<19} {response['status']}")
        for name, value in response["headers"]:
            lines.append(f"{'response.header':<19} {name}: {value}")
        lines.append(f"{'response.body':<19} {response['body']}")
    return "\n".join(lines)


def key_json(row: KeyRow, *, full: bool = False) -> dict[str, Any]:
    r: KeyRecord = row.record
    data: dict[str, Any] = {
        "scope": r.scope,
        "key": r.key,
        "state": row.state.value,
        "flow": r.flow,
        "method": r.method,
        "path": r.path,
        "recovery_point": r.recovery_point,
        # The non-idempotent call begun at recovery_point and never recorded (R6).
        "calling": r.calling,
        "lock_token": r.lock_token,
        "locked_at": _time(r.locked_at),
        "lock_timeout_seconds": r.lock_timeout.total_seconds(),
        "created_at": _time(r.created_at),
        "last_run_at": _time(r.last_run_at),
        "finished_at": _time(r.finished_at),
        "expires_at": _time(r.expires_at),
        "status": r.response.status if r.response else None,
        "error": r.error,
        "completer_attempts": row.completer_attempts,
    }
    if full:
        data["id"] = r.id
        data["fingerprint"] = r.fingerprint
        data["params"] = r.params
        data["response"] = None
        if r.response is not None:
            data["response"] = {
                "status": r.response.status,
                "headers": [list(pair) for pair in r.response.headers],
                "body": _body(r.response.body),
            }
    return data


def stats_text(s: Stats) -> str:
    rows: list[list[object]] = [
        [state.value, s.states[state], age(s.now - s.oldest[state]) if state in s.oldest else "-"]
        for state in KeyState
    ]
    lines = [table(["STATE", "KEYS", "OLDEST"], rows), ""]
    lines.append(f"total keys       {s.total}")
    lines.append(f"oldest pending   {age(s.oldest_pending_age)}")
    lines.append(f"lock takeovers   {s.takeovers}")
    jobs = ", ".join(f"{n} {status}" for status, n in s.jobs.items())
    lines.append(f"jobs             {jobs}")
    return "\n".join(lines)


def stats_json(s: Stats) -> dict[str, Any]:
    pending = s.oldest_pending_age
    return {
        "now": _time(s.now),
        "states": {state.value: n for state, n in s.states.items()},
        "oldest": {state.value: _time(t) for state, t in s.oldest.items()},
        "oldest_pending_age_seconds": None if pending is None else pending.total_seconds(),
        "total": s.total,
        "takeovers": s.takeovers,
        "jobs": dict(s.jobs),
    }


def reconciliation_text(r: Reconciliation) -> str:
    lines = [
        f"flow {r.flow!r} from {r.since:%Y-%m-%d %H:%M:%S} to {r.until:%Y-%m-%d %H:%M:%S} UTC:",
        f"  {r.matched} matched, {len(r.foreign_only)} foreign without local, "
        f"{len(r.local_only)} local without foreign",
    ]
    lines += [f"  foreign without local: {i}" for i in r.foreign_only]
    lines += [f"  local without foreign: {i}" for i in r.local_only]
    return "\n".join(lines)


def to_json(value: Any) -> str:
    """JSON of a result dataclass (enums by value, times in ISO 8601)."""
    return json.dumps(_plain(value), sort_keys=True)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return _time(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _body(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(body).decode()
