"""The app's configuration for ``INSTALLED_APPS``."""

from django.apps import AppConfig  # type: ignore[import-untyped]


class IdempotenceConfig(AppConfig):  # type: ignore[misc]
    name = "idempotence.contrib.django_app"
    label = "idempotence"
    verbose_name = "Idempotency keys"
