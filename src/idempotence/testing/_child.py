"""The child process of the crash harness: ``python -m idempotence.testing._child SPEC``.

It builds the target from its factory, runs the flow once (or until final), reports
every boundary it crosses to the events file, and kills or stops itself where the
spec says. Events are written with ``os.write`` on an ``O_APPEND`` descriptor: a line
written is in the kernel before the SIGKILL that follows it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from ..flows import FlowResult
from .harness import load_target, settle


def main(spec_path: str) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    target = load_target(spec["factory"], spec["config"])
    kill_at = tuple(spec["kill_at"]) if spec["kill_at"] else None
    stop_at = tuple(spec["stop_at"]) if spec["stop_at"] else None
    events = os.open(spec["events"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seen: Counter[str] = Counter()

    def observer(event: str) -> None:
        seen[event] += 1
        os.write(events, (json.dumps([event, seen[event]]) + "\n").encode())
        if (event, seen[event]) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if (event, seen[event]) == stop_at:
            os.kill(os.getpid(), signal.SIGSTOP)

    target.instrument(observer)
    request = target.request(spec["scope"], spec["key"])
    timeout = float(spec["timeout"])

    if spec["flavour"] == "async":
        if target.open_async_store is None:
            raise SystemExit("the target has no open_async_store for an async run")
        with asyncio.Runner() as runner:
            astore = target.open_async_store()

            def attempt() -> FlowResult:
                coro = target.flow.run_async(astore, request, observer=observer)
                return runner.run(coro)

            result, attempts = _run(attempt, spec["retry"], timeout)
            runner.run(astore.close())
    else:
        store = target.open_store()

        def attempt() -> FlowResult:
            return target.flow.run(store, request, observer=observer)

        result, attempts = _run(attempt, spec["retry"], timeout)
        store.close()

    response = result.response
    report = {
        "kind": result.kind.value,
        "status": None if response is None else response.status,
        "headers": [] if response is None else [list(pair) for pair in response.headers],
        "body": "" if response is None else base64.b64encode(response.body).decode(),
        "stored": result.stored,
        "error": None if result.error is None else repr(result.error),
        "attempts": attempts,
    }
    partial = Path(spec["result"] + ".partial")
    partial.write_text(json.dumps(report))
    partial.replace(spec["result"])  # the parent never reads half a result
    return 0


def _run(attempt: Any, retry: bool, timeout: float) -> tuple[FlowResult, int]:
    if retry:
        return settle(attempt, timeout=timeout)
    return attempt(), 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
