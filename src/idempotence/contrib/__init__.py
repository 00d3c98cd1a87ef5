"""Framework glue for :mod:`idempotence.http`: one small module per framework.

* :mod:`.django`: a Django middleware configured by ``settings.IDEMPOTENCE``;
* :mod:`.flask`: :func:`~.flask.install` wraps ``app.wsgi_app``;
* :mod:`.litestar`: :func:`~.litestar.idempotency_middleware` for ``Litestar(middleware=...)``;
* :mod:`.sqlalchemy`: the key store on the application's SQLAlchemy engine, so that
  ORM writes commit with the key (the ``sqlalchemy`` extra);
* :mod:`.alembic`: the key tables from ``alembic upgrade``.

Starlette and FastAPI need no glue: ``app.add_middleware(IdempotencyMiddleware, config=...)``.
"""
