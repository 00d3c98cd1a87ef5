"""The FastAPI + SQLAlchemy example (examples/fastapi_sqlalchemy.py) under a real
uvicorn, on PostgreSQL and SQLite: a crash after the ORM write and before the COMMIT
leaves no row and no key, the retry then runs once, and 32 concurrent duplicates
commit one row (F3, with the application's own ORM session)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.sqla.conftest import EXAMPLES, Database, uvicorn_process

HERE = Path(__file__).resolve().parent


def _post(base: str, key: str, amount: int = 2000) -> httpx.Response:
    return httpx.post(
        f"{base}/transfers",
        json={"amount": amount},
        headers={"idempotency-key": key, "x-account-id": "acct_1"},
        timeout=30,
    )


def _census(database: Database, key: str) -> tuple[int, int]:
    """(transfer rows, key rows for ``key``), read from outside the server."""
    engine = sa.create_engine(database.sync_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT count(*) FROM orm_transfers")).scalar_one()
            keys = conn.execute(
                sa.text("SELECT count(*) FROM idempotency_keys WHERE key = :key"), {"key": key}
            ).scalar_one()
            return rows, keys
    finally:
        engine.dispose()


def _serve(
    database: Database, tmp_path: Path, module: str = "fastapi_sqlalchemy", **env: str
) -> Any:
    return uvicorn_process(
        module,
        {"IDEMPOTENCE_DATABASE_URL": database.async_url, **env},
        tmp_path,
        app_dirs=(EXAMPLES, HERE),
    )


def test_f3_a_crash_before_the_commit_leaves_no_row_and_no_key_and_the_retry_runs_once(
    database: Database, tmp_path: Path
) -> None:
    key = f"crash-{uuid.uuid4()}"
    with _serve(database, tmp_path, "crash_app", CRASH_BEFORE_COMMIT="1") as (base, process):
        with pytest.raises(httpx.TransportError):
            _post(base, key)
        assert process.wait(timeout=30) == -9  # SIGKILLed at the COMMIT, not before
    # The ORM row and the stored response had been sent; nothing was committed.
    assert _census(database, key) == (0, 0)

    with _serve(database, tmp_path) as (base, _):
        first = _post(base, key)
        again = _post(base, key)
        count = httpx.get(f"{base}/transfers/count", timeout=30).json()
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    assert (again.status_code, again.content) == (201, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert count == {"count": 1}
    assert _census(database, key) == (1, 1)


def test_f3_32_concurrent_duplicates_commit_one_row(database: Database, tmp_path: Path) -> None:
    key = f"dup-{uuid.uuid4()}"
    with _serve(database, tmp_path) as (base, _):
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda _: _post(base, key), range(32)))
        retry = _post(base, key)
    statuses = sorted(answer.status_code for answer in answers)
    assert set(statuses) <= {201, 409}, [(a.status_code, a.text) for a in answers]
    fresh = [a for a in answers if a.status_code == 201 and "idempotent-replayed" not in a.headers]
    assert len(fresh) == 1, statuses
    bodies = {a.content for a in answers if a.status_code == 201}
    assert bodies == {fresh[0].content}  # every replay is the one response
    assert (retry.status_code, retry.content) == (201, fresh[0].content)
    assert _census(database, key) == (1, 1)


def test_the_guide_shows_the_example_as_it_runs() -> None:
    """The SQLAlchemy guide's FastAPI block is this example, byte for byte (its
    docstring aside), so what the reader copies is what these tests run."""
    example = (EXAMPLES / "fastapi_sqlalchemy.py").read_text()
    body = example.split('"""', 2)[2].lstrip("\n")
    guide = (EXAMPLES.parent / "docs" / "how-to" / "sqlalchemy.md").read_text()
    assert f"```python\n{body}```" in guide
