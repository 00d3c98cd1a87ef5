"""Run with ``DJANGO_SETTINGS_MODULE=tests.django_orm.settings`` in a process of its
own (Django's settings are process-wide): the shop through Django's test client.
Prints one JSON object: what each request got and what the database held after it."""

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


def main() -> None:
    client = Client(raise_request_exception=False)
    order = {"item": "tea", "quantity": 2}
    steps = {
        "first": post(client, "/orders", "k-order", order),
        "retry": post(client, "/orders", "k-order", order),
        "boom": post(client, "/boom", "k-boom", {}),
        "boom_retry": post(client, "/boom", "k-boom", {}),
    }
    json.dump(steps, sys.stdout)


if __name__ == "__main__":
    main()
