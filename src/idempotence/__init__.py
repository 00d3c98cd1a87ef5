"""idempotence: make retries safe.

Clients send an ``Idempotency-Key``; the key store claims it atomically, replays the
stored response to retries, and refuses racing or mismatched duplicates. See the
documentation's getting-started tutorial for a tour and ``docs/design.md`` for the
contract.

```python
from idempotence import SqliteStore, ClaimRequest, Outcome
store = SqliteStore(":memory:"); _ = store.migrate()
store.claim(ClaimRequest(scope="acct_1", key="k1", fingerprint="f")).outcome
# <Outcome.EXECUTE: 'execute'>
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .database import DatabaseUrl, open_async_store, open_store
from .errors import (
    AnswerNotStored,
    ArgumentsMismatch,
    BodyTooLarge,
    CallInProgress,
    ConfigurationError,
    IdempotenceError,
    Indeterminate,
    InvalidBody,
    InvalidKey,
    KeyNotFound,
    LockLost,
    MissingKey,
    MixedPlaceholders,
    Reject,
    RequestError,
    ResultNotStorable,
    SchemaMissing,
    StoreError,
    StoreInTransaction,
    StoreMisconfigured,
    StoreUnavailable,
    TransactionEnded,
)
from .flows import Advance, Finish, Flow, FlowRegistry, FlowResult, NoOp, ResultKind
from .functions import current_call, idempotent
from .observability import Instrumentation
from .states import (
    FINISHED,
    STARTED,
    Claim,
    ClaimRequest,
    KeyRecord,
    KeyState,
    KeyStatus,
    Lease,
    Outcome,
    StoredResponse,
    arbitrate,
    key_state,
)
from .stores import (
    AsyncKeyStore,
    AsyncStore,
    AsyncTransaction,
    KeyStore,
    Store,
    Transaction,
    TransientError,
)
from .stores.sqlite import AsyncSqliteStore, SqliteStore

if TYPE_CHECKING:
    from .stores.cached import AsyncCachedStore, CachedStore
    from .stores.postgres import AsyncPostgresStore, PostgresStore
    from .stores.redis import AsyncRedisStore, RedisStore

__version__ = "0.1.0.dev0"

__all__ = [
    "AnswerNotStored",
    "ArgumentsMismatch",
    "CallInProgress",
    "ResultNotStorable",
    "current_call",
    "idempotent",
    "ResultKind",
    "Reject",
    "NoOp",
    "Indeterminate",
    "FlowResult",
    "FlowRegistry",
    "Flow",
    "Finish",
    "Advance",
    "FINISHED",
    "STARTED",
    "AsyncCachedStore",
    "AsyncKeyStore",
    "AsyncPostgresStore",
    "AsyncRedisStore",
    "AsyncSqliteStore",
    "AsyncStore",
    "AsyncTransaction",
    "BodyTooLarge",
    "CachedStore",
    "Claim",
    "ClaimRequest",
    "ConfigurationError",
    "DatabaseUrl",
    "IdempotenceError",
    "InvalidBody",
    "Instrumentation",
    "InvalidKey",
    "KeyNotFound",
    "KeyRecord",
    "KeyState",
    "KeyStatus",
    "KeyStore",
    "Lease",
    "LockLost",
    "MissingKey",
    "MixedPlaceholders",
    "Outcome",
    "PostgresStore",
    "RedisStore",
    "RequestError",
    "SchemaMissing",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreInTransaction",
    "StoreMisconfigured",
    "StoreUnavailable",
    "StoredResponse",
    "Transaction",
    "TransactionEnded",
    "TransientError",
    "arbitrate",
    "key_state",
    "open_async_store",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # The PostgreSQL stores need psycopg (the `postgres` extra): import on first use,
    # so `import idempotence` works without it.
    if name in ("PostgresStore", "AsyncPostgresStore"):
        from .stores import postgres

        return getattr(postgres, name)
    # The cached stores need redis-py (the `redis` extra), likewise.
    if name in ("CachedStore", "AsyncCachedStore"):
        from .stores import cached

        return getattr(cached, name)
    # The Redis stores need redis-py (the `redis` extra), likewise.
    if name in ("RedisStore", "AsyncRedisStore"):
        from .stores import redis

        return getattr(redis, name)
    raise AttributeError(f"module 'idempotence' has no attribute {name!r}")
