"""The Django app of the key store: its tables through ``manage.py migrate``, and
`DjangoStore`, the store on Django's own database connection.

```python
# settings.py
INSTALLED_APPS = [..., "idempotence.contrib.django_app"]
MIDDLEWARE = [..., "idempotence.contrib.django.IdempotencyMiddleware"]
IDEMPOTENCE = Idempotency(
    store=DjangoStore(), scope=single_tenant("shop"), default=Policy(transaction=True)
)
```

With ``Policy(transaction=True)`` a view's ORM writes, the key's claim and the stored
response commit in one Django transaction (F3). The migrations run the package's own
SQL (``idempotence/sql/<vendor>/migrations``), so they are the schema that
``idempotence migrate`` makes, recorded the same way: either tool finds nothing left
to do after the other.
"""

from .store import DjangoStore

__all__ = ["DjangoStore"]
