"""Run with ``DJANGO_SETTINGS_MODULE=tests.django_orm.settings`` in a process of its
own (Django's settings are process-wide): the shop through Django's test client.
Prints one JSON object: what each request got and what the database held after it."""

import contextlib
import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_orm.settings")
django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from orders.models import Order  # noqa: E402


def keys() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM idempotency_keys")
        return int(cur.fetchone()[0])


def post(client: Client, path: str, key: str, body: dict) -> dict:
    response = client.post(
        path,
        data=json.dumps(body),
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
        HTTP_X_ACCOUNT_ID="acct_1",
    )
    return {
        "status": response.status_code,
        "body": response.content.decode(),
        "replayed": response.headers.get("idempotent-replayed"),
        "orders": Order.objects.count(),
        "keys": keys(),
    }


def flow_steps() -> dict:
    """A two-phase flow on DjangoStore: each phase's ORM write commits with its
    checkpoint in Django's atomic(); a phase that raises leaves neither."""
    from idempotence import Advance, Finish, Flow, StoredResponse
    from idempotence.contrib.django_app import DjangoStore

    store = DjangoStore()
    flow = Flow("django-orm-order")
    failing = Flow("django-orm-failing")

    @flow.phase("started")
    def reserve(ctx):
        Order.objects.create(item="reserved", quantity=1)
        return Advance("reserved")

    @flow.phase("reserved")
    def confirm(ctx):
        Order.objects.create(item="confirmed", quantity=1)
        return Finish(StoredResponse.of(201, body=b"done"))

    @failing.phase("started")
    def fail(ctx):
        Order.objects.create(item="failing", quantity=1)
        raise RuntimeError("the phase failed after its ORM write")

    def run(which, key):
        result = which.run(store, which.request(scope="acct_1", key=key, fingerprint="f"))
        items = sorted(
            Order.objects.filter(item__in=["reserved", "confirmed", "failing"]).values_list(
                "item", flat=True
            )
        )
        with connection.cursor() as cur:
            cur.execute("SELECT recovery_point FROM idempotency_keys WHERE key = %s", [key])
            row = cur.fetchone()
        return {"kind": result.kind.name, "items": items, "point": row and row[0]}

    return {
        "flow": run(flow, "k-flow"),
        "flow_retry": run(flow, "k-flow"),
        "failing": run(failing, "k-failing"),
    }


def reconnect_steps() -> dict:
    """Outside a request (a heartbeat's thread), a store operation that finds Django's
    connection dead fails (503), and the next one gets a new connection."""
    from idempotence.contrib.django_app import DjangoStore
    from idempotence.errors import StoreUnavailable
    from idempotence.stores._sql.ops import pending_migrations

    if connection.vendor != "postgresql":
        return {}
    store = DjangoStore()
    store._perform(pending_migrations, write=False)
    # The server ends the connection, as it does on a restart.
    with contextlib.suppress(Exception):
        connection.connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    try:
        store._perform(pending_migrations, write=False)
        first = "worked"
    except StoreUnavailable:
        first = "unavailable"
    return {"reconnect": [first, store._perform(pending_migrations, write=False)]}


def main() -> None:
    client = Client(raise_request_exception=False)
    order = {"item": "tea", "quantity": 2}
    steps = {
        "first": post(client, "/orders", "k-order", order),
        "retry": post(client, "/orders", "k-order", order),
        "boom": post(client, "/boom", "k-boom", {}),
        "boom_retry": post(client, "/boom", "k-boom", {}),
        "marked": post(client, "/marked", "k-marked", {}),
        "plain": post(client, "/plain-orders", "k-plain", order),
        "plain_retry": post(client, "/plain-orders", "k-plain", order),
    }
    steps |= flow_steps()
    steps |= reconnect_steps()
    json.dump(steps, sys.stdout)


if __name__ == "__main__":
    main()
