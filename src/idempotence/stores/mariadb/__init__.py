"""The MariaDB key store, sync and async (``pip install 'idempotence[mariadb]'``).

:class:`AsyncMariaDBStore` runs on aiomysql and is written in :mod:`._store_async`;
:class:`MariaDBStore`, on PyMySQL, is generated from it (``scripts/unasync.py``). The
dialect and the driver calls both share are in :mod:`._store_shared`; how a query of
``sql/mariadb/queries.sql`` becomes statements is :mod:`._steps`. Open one with a
``mariadb://`` (or ``mysql://``) URL, or through :func:`idempotence.open_store`.
"""

from ._store import MariaDBStore
from ._store_async import AsyncMariaDBStore
from ._store_shared import DEFAULT_CONNECT_TIMEOUT, MariaDBDialect, Settings, translate

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "AsyncMariaDBStore",
    "MariaDBDialect",
    "MariaDBStore",
    "Settings",
    "translate",
]
