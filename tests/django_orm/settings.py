"""The example shop's settings (examples/django_shop) with the suite's knobs, read
from the environment of the subprocess that runs them:

* ``DJANGO_ORM_CRASH=1``: the process kills itself (SIGKILL) right after the ORM
  writes an order, before anything commits (see :mod:`.hooks`);
* ``DJANGO_ORM_ATOMIC_REQUESTS=1``: Django's ``ATOMIC_REQUESTS``;
* ``DJANGO_ORM_UNGUARDED=1``: the middleware left out (the tests must then fail);
* ``DJANGO_ORM_DEFERRED=1``: SQLite without ``transaction_mode`` IMMEDIATE;
* ``DJANGO_ORM_OWN_STORE=1``: the guarantee broken on purpose, the store on a
  connection of its own instead of Django's (the tests must then fail).
"""

import os

from shop.settings import *  # noqa: F403
from shop.settings import DATABASES, IDEMPOTENCE, INSTALLED_APPS

from idempotence import SqliteStore
from idempotence.http import Endpoint, Idempotency, Policy
from idempotence.stores.postgres import PostgresStore

ROOT_URLCONF = "tests.django_orm.urls"
# One endpoint in handler mode (claim, view, finish: three commits), the rest F3.
IDEMPOTENCE = Idempotency(
    store=IDEMPOTENCE.store,
    scope=IDEMPOTENCE.scope,
    endpoints=[Endpoint("POST /plain-orders", Policy())],
    default=IDEMPOTENCE.default,
)
INSTALLED_APPS = [*INSTALLED_APPS, "tests.django_orm.hooks.CrashHooks"]
LOGGING_CONFIG = None

if os.environ.get("DJANGO_ORM_ATOMIC_REQUESTS") == "1":
    DATABASES["default"]["ATOMIC_REQUESTS"] = True

if os.environ.get("DJANGO_ORM_OWN_STORE") == "1":
    _db = DATABASES["default"]
    _own = (
        PostgresStore(f"postgresql://{_db['USER']}@{_db['HOST']}:{_db['PORT']}/{_db['NAME']}")
        if "postgresql" in _db["ENGINE"]
        else SqliteStore(_db["NAME"])
    )
    IDEMPOTENCE = Idempotency(
        store=_own,
        scope=IDEMPOTENCE.scope,
        endpoints=IDEMPOTENCE.endpoints,
        default=IDEMPOTENCE.default,
    )

if os.environ.get("DJANGO_ORM_UNGUARDED") == "1":  # the middleware left out: no guarantee
    MIDDLEWARE = [m for m in MIDDLEWARE if "idempotence" not in m]  # noqa: F405

if os.environ.get("DJANGO_ORM_DEFERRED") == "1":  # SQLite's default deferred BEGIN
    DATABASES["default"].pop("OPTIONS", None)
