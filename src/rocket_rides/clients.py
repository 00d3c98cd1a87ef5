"""Simulated Rocket Rides clients: book rides, retry through everything, keep count.

Each client books its share of the rides one after another. A ride is one
Idempotency-Key, and the client retries it, with the same key and the same body, until
it gets a final answer (201 or 402) or runs out of patience:

* a dropped connection (the worker was killed, or is restarting), a timeout, a 5xx:
  back off exponentially, with jitter, and try again, on any worker;
* 409 (the key is in progress, perhaps held by a worker that just died): wait for
  ``Retry-After`` and try again;
* anything else (400, 401, 422...) is a bug in the demo or the library: counted,
  not retried.

Some first attempts go out twice at once (two copies racing, P4), some requests carry
a crash order (:mod:`.chaos`), and after a final answer a client sometimes asks again
to check that the replay is the same response, marked ``Idempotent-Replayed``. After a
failed attempt a client may also walk away for good, as real clients do: the key is
then the completer's to finish (B2).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .chaos import CRASH_HEADER, POINTS

__all__ = ["ClientStats", "Outcome", "Ride", "Workload", "make_workload", "run_clients"]

#: The share of rides whose first attempt is sent twice at once.
TWIN_RATE = 0.1
#: The share of rides asked again after their final answer, to check the replay.
REPLAY_CHECK_RATE = 0.25
#: A client gives up on a ride after this many attempts or this many seconds; the
#: completer then finishes it (B2).
MAX_ATTEMPTS = 60
RIDE_PATIENCE = 40.0
REQUEST_TIMEOUT = 10.0
_FINAL = (201, 402)


@dataclass(frozen=True, slots=True)
class Ride:
    """One ride to book: its key, rider and body."""

    key: str
    api_key: str
    scope: str
    body: dict[str, float]
    #: Send the body form-encoded, like Stripe's clients, instead of as JSON.
    form: bool


@dataclass(frozen=True, slots=True)
class Workload:
    """The rides of one run, and how the clients send them."""

    run: str
    rides: tuple[Ride, ...]
    clients: int
    crash_rate: float
    seed: int
    #: The probability that a client walks away from a ride after a failed attempt.
    abandon_rate: float = 0.0

    @property
    def key_prefix(self) -> str:
        """What every Idempotency-Key of this run starts with."""
        return f"demo-{self.run}-"


def make_workload(
    *,
    run: str,
    rides: int,
    clients: int,
    crash_rate: float,
    declined_rate: float,
    seed: int,
    abandon_rate: float = 0.0,
) -> Workload:
    """``rides`` rides for random riders around Paris; about ``declined_rate`` of them
    by riders whose card is declined. The same ``seed`` makes the same rides."""
    rng = random.Random(seed)
    planned = []
    for n in range(rides):
        rider = rng.randint(1, 100)
        declined = rng.random() < declined_rate
        body = {
            "origin_lat": round(rng.uniform(48.80, 48.90), 5),
            "origin_lon": round(rng.uniform(2.25, 2.42), 5),
            "target_lat": round(rng.uniform(48.70, 49.00), 5),
            "target_lon": round(rng.uniform(2.20, 2.60), 5),
        }
        planned.append(
            Ride(
                key=f"demo-{run}-{n:05d}",  # see Workload.key_prefix
                api_key=f"user-{rider}-declined" if declined else f"user-{rider}",
                scope=f"usr_{rider}_declined" if declined else f"usr_{rider}",
                body=body,
                form=rng.random() < 0.2,
            )
        )
    return Workload(run, tuple(planned), clients, crash_rate, seed, abandon_rate)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The final answer a client got for a ride."""

    status: int
    body: bytes


@dataclass(slots=True)
class ClientStats:
    """What the clients saw."""

    requests: int = 0
    #: Requests sent with an order to crash the worker.
    crash_orders: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    dropped: int = 0
    timeouts: int = 0
    twins: int = 0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    gave_up: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    #: Answers that mean a bug: (key, status, body excerpt).
    unexpected: list[tuple[str, int, str]] = field(default_factory=list)
    replays_checked: int = 0
    replay_mismatches: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int | None
    body: bytes = b""
    replayed: bool = False
    retry_after: float = 0.0


