"""The key store on Django's own database connection (F3 with the Django ORM).

`DjangoStore` runs the store's statements on ``django.db.connections[alias]``,
the very connection the ORM uses in the running thread, and opens its transactions
with ``django.db.transaction.atomic(using=alias)``. So a request-as-transaction
endpoint (``Policy(transaction=True)``) or a flow phase claims the key, runs the
view's ORM writes and stores the response in ONE Django transaction: they commit
together or not at all. Inside an ``atomic()`` block of the application's (a view
under ``ATOMIC_REQUESTS``, a phase run from the application's own ``atomic()``) the
store's transaction is a savepoint of it, as any nested ``atomic()`` is.

PostgreSQL (Django's psycopg 3 backend) and SQLite. The statements go to the
driver's connection under Django's (``connection.connection``), so they are the
store's own SQL, unchanged; Django's debug query log does not list them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar, cast

from ...errors import ConfigurationError, StoreError, StoreUnavailable
from ...observability import Instrumentation
from ...stores.capabilities import Capability
from ...stores.sql import Blocks, Dialect, Fetcher, Op, Query, Row, Store, run

__all__ = ["DjangoStore"]

T = TypeVar("T")


_IMMEDIATE = (
    "DjangoStore on SQLite needs write transactions that take the write lock at BEGIN "
    "(a claim reads, then writes: after a deferred BEGIN a concurrent claim fails with "
    "'database is locked' instead of waiting): add "
    '"OPTIONS": {{"transaction_mode": '
    '"IMMEDIATE"}} to DATABASES[{alias!r}] (Django 5.1+)'
)


_MARKED = (
    "the application marked the transaction for rollback (transaction.set_rollback(True), "
    "or a database error caught inside atomic() without a savepoint of its own): the "
    "claim and every write in it were rolled back, and nothing is stored"
)


class _Vendor:
    """What differs between Django's backends: the store's dialect, the connection
    that runs one statement on the driver's connection, the claim's own runner (on
    PostgreSQL its lock wait is bounded, F8) and the translation of driver errors."""

    def __init__(self, vendor: str, alias: str) -> None:
        if vendor == "postgresql":
            from ...stores import postgres

            self.dialect: Dialect = postgres.PostgresDialect()
            self.statement: Callable[[Any], Any] = postgres.PostgresConnection
            self.claimer: Callable[[Any], Fetcher] = postgres.BoundedClaim
            self.translate: Callable[[BaseException], StoreError] = postgres.translate
        elif vendor == "sqlite":
            from ...stores import sqlite

            self.dialect = sqlite.SqliteDialect()
            self.statement = sqlite.SqliteConnection
            self.claimer = lambda conn: conn
            self.translate = _sqlite_translate
        else:
            raise ConfigurationError(
                f"DjangoStore supports Django's postgresql and sqlite backends, and "
                f"DATABASES[{alias!r}] is {vendor!r}"
            )


def _sqlite_translate(exc: BaseException) -> StoreError:
    import sqlite3

    from ...stores.sqlite import translate

    if isinstance(exc, sqlite3.Error):
        return translate(exc)
    return StoreError(f"SQLite error: {exc}")


class _DjangoConnection:
    """The store's connection: Django's connection in this thread, its transactions
    Django's ``atomic()`` blocks."""

    def __init__(self, alias: str, vendor: _Vendor, wrapper: Any) -> None:
        self._alias = alias
        self._vendor = vendor
        self._wrapper = wrapper
        self.raw = wrapper.connection
        self._statement = vendor.statement(self.raw)
        self._blocks = Blocks()

    def fetch(self, query: Query) -> list[Row]:
        rows: list[Row] = self._statement.fetch(query)
        return rows

    @contextmanager
    def atomic(self, first: Op[T] | None = None) -> Iterator[T | None]:
        from django.db import transaction  # type: ignore[import-untyped]

        # Only the block's own begin and end are translated: an error from the
        # application's statements in between (an IntegrityError of the ORM's) stays
        # the application's error.
        block = transaction.atomic(using=self._alias)
        with _translated(self._vendor):
            block.__enter__()
        try:
            with self._blocks.block() as deferred:
                yield None if first is None else run(first, self._vendor.claimer(self._statement))
                if self._wrapper.needs_rollback:
                    raise StoreError(_MARKED)
                self._blocks.seal(deferred)
                while deferred:
                    run(deferred.pop(0), self)
        except BaseException as exc:
            with _translated(self._vendor):
                block.__exit__(type(exc), exc, exc.__traceback__)
            raise
        with _translated(self._vendor):
            block.__exit__(None, None, None)

    def defer(self, op: Op[Any]) -> None:
        self._blocks.defer(op)

    def perform(self, op: Op[T], *, atomic: bool, write: bool) -> T:
        # Outside an atomic() block Django's connection autocommits: a statement
        # commits itself. Inside one (the application's), it joins that transaction.
        with self.atomic() if atomic else nullcontext():
            return run(op, self)

    def run_in_transaction(self, op: Op[T]) -> T:
        return run(op, self)


