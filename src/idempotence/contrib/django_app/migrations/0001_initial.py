"""The key tables as of the package's migration 0005_calling."""

from django.db import migrations  # type: ignore[import-untyped]

from idempotence.contrib.django_app.operations import ApplyKeyTables


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [ApplyKeyTables("0005_calling")]