class _Client:
    def __init__(
        self,
        http: httpx.AsyncClient,
        urls: Sequence[str],
        workload: Workload,
        index: int,
        stats: ClientStats,
    ) -> None:
        self.http = http
        self.urls = urls
        self.crash_rate = workload.crash_rate
        self.abandon_rate = workload.abandon_rate
        self.rng = random.Random(workload.seed * 7919 + index)
        self.stats = stats

    async def send(self, ride: Ride, *, crash: bool = True) -> _Answer:
        headers = {"Authorization": f"Bearer {ride.api_key}", "Idempotency-Key": ride.key}
        if crash and self.rng.random() < self.crash_rate:
            headers[CRASH_HEADER] = self.rng.choice(POINTS)
            self.stats.crash_orders += 1
        if ride.form:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            content = urllib.parse.urlencode(ride.body).encode()
        else:
            headers["Content-Type"] = "application/json"
            content = _json(ride.body)
        url = self.rng.choice(self.urls) + "/v1/rides"
        self.stats.requests += 1
        try:
            response = await self.http.post(url, content=content, headers=headers)
        except httpx.TimeoutException:
            self.stats.timeouts += 1
            return _Answer(None)
        except httpx.TransportError:
            # Refused (the worker is restarting) or dropped mid-request (it was killed).
            self.stats.dropped += 1
            return _Answer(None)
        self.stats.statuses[response.status_code] += 1
        try:
            retry_after = float(response.headers.get("retry-after", "0"))
        except ValueError:
            retry_after = 0.0
        return _Answer(
            response.status_code,
            response.content,
            response.headers.get("idempotent-replayed") == "true",
            retry_after,
        )

    async def book(self, ride: Ride) -> None:
        started = time.monotonic()
        for attempt in range(MAX_ATTEMPTS):
            if attempt == 0 and self.rng.random() < TWIN_RATE:
                self.stats.twins += 1
                answers = list(await asyncio.gather(self.send(ride), self.send(ride)))
            else:
                answers = [await self.send(ride)]
            final = next((a for a in answers if a.status in _FINAL), None)
            if final is not None:
                self.stats.outcomes[ride.key] = Outcome(final.status or 0, final.body)
                if self.rng.random() < REPLAY_CHECK_RATE:
                    await self.check_replay(ride, final)
                return
            wrong = [a for a in answers if a.status is not None and _is_bug(a.status)]
            if wrong:
                excerpt = wrong[0].body[:200].decode("utf-8", "replace")
                self.stats.unexpected.append((ride.key, wrong[0].status or 0, excerpt))
                return
            if self.rng.random() < self.abandon_rate:
                # The client itself goes away (it crashed, its user closed the app):
                # the key is left unfinished, for the completer (B2).
                self.stats.abandoned.append(ride.key)
                return
            if time.monotonic() - started > RIDE_PATIENCE:
                break
            await asyncio.sleep(self.pause(attempt, max(a.retry_after for a in answers)))
        self.stats.gave_up.append(ride.key)

    async def check_replay(self, ride: Ride, first: _Answer) -> None:
        for attempt in range(10):
            again = await self.send(ride, crash=False)
            if again.status is None:
                await asyncio.sleep(self.pause(attempt, 0.0))
                continue
            self.stats.replays_checked += 1
            if (again.status, again.body, again.replayed) != (first.status, first.body, True):
                self.stats.replay_mismatches.append(ride.key)
            return

    def pause(self, attempt: int, retry_after: float) -> float:
        if retry_after:
            # The server said when; a little jitter keeps racing clients apart.
            return retry_after * self.rng.uniform(1.0, 1.2)
        backoff: float = min(0.05 * 2**attempt, 1.0)
        return backoff * self.rng.uniform(0.5, 1.0)


def _is_bug(status: int) -> bool:
    return status < 500 and status != 409


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


async def run_clients(
    workload: Workload,
    urls: Sequence[str],
    done: Callable[[], None] | None = None,
    *,
    event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
) -> ClientStats:
    """Book every ride of ``workload`` through the API workers at ``urls``; call
    ``done()`` as each ride ends. ``event_hooks`` go to the HTTP client (the soak run
    times every request with them)."""
    stats = ClientStats()
    limits = httpx.Limits(max_connections=workload.clients * 4)
    async with httpx.AsyncClient(
        timeout=REQUEST_TIMEOUT, limits=limits, event_hooks=event_hooks
    ) as http:
        clients = [_Client(http, urls, workload, i, stats) for i in range(workload.clients)]

        async def drive(client: _Client, rides: Sequence[Ride]) -> None:
            for ride in rides:
                await client.book(ride)
                if done is not None:
                    done()

        shares = [workload.rides[i :: workload.clients] for i in range(workload.clients)]
        await asyncio.gather(*(drive(c, s) for c, s in zip(clients, shares, strict=True)))
    return stats
