"""Django, configured in code for the suites: one URLconf, our middleware only.

Django's settings are process-wide and configured once; each harness swaps
``IDEMPOTENCE`` with ``override_settings`` and uses a new test ``Client`` (a client
loads the middleware, and so reads the setting, on its first request).
"""

from __future__ import annotations

import django
from django.conf import settings
from django.urls import re_path

from tests.http.apps import django_view

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="idempotence-tests",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=["idempotence.contrib.django.IdempotencyMiddleware"],
        INSTALLED_APPS=[],
        DATABASES={},
        USE_TZ=True,
        IDEMPOTENCE=None,
        LOGGING_CONFIG=None,
    )
    django.setup()

urlpatterns = [re_path(r"^(?P<path>.*)$", django_view)]
