"""The table of backends (idempotence/_backends.py): each row is whole, and it is the
one place that lists them (issue 31: a new store registers with few edits)."""

from __future__ import annotations

import inspect
from importlib import resources

import pytest
from click.testing import CliRunner

from idempotence import ConfigurationError
from idempotence._backends import BACKENDS, by_name, by_scheme
from idempotence._queries import numbering_gaps
from idempotence.cli import main
from idempotence.database import DatabaseUrl
from idempotence.stores import AsyncStore, Store
from idempotence.stores.capabilities import Capability, capabilities_of
from tests.support.sql_dialects import SQL


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_each_row_names_its_stores_and_its_files(backend) -> None:
    sync, async_ = backend.store_classes()
    assert not inspect.iscoroutinefunction(sync.claim)
    assert inspect.iscoroutinefunction(async_.claim)
    # A SQL backend's stores share transactions; its SQL files are in its folder; and
    # the tests' SQL table has its row, so the shared suites run on it.
    for store in (sync, async_):
        assert (Capability.TRANSACTIONS in capabilities_of(store)) is backend.sql
    if backend.sql:
        assert issubclass(sync, Store) and issubclass(async_, AsyncStore)
        folder = resources.files("idempotence").joinpath("sql", backend.name)
        assert folder.joinpath("queries.sql").is_file()
        assert backend.name in SQL, f"add {backend.name!r} to tests/support/sql_dialects.py"
    for scheme in backend.schemes:
        assert by_scheme(scheme) is backend
        assert by_scheme(scheme.upper()) is backend
    assert by_name(backend.name) is backend
    example = backend.example.replace(":PORT", ":6379").replace("/DB", "/0")
    assert DatabaseUrl.parse(example).backend == backend.name


def test_every_sql_folder_is_a_backend() -> None:
    folders = {
        entry.name
        for entry in resources.files("idempotence").joinpath("sql").iterdir()
        if entry.joinpath("queries.sql").is_file()
    }
    assert folders == {b.name for b in BACKENDS if b.sql}


def test_messages_and_help_list_every_backend() -> None:
    with pytest.raises(ConfigurationError) as unsupported:
        DatabaseUrl.parse("oracle://x")
    with pytest.raises(ConfigurationError) as not_a_url:
        DatabaseUrl.parse("keys.db")
    helped = CliRunner().invoke(main, ["migrate", "--help"]).output
    for backend in BACKENDS:
        assert backend.example in str(unsupported.value)
        assert backend.example in str(not_a_url.value)
        assert backend.example in " ".join(helped.split())
        for scheme in backend.schemes[1:]:
            assert f"{scheme}://" in str(unsupported.value)


def test_a_scheme_is_one_backends_or_none() -> None:
    assert by_scheme("postgresql+psycopg").name == "postgres"
    assert by_scheme("mysql").name == "mariadb"
    assert by_scheme("foo+sentinel") is None  # not Redis's for ending like its schemes
    with pytest.raises(ValueError, match="no backend is named 'oracle'"):
        by_name("oracle")


def test_the_migration_notes_name_a_backend_as_people_do() -> None:
    notes = numbering_gaps("mariadb", ["0001_initial", "0005_calling"])
    assert notes and all("MariaDB needs no change" in note for note in notes)
