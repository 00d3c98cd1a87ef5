"""Fixtures of the network suites: app hosts (hosts.py), created and deleted per test.

These tests need root (network namespaces): without it they fail and say so. All of
them are the slow tier: each starts servers, relays or replicas and waits out a fault."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .hosts import AppHost, NetworkUnavailable, require_namespaces


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.slow)


def _host(*, cache: bool) -> Iterator[AppHost]:
    try:
        require_namespaces()
        host = AppHost.create(cache=cache)
    except NetworkUnavailable as exc:
        pytest.fail(f"network fault tests cannot run here: {exc}")
    try:
        yield host
    finally:
        host.close()


@pytest.fixture
def app_host() -> Iterator[AppHost]:
    """An app host with a front and a back link."""
    yield from _host(cache=False)


@pytest.fixture
def cache_host() -> Iterator[AppHost]:
    """An app host with a third link, for a cache reached apart from the database."""
    yield from _host(cache=True)
