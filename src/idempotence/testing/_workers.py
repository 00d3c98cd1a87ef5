"""The crash harness's workers: one run of the flow in a child process (F4).

This is the parent's side of `idempotence.testing._child`: it writes the child's
spec, starts it, and reads back what the child left in its files (the boundaries it
crossed, its result). The harness and tests use it through
`idempotence.testing.harness`, which re-exports its public names.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..flows import ResultKind
from ..states import StoredResponse

__all__ = ["Flavour", "KillPoint", "Worker", "WorkerResult", "spawn_worker"]

Flavour = Literal["sync", "async"]


@dataclass(frozen=True, order=True)
class KillPoint:
    """A boundary to kill at: the ``occurrence``-th time ``event`` is seen in a run."""

    event: str
    occurrence: int = 1

    def __str__(self) -> str:
        return self.event if self.occurrence == 1 else f"{self.event} (#{self.occurrence})"


@dataclass(frozen=True)
class WorkerResult:
    """How a worker's run ended (what the child reported)."""

    kind: ResultKind
    response: StoredResponse | None
    stored: bool
    error: str | None
    attempts: int


class Worker:
    """A child process running the target's flow once (or until final, ``retry``).

    Build it with [`spawn_worker`][idempotence.testing.harness.spawn_worker]. The child
    kills itself with SIGKILL at ``kill_at`` (exactly as a ``kill -9`` would, at an
    exact point), or stops itself with SIGSTOP at ``stop_at`` until
    [`resume`][idempotence.testing.Worker.resume] (a zombie: a worker frozen by a GC
    pause or a partition that wakes up later).
    """

    def __init__(self, spec: dict[str, Any], workdir: Path) -> None:
        self.spec = spec
        self._spec_path = workdir / "spec.json"
        self._spec_path.write_text(json.dumps(spec))
        self._stderr_path = workdir / "stderr.txt"
        env = dict(os.environ)
        # The child imports the factory's module the way this process does.
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with self._stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "idempotence.testing._child", str(self._spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                env=env,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the child to exit; kill it if it outlives ``timeout``."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    @property
    def killed(self) -> bool:
        """Whether the child died of SIGKILL."""
        return self.process.returncode == -signal.SIGKILL

    def events(self) -> list[KillPoint]:
        """The boundaries the child crossed, in order."""
        path = Path(self.spec["events"])
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [KillPoint(*json.loads(line)) for line in lines if line.strip()]

    def result(self) -> WorkerResult | None:
        """The child's result, or None if it died before reporting one."""
        path = Path(self.spec["result"])
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        response = None
        if data["status"] is not None:
            response = StoredResponse(
                status=data["status"],
                headers=tuple((str(k), str(v)) for k, v in data["headers"]),
                body=base64.b64decode(data["body"]),
            )
        return WorkerResult(
            kind=ResultKind(data["kind"]),
            response=response,
            stored=data["stored"],
            error=data["error"],
            attempts=data["attempts"],
        )

    def stderr(self) -> str:
        return self._stderr_path.read_text(errors="replace")

    def wait_stopped(self, timeout: float = 30.0) -> None:
        """Wait until the child has stopped itself at ``stop_at``."""
        stop = KillPoint(*self.spec["stop_at"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the worker exited ({self.process.returncode}) instead of stopping at "
                    f"{stop}:\n{self.stderr()}"
                )
            if stop in self.events() and _is_stopped(self.pid):
                return
            time.sleep(0.01)
        raise TimeoutError(f"the worker did not stop at {stop} within {timeout} s")

    def resume(self) -> None:
        """Wake a stopped child (SIGCONT)."""
        os.kill(self.pid, signal.SIGCONT)


def _is_stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:  # not Linux: the event was written just before the stop
        time.sleep(0.2)
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def spawn_worker(
    factory: str,
    config: Mapping[str, Any],
    *,
    scope: str,
    key: str,
    workdir: str | os.PathLike[str],
    kill_at: KillPoint | None = None,
    stop_at: KillPoint | None = None,
    retry: bool = False,
    flavour: Flavour = "sync",
    timeout: float = 60.0,
) -> Worker:
    """Start a child process that runs the target's flow for ``(scope, key)``.

    ``retry`` makes the child retry until the answer is final
    ([`settle`][idempotence.testing.harness.settle]); ``workdir`` (an empty directory)
    receives the child's spec, events and result.
    """
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "factory": factory,
        "config": dict(config),
        "scope": scope,
        "key": key,
        "kill_at": None if kill_at is None else [kill_at.event, kill_at.occurrence],
        "stop_at": None if stop_at is None else [stop_at.event, stop_at.occurrence],
        "retry": retry,
        "flavour": flavour,
        "timeout": timeout,
        "events": str(folder / "events.jsonl"),
        "result": str(folder / "result.json"),
    }
    return Worker(spec, folder)
