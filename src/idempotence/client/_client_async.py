"""The retrying client for an ``httpx.AsyncClient`` (DESIGN 10).

This module is the hand-written source of `_client` (F7): edit it here and run
``scripts/unasync.py``. What it decides after each attempt is pure code in
`_retry`; here it only sends and sleeps.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

import httpx

from .._concurrency import sleep_async
from ..keys import validate_key
from ._retry import (
    KEY_HEADER,
    Attempt,
    IdempotentResponse,
    Observe,
    Prepare,
    Retry,
    Verdict,
    clamp_timeout,
    classify,
    exhausted,
    key_reused,
    new_key,
    parse_retry_after,
    why_stop,
)

__all__ = ["AsyncIdempotentClient"]


class AsyncIdempotentClient:
    """Sends unsafe requests so that each logical operation runs at most once, however
    often it must be retried (DESIGN 10).

    Each call of [`request`][idempotence.client.AsyncIdempotentClient.request] is one
    operation: it gets one ``Idempotency-Key`` (``key=``, or a new UUID) and sends it
    with every attempt. A transport error (refused, reset, dropped after sending, timed
    out), a 409 for a key still in progress, a 429 and a fresh 5xx are retried after a
    pause (``Retry-After`` when the server sent one, else exponential backoff with full
    jitter) until an answer is final, ``retry.max_attempts`` attempts were made or
    ``retry.deadline`` would pass. Every other answer is final, and returned: a stored
    4xx is never retried.

    ```python
    async with httpx.AsyncClient(base_url="https://api.example.com") as http:
        client = AsyncIdempotentClient(http, retry=Retry(max_attempts=5))
        answer = await client.post("/v1/charges", json={"amount": 20})
        answer.status_code, answer.replayed, answer.attempts
    # (201, False, 1)
    ```

    Raises [`RetriesExhausted`][idempotence.errors.RetriesExhausted] when it gives up (the key is
    on the exception: retry later with it) and [`KeyReused`][idempotence.errors.KeyReused]
    when the server says the key was used for another request (a bug in the caller).
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        retry: Retry | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.http = http
        self.retry = retry if retry is not None else Retry()
        self.rng = rng if rng is not None else random.Random()

    async def request(
        self,
        method: str,
        url: httpx.URL | str,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | str | None = None,
        data: Mapping[str, Any] | None = None,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        prepare: Prepare | None = None,
        observe: Observe | None = None,
    ) -> IdempotentResponse:
        """Run one operation: send the request with key ``key`` (default: a new one)
        until its answer is final. ``prepare`` and ``observe`` are hooks around each
        attempt (see `Prepare`, `Observe`)."""
        key = new_key() if key is None else validate_key(key)
        request = self.http.build_request(
            method, url, headers=headers, content=content, data=data, json=json, params=params
        )
        request.headers[KEY_HEADER] = key
        return await self.send(request, prepare=prepare, observe=observe)

    async def send(
        self,
        request: httpx.Request,
        *,
        prepare: Prepare | None = None,
        observe: Observe | None = None,
    ) -> IdempotentResponse:
        """Run one operation from a built ``request``, which must carry its key."""
        key = validate_key(request.headers[KEY_HEADER])
        retry = self.retry
        started = time.monotonic()
        deadline = started + retry.deadline.total_seconds()
        number = 0
        while True:
            number += 1
            outgoing = request if prepare is None else prepare(request, number)
            clamp_timeout(outgoing, max(0.001, deadline - time.monotonic()))
            response: httpx.Response | None = None
            error: httpx.TransportError | None = None
            try:
                response = await self.http.send(outgoing)
            except httpx.TransportError as exc:
                error = exc
            verdict = classify(response, error)
            if verdict is Verdict.RETRY:
                header = None if response is None else response.headers.get("retry-after")
                retry_after = parse_retry_after(header)
                pause = retry.pause(number, retry_after, self.rng)
                why = why_stop(retry, number, retry_after, time.monotonic() + pause > deadline)
            else:
                pause, why = None, None
            attempt = Attempt(number, key, response, error, verdict, None if why else pause)
            if observe is not None and observe(attempt) is False and why is None:
                why = "given up by the observer"
            if verdict is Verdict.KEY_REUSED:
                assert response is not None
                raise key_reused(response, key)
            if verdict is Verdict.FINAL:
                if response is None:
                    assert error is not None
                    raise error
                return IdempotentResponse(response, key, number)
            if why is not None:
                raise exhausted(request, attempt, why, time.monotonic() - started) from error
            assert pause is not None
            await sleep_async(pause)

    async def post(self, url: httpx.URL | str, **options: Any) -> IdempotentResponse:
        """[`request`][idempotence.client.AsyncIdempotentClient.request] with POST."""
        return await self.request("POST", url, **options)

    async def put(self, url: httpx.URL | str, **options: Any) -> IdempotentResponse:
        """[`request`][idempotence.client.AsyncIdempotentClient.request] with PUT."""
        return await self.request("PUT", url, **options)

    async def patch(self, url: httpx.URL | str, **options: Any) -> IdempotentResponse:
        """[`request`][idempotence.client.AsyncIdempotentClient.request] with PATCH."""
        return await self.request("PATCH", url, **options)

    async def delete(self, url: httpx.URL | str, **options: Any) -> IdempotentResponse:
        """[`request`][idempotence.client.AsyncIdempotentClient.request] with DELETE."""
        return await self.request("DELETE", url, **options)
