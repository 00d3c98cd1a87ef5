"""The MariaDB key store, sync and async (``pip install 'idempotence[mariadb]'``).

`AsyncMariaDBStore` runs on aiomysql and is written in `_store_async`; `MariaDBStore`,
on PyMySQL, is generated from it (``scripts/unasync.py``). The dialect and the driver
calls both share are in `_store_shared`; how a query of ``sql/mariadb/queries.sql``
becomes statements is `_steps`. Open one with a ``mariadb://`` (or ``mysql://``) URL, or
through [`idempotence.open_store`][idempotence.database.open_store].
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
