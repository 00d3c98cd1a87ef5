"""Settings of the example shop: a Django app whose order view is exactly-once per
``Idempotency-Key`` (see the README, "Django")."""

import os
from pathlib import Path

from idempotence.contrib.django_app import DjangoStore
from idempotence.http import Idempotency, Policy, header_scope

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
USE_TZ = True

INSTALLED_APPS = [
    "idempotence.contrib.django_app",  # the key tables, through `manage.py migrate`
    "orders",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "idempotence.contrib.django.IdempotencyMiddleware",
]

# PostgreSQL when SHOP_DB_HOST is set, else a SQLite file.
if os.environ.get("SHOP_DB_HOST"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ["SHOP_DB_HOST"],
            "PORT": os.environ.get("SHOP_DB_PORT", "5432"),
            "NAME": os.environ.get("SHOP_DB_NAME", "shop"),
            "USER": os.environ.get("SHOP_DB_USER", "postgres"),
            "PASSWORD": os.environ.get("SHOP_DB_PASSWORD", ""),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SHOP_DB_NAME", str(BASE_DIR / "db.sqlite3")),
            # The key's claim reads then writes: take SQLite's write lock at BEGIN.
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }

# Every POST and PATCH with an Idempotency-Key runs once: the claim, the view's ORM
# writes and the stored response commit in one transaction on Django's connection.
# The tenant comes from a header set by the gateway that authenticates the caller
# (with django.contrib.auth: scope=lambda request: str(request.raw.user.pk)).
IDEMPOTENCE = Idempotency(
    store=DjangoStore(),
    scope=header_scope("x-account-id"),
    default=Policy(transaction=True),
)
