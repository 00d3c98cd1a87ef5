"""A deterministic crash point for the suite: with ``DJANGO_ORM_CRASH=1`` the process
SIGKILLs itself the moment an order's INSERT has run, inside the request's
transaction and before its commit."""

import os
import signal

from django.apps import AppConfig
from django.db.models.signals import post_save


def _die(sender, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


class CrashHooks(AppConfig):
    name = "tests.django_orm.hooks"
    label = "django_orm_hooks"

    def ready(self):
        if os.environ.get("DJANGO_ORM_CRASH") == "1":
            post_save.connect(_die, sender="orders.Order", weak=False)
