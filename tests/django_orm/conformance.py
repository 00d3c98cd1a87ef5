"""The conformance suite on DjangoStore, run by tests/django_orm/test_conformance.py in
a pytest process of its own: Django's settings are process-wide, and this module sets
them (the database from ``CONFORMANCE_DB_*``, the app that migrates the key tables).
Not collected by the main run: its name does not start with ``test_``."""

from __future__ import annotations

import os

import django
import pytest
from django.conf import settings

from idempotence.contrib.django_app import DjangoStore
from idempotence.testing.conformance import suite
from tests.support.clock import age_key, age_lock

if os.environ["CONFORMANCE_DB_ENGINE"] == "postgresql":
    DATABASE = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ["CONFORMANCE_DB_HOST"],
        "PORT": os.environ["CONFORMANCE_DB_PORT"],
        "NAME": os.environ["CONFORMANCE_DB_NAME"],
        "USER": os.environ["CONFORMANCE_DB_USER"],
        "PASSWORD": os.environ["CONFORMANCE_DB_PASSWORD"],
    }
else:
    DATABASE = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["CONFORMANCE_DB_NAME"],
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }

settings.configure(
    DATABASES={"default": DATABASE},
    INSTALLED_APPS=["idempotence.contrib.django_app"],
    USE_TZ=True,
    LOGGING_CONFIG=None,
)
django.setup()


@pytest.fixture(scope="module")
def migrated() -> None:
    """The key tables, made by ``manage.py migrate`` as a Django project makes them."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def open_store(migrated: None) -> DjangoStore:
    return DjangoStore()


TestDjango = suite(DjangoStore, open_store, age_lock=age_lock, age_key=age_key)
