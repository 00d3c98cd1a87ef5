"""A key store whose server refuses its URL, behind the HTTP middleware (P11).

``redis://HOST:PORT/99`` names a database the server does not have: every request
used to answer 500 with the reason only in the log. Now it is a 503 that runs nothing
(as for an unavailable store), fails closed even on a ``fail_open`` endpoint (an
outage passes; a wrong URL would run every request unguarded until someone noticed),
and logs an error that says what to fix.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from idempotence.errors import ConfigurationError, StoreMisconfigured, StoreUnavailable
from idempotence.http import Endpoint, Policy
from idempotence.stores.redis import AsyncRedisStore
from tests.http import apps
from tests.support import redis as support

#: The machine's Redis, with a database number past the 16 a server has by default.
HOST_PORT = support.SHARED_URL.removeprefix("redis://").partition("/")[0]
MISSING_DATABASE = f"redis://{HOST_PORT}/99"


def test_the_error_is_a_configuration_error_and_unavailable() -> None:
    """The CLI exits 2 on a ConfigurationError; the middleware answers 503 (nothing
    ran) on a StoreUnavailable: this error is both."""
    assert issubclass(StoreMisconfigured, ConfigurationError)
    assert issubclass(StoreMisconfigured, StoreUnavailable)


def test_a_missing_redis_database_is_a_503_that_runs_nothing_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    support.require()
    effects = apps.Effects("redis")
    caplog.set_level(logging.WARNING, logger="idempotence")

    async def post_both() -> list[httpx.Response]:
        store = AsyncRedisStore(MISSING_DATABASE)
        endpoints = [Endpoint("POST /open", Policy(fail_open=True))]
        app = apps.starlette_app(effects, apps.make_config(store, endpoints=endpoints))
        transport = httpx.ASGITransport(app=app)
        headers = {apps.TENANT_HEADER: "t1", "content-type": "application/json"}
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                return [
                    await client.post(
                        path, content=b"{}", headers={**headers, "idempotency-key": f"k{path}"}
                    )
                    for path in ("/charges", "/open")
                ]
        finally:
            await store.close()

    for response in asyncio.run(post_both()):
        assert response.status_code == 503, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert int(response.headers["retry-after"]) >= 1
    assert effects.total() == 0  # nothing ran, not even on the fail_open endpoint
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors, caplog.text
    assert all("misconfigured" in r.getMessage() for r in errors), caplog.text
    assert "has no database" in errors[0].getMessage()
