"""Handler mode never sends an answer it could not store (DESIGN 13), in process.

The middleware's store reaches its database (PostgreSQL, or Redis) through a TCP relay
on loopback (tests/network/hosts.py), which the app's handler cuts right after its
effect: the claim and the handler went through, and the finish fails. The client is
answered 503 with Retry-After, never the handler's 201, since that answer is not
stored and a retry could get another one. The key stays locked while the finish is
tried again in the background; once the relay heals it lands, and the retry gets the
handler's one answer replayed: one run, one answer (the history checker judges it).
If the store stays out of reach until the lock lapses, the background finish gives
up and the retry runs the request again: its answer is the first one a client sees,
so still no answer is lost or changed.

On every framework (the ASGI ones run the async store and the async driver, Flask and
Django the generated sync ones). Without the engine's rule, the first attempt is
answered 201 while its key stays unfinished: the history checker reports a lost
answer, and the retry after the lock gets a second run's answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from idempotence.stores.postgres import AsyncPostgresStore, PostgresStore
from idempotence.stores.redis import AsyncRedisStore, RedisStore
from idempotence.testing import History, Property
from tests.http import apps
from tests.http.clients import Harness, open_harness
from tests.network.hosts import Relay
from tests.support.polling import eventually

# The slow tier: finishes that fail and are retried, some waiting out a lock.
pytestmark = pytest.mark.slow

#: The relay's store fails within this bound once cut (its statements fail at once).
BOUND = 1.0


def through(relay: Relay, url: str) -> str:
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    host, port = relay.address
    return urlunsplit(parts._replace(netloc=f"{user}{host}:{port}"))


@pytest.fixture(params=["postgres", "redis"])
def backend(request: pytest.FixtureRequest) -> str:
    """The stores a relay can cut (``target`` is their URL: tests/http/conftest.py)."""
    return str(request.param)


@pytest.fixture
def relay(target: str) -> Iterator[Relay]:
    parts = urlsplit(target)
    default = 5432 if parts.scheme.startswith("postgres") else 6379
    relay = Relay("127.0.0.1", (parts.hostname or "127.0.0.1", parts.port or default))
    yield relay
    relay.close()


def relayed_store(framework: str, backend: str, url: str) -> Any:
    asgi = framework in apps.ASGI
    if backend == "redis":
        return (AsyncRedisStore if asgi else RedisStore)(url, timeout=BOUND)
    cls = AsyncPostgresStore if asgi else PostgresStore
    return cls(url, connect_timeout=BOUND, statement_timeout=BOUND)


def relayed_harness(
    framework: str, backend: str, target: str, relay: Relay, scope: str, **overrides: Any
) -> AbstractContextManager[Harness]:
    """The app on a store reached through ``relay``, every path on the default policy
    (handler mode) with ``overrides`` (``default_lock_timeout=...``)."""
    return open_harness(
        framework,
        backend,
        target,
        scope,
        store_factory=lambda: relayed_store(framework, backend, through(relay, target)),
        endpoints=[],
        **overrides,
    )


class CutAfterEffect:
    """Wraps the app's effect counter: records each run as an effect in the history,
    and cuts the relay after the first run of ``path``."""

    def __init__(self, harness: Harness, relay: Relay, history: History, key: str) -> None:
        self.hit, self.relay, self.history, self.key = harness.effects.hit, relay, history, key
        self.armed = True
        harness.effects.hit = self  # type: ignore[method-assign]

    def __call__(self, path: str) -> int:
        n = self.hit(path)
        self.history.effect(self.key, f"run {n}")
        if self.armed:
            self.armed = False
            self.relay.cut()
        return n


def attempt(history: History, harness: Harness, key: str) -> Any:
    with history.operation(key) as op:
        response = harness.post(f"/unstored/{key}", key=key)
        op.answer(response.status, response.body)
    return response


def run_of(response: Any) -> int:
    return int(json.loads(response.body)["n"])


def test_an_answer_whose_finish_fails_is_not_sent_and_is_stored_in_the_background(
    framework: str, backend: str, target: str, relay: Relay, scope: str
) -> None:
    history, key = History(), "unstored-1"
    with relayed_harness(
        framework, backend, target, relay, scope, default_lock_timeout=timedelta(seconds=30)
    ) as harness:
        CutAfterEffect(harness, relay, history, key)
        first = attempt(history, harness, key)
        # The handler ran and answered 201, but its finish failed: not sent.
        assert first.status == 503, first.body
        assert first.header("retry-after")
        assert b"was processed" in first.body and b"not sent" in first.body
        assert harness.effects.total() == 1
        # While the store is out of reach a retry runs nothing.
        assert attempt(history, harness, key).status == 503
        relay.heal()
        eventually(
            lambda: (record := harness.record(key)) is not None and record.finished,
            "the background finish stored the answer",
        )
        record = harness.record(key)
        assert record is not None and record.response is not None
        assert record.response.status == 201
        again = attempt(history, harness, key)
        assert again.status == 201 and again.header("idempotent-replayed") == "true"
        assert run_of(again) == 1  # the first run's answer: the handler ran once
        assert harness.effects.total() == 1
        report = history.check(records={key: harness.record(key)})
    report.assert_ok()
    assert report.acknowledged == 1 and report.effects == 1


@pytest.mark.parametrize("framework", ["starlette", "flask"])
def test_when_the_lock_lapses_first_the_retry_runs_again_and_no_answer_was_lost(
    framework: str, backend: str, target: str, relay: Relay, scope: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    history, key = History(), "unstored-2"
    with (
        caplog.at_level(logging.INFO, "idempotence"),
        relayed_harness(
            framework, backend, target, relay, scope, default_lock_timeout=timedelta(seconds=1)
        ) as harness,
    ):
        CutAfterEffect(harness, relay, history, key)
        assert attempt(history, harness, key).status == 503
        # The store stays out of reach past the lock: the background finish gives up.
        eventually(
            lambda: any("gave up storing the answer" in r.getMessage() for r in caplog.records),
            "the background finish gave up",
        )
        relay.heal()
        answers: list[Any] = []
        # The store notices the heal within a probe interval: 503 until then.
        eventually(
            lambda: answers.append(attempt(history, harness, key)) or answers[-1].status != 503,
            "an answer other than 503",
            interval=0.1,
        )
        again = answers[-1]
        assert again.status == 201 and again.header("idempotent-replayed") is None
        assert run_of(again) == 2  # ran again: the first answer was never sent
        assert attempt(history, harness, key).body == again.body  # replayed from now on
        report = history.check(records={key: harness.record(key)})
    # Two runs of the handler (the effect keyed by a key derived from the request's
    # makes the second harmless: R4), but the one answer any client saw is stored.
    assert [v.property for v in report.violations] == [Property.DUPLICATE_EFFECT]
    assert report.count(Property.LOST_ANSWER) == 0 and report.acknowledged == 1


@pytest.mark.parametrize("path", ["/big/a", "/stream-big"])
def test_a_response_too_large_to_store_is_not_sent_when_its_problem_is_not_stored(
    framework: str, backend: str, target: str, relay: Relay, scope: str, path: str
) -> None:
    """Too large to store, the response is sent once and the key finished with a
    problem a retry is told (RESPONSE_NOT_REPLAYABLE). When that finish fails, the
    response must not go out either (it used to: the failure was only logged, and a
    retry after the lock ran the request again): 503, the problem stored in the
    background, and the retry told that the request ran once."""
    key = "unstored-large"
    with relayed_harness(
        framework,
        backend,
        target,
        relay,
        scope,
        default_lock_timeout=timedelta(seconds=30),
        default_max_response_bytes=apps.SMALL_LIMIT,
    ) as harness:
        CutAfterEffect(harness, relay, History(), key)
        first = harness.post(path, key=key)
        assert first.status == 503, first.body[:200]
        assert first.header("retry-after")
        assert b"not sent" in first.body
        assert b"x" * 100 not in first.body and b"y" * 100 not in first.body  # not a byte
        assert harness.effects.total() == 1
        relay.heal()
        eventually(
            lambda: (record := harness.record(key)) is not None and record.finished,
            "the background finish stored the problem",
        )
        again = harness.post(path, key=key)
        assert again.status == 500, again.body[:200]
        problem = again.json()
        assert problem["code"] == "response_not_replayable"
        assert "will not be processed again" in problem["detail"]
        assert harness.effects.total() == 1
