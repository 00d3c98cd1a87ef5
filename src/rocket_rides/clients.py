"""Simulated Rocket Rides clients: book rides, retry through everything, keep count.

Each client books its share of the rides one after another. A ride is one operation
of the library's retrying client ([`idempotence.client`][idempotence.client]): one Idempotency-Key,
retried with the same body until a final answer (201 or 402) or the end of its patience:

* a dropped connection (the worker was killed, or is restarting), a timeout, a 5xx:
  back off exponentially, with full jitter, and try again, on any worker;
* 409 (the key is in progress, perhaps held by a worker that just died): wait for
  ``Retry-After`` and try again;
* any other answer (400, 401, 422...) is a bug in the demo or the library: counted,
  not retried.

Some rides are submitted twice at once (two copies racing, P4), some requests carry
a crash order (`chaos`), and after a final answer a client sometimes asks again
to check that the replay is the same response, marked ``Idempotent-Replayed``. After a
failed attempt a client may also walk away for good, as real clients do: the key is
then the completer's to finish (B2).
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from idempotence.client import (
    KEY_HEADER,
    AsyncIdempotentClient,
    Attempt,
    IdempotentResponse,
    KeyReused,
    Observe,
    Prepare,
    RetriesExhausted,
    Retry,
    Verdict,
)

from .chaos import CRASH_HEADER, POINTS

__all__ = ["ClientStats", "Outcome", "Ride", "Workload", "make_workload", "run_clients"]

TWIN_RATE = 0.1
"""The share of rides whose first attempt is sent twice at once."""
REPLAY_CHECK_RATE = 0.25
"""The share of rides asked again after their final answer, to check the replay."""
RETRY = Retry(
    max_attempts=60,
    deadline=timedelta(seconds=40),
    base_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(seconds=1),
)
"""A client gives up on a ride after 60 attempts or 40 seconds; the completer then
finishes it (B2)."""
REQUEST_TIMEOUT = 10.0
PATH = "/v1/rides"
_FINAL = (201, 402)


@dataclass(frozen=True, slots=True)
class Ride:
    """One ride to book: its key, rider and body."""

    key: str
    api_key: str
    scope: str
    body: dict[str, float]
    form: bool
    """Send the body form-encoded, like Stripe's clients, instead of as JSON."""


@dataclass(frozen=True, slots=True)
class Workload:
    """The rides of one run, and how the clients send them."""

    run: str
    rides: tuple[Ride, ...]
    clients: int
    crash_rate: float
    seed: int
    abandon_rate: float = 0.0
    """The probability that a client walks away from a ride after a failed attempt."""

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
    crash_orders: int = 0
    """Requests sent with an order to crash the worker."""
    statuses: Counter[int] = field(default_factory=Counter)
    dropped: int = 0
    timeouts: int = 0
    twins: int = 0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    gave_up: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    unexpected: list[tuple[str, int, str]] = field(default_factory=list)
    """Answers that mean a bug: (key, status, body excerpt)."""
    replays_checked: int = 0
    replay_mismatches: list[str] = field(default_factory=list)


class _Client:
    """One simulated client: each ride is one operation of the library's retrying client
    ([`AsyncIdempotentClient`][idempotence.client.AsyncIdempotentClient]: one key,
    backoff with full jitter, Retry-After, a deadline); the demo adds its chaos around
    it through the client's hooks: each attempt goes to a random worker and may carry a
    crash order (``prepare``), and is counted, or abandoned, after it (``observe``)."""

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
        self.client = AsyncIdempotentClient(http, retry=RETRY, rng=self.rng)

    def request(self, ride: Ride) -> httpx.Request:
        headers = {"Authorization": f"Bearer {ride.api_key}", KEY_HEADER: ride.key}
        if ride.form:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            content = urllib.parse.urlencode(ride.body).encode()
        else:
            headers["Content-Type"] = "application/json"
            content = _json(ride.body)
        return self.http.build_request(
            "POST", self.urls[0] + PATH, headers=headers, content=content
        )

    def prepare(self, *, crash: bool) -> Prepare:
        def prepare(request: httpx.Request, number: int) -> httpx.Request:
            headers = dict(request.headers)
            if crash and self.rng.random() < self.crash_rate:
                headers[CRASH_HEADER] = self.rng.choice(POINTS)
                self.stats.crash_orders += 1
            url = self.rng.choice(self.urls) + PATH
            return self.http.build_request("POST", url, headers=headers, content=request.content)

        return prepare

    def observe(self, walked_away: list[bool]) -> Observe:
        def observe(attempt: Attempt) -> bool:
            self.stats.requests += 1
            if isinstance(attempt.error, httpx.TimeoutException):
                self.stats.timeouts += 1
            elif attempt.error is not None:
                # Refused (the worker is restarting) or dropped mid-request (it was killed).
                self.stats.dropped += 1
            if attempt.response is not None:
                self.stats.statuses[attempt.response.status_code] += 1
            if attempt.verdict is Verdict.RETRY and self.rng.random() < self.abandon_rate:
                # The client itself goes away (it crashed, its user closed the app):
                # the key is left unfinished, for the completer (B2).
                walked_away.append(True)
                return False
            return True

        return observe

    async def attempt_ride(self, ride: Ride) -> _Result:
        walked_away: list[bool] = []
        try:
            answer = await self.client.send(
                self.request(ride),
                prepare=self.prepare(crash=True),
                observe=self.observe(walked_away),
            )
        except KeyReused as exc:
            return _Result(None, bug=(422, str(exc)[:200]))
        except RetriesExhausted:
            return _Result(None, abandoned=bool(walked_away))
        if answer.status_code not in _FINAL:
            excerpt = answer.response.content[:200].decode("utf-8", "replace")
            return _Result(None, bug=(answer.status_code, excerpt))
        return _Result(answer)

    async def book(self, ride: Ride) -> None:
        runs = [self.attempt_ride(ride)]
        if self.rng.random() < TWIN_RATE:
            # A double submit: the same operation sent twice at once (P4).
            self.stats.twins += 1
            runs.append(self.attempt_ride(ride))
        results = await asyncio.gather(*runs)
        final = next((r.answer for r in results if r.answer is not None), None)
        bug = next((r.bug for r in results if r.bug is not None), None)
        if final is not None:
            self.stats.outcomes[ride.key] = Outcome(final.status_code, final.response.content)
            if self.rng.random() < REPLAY_CHECK_RATE:
                await self.check_replay(ride, final)
        elif bug is not None:
            self.stats.unexpected.append((ride.key, *bug))
        elif any(r.abandoned for r in results):
            self.stats.abandoned.append(ride.key)
        else:
            self.stats.gave_up.append(ride.key)

    async def check_replay(self, ride: Ride, first: IdempotentResponse) -> None:
        try:
            again = await self.client.send(
                self.request(ride),
                prepare=self.prepare(crash=False),
                observe=self.observe([]),
            )
        except (RetriesExhausted, KeyReused):
            return
        self.stats.replays_checked += 1
        seen = (again.status_code, again.response.content, again.replayed)
        if seen != (first.status_code, first.response.content, True):
            self.stats.replay_mismatches.append(ride.key)


@dataclass(frozen=True, slots=True)
class _Result:
    """How one run of a ride's operation ended."""

    answer: IdempotentResponse | None
    bug: tuple[int, str] | None = None
    abandoned: bool = False


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