@contextmanager
def _translated(vendor: _Vendor) -> Iterator[None]:
    """Django's database errors as the store's (Django keeps the driver's as the cause)."""
    from django.db import Error as DjangoError

    try:
        yield
    except DjangoError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise vendor.translate(cause) from exc


class _DjangoSource:
    """Django's connection ``alias`` in the calling thread (Django keeps one a thread)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._vendor: _Vendor | None = None

    def vendor(self) -> _Vendor:
        if self._vendor is None:
            from django.db import connections

            wrapper = connections[self.alias]
            mode = wrapper.settings_dict.get("OPTIONS", {}).get("transaction_mode")
            if wrapper.vendor == "sqlite" and str(mode).upper() != "IMMEDIATE":
                raise ConfigurationError(_IMMEDIATE.format(alias=self.alias))
            self._vendor = _Vendor(wrapper.vendor, self.alias)
        return self._vendor

    @contextmanager
    def connection(self) -> Iterator[_DjangoConnection]:
        from django.db import connections

        vendor = self.vendor()
        wrapper = connections[self.alias]
        with _translated(vendor):
            wrapper.ensure_connection()
        try:
            yield _DjangoConnection(self.alias, vendor, wrapper)
        except StoreUnavailable:
            # Django replaces a broken connection only between requests, and knows
            # nothing of errors on the driver's connection: a thread that is not
            # serving requests (the heartbeats') would keep a dead one for good.
            if not wrapper.in_atomic_block:
                wrapper.close()
            raise

    def close(self) -> None:
        pass  # Django owns its connections


class DjangoStore(Store):
    """The key store on Django's database connection ``alias`` (PostgreSQL or SQLite).

    Built in ``settings.py`` (it touches the database only when first used); the key
    tables come from ``manage.py migrate`` with ``"idempotence.contrib.django_app"``
    in ``INSTALLED_APPS``.

    ```python
    IDEMPOTENCE = Idempotency(
        store=DjangoStore(),
        scope=single_tenant("shop"),
        default=Policy(transaction=True),
    )
    ```
    """

    capabilities = frozenset({Capability.TRANSACTIONS, Capability.WAITING})
    """A SQL store whose waiting twins poll (P10): Django's connections are the
    application's, none of them free to LISTEN."""

    def __init__(
        self, alias: str = "default", *, instrumentation: Instrumentation | None = None
    ) -> None:
        self._django = _DjangoSource(alias)
        # The dialect is the connection's: see _dialect below.
        super().__init__(self._django, cast(Dialect, None), instrumentation=instrumentation)

    # The dialect is the connection's, known once Django's settings are: read at the
    # store's first statement, not when settings.py builds the store.
    @property
    def _dialect(self) -> Dialect:
        return self._django.vendor().dialect

    @_dialect.setter
    def _dialect(self, value: Dialect) -> None:
        pass

    @property
    def alias(self) -> str:
        """The name of the connection in ``settings.DATABASES``."""
        return self._django.alias

    def check(self) -> None:
        """Raise
        [`ConfigurationError`][idempotence.maintenance.completer_async.ConfigurationError]
        unless the connection is one the store runs on (the middleware calls it when
        Django loads it)."""
        self._django.vendor()
