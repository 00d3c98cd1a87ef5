"""Framework glue for [`idempotence.http`][idempotence.http]: one small module per framework.

* `django`: a Django middleware configured by ``settings.IDEMPOTENCE``;
* `flask`: `install` wraps ``app.wsgi_app``;
* `litestar`: `idempotency_middleware` for ``Litestar(middleware=...)``;
* [`sqlalchemy`][idempotence.contrib.sqlalchemy]: the key store on the application's
  SQLAlchemy engine, so that ORM writes commit with the key (the ``sqlalchemy`` extra);
* [`alembic`][idempotence.contrib.alembic]: the key tables from ``alembic upgrade``.

Starlette and FastAPI need no glue: ``app.add_middleware(IdempotencyMiddleware, config=...)``.
"""
